"""kvpool.sched.Scheduler: the KV connector's scheduler (kv_connector.h,
kvp_kv_sched_*, rules K1-K18 of the connectors spec) over vLLM's objects.

Every decision is the C scheduler's; kvpool._kvsched (a small CPython
extension, python/kvpool/_kvsched.c) turns the engine's Request and
SchedulerOutput objects into the C views without building Python
intermediates, which is what keeps a step's overhead below the original
Python scheduler's.  The metadata for the workers comes back as the C msgpack
encoding (bytes), which kvpool.kv.Worker.get_finished() takes as it is.

    lookup = kvpool.kv.LookupClient(endpoint)        # or kvpool.kv.LookupPool
    s = Scheduler(lookup, block_size=32, hash_block_size=32, model_name="m")
    n, async_ = s.get_num_new_matched_tokens(request, num_computed_tokens)
    s.update_state_after_alloc(request, block_ids_tuple, num_external_tokens)
    meta_bytes = s.build_connector_meta(scheduler_output)
    delay = s.request_finished(request_id, num_blocks)

A Scheduler is used by one thread at a time (the engine's scheduler loop).
Where the original raises (an assertion, a KeyError, ...) the same exception
class is raised, with the C scheduler's message; the state is then what the
original leaves.
"""
import ctypes

from . import _lib

__all__ = ["Scheduler", "CONFIG_KEYS"]


_ext = _lib.load_ext("_kvsched")

# kvp_kv_config_t fields the constructor takes (the C defaults apply to the rest).
CONFIG_KEYS = ("kv_role", "load_async", "lookup_async", "enable_lookup", "block_size",
               "hash_block_size", "partial_hits", "model_name", "cache_prefix", "tp_size",
               "pp_size", "pcp_size", "dcp_size", "num_kv_heads", "use_mla",
               "fix_k12_save_without_new_blocks",
               # load or recompute (rule F1): "always" (default) or "faster", and its costs
               "load_policy", "prefill_us_per_token", "load_bytes_per_token", "load_bytes_per_s",
               "lookup_rtt_us")


class Scheduler:
    """The C KV scheduler.  lookup: an object with a `client` attribute, the
    kvp_kv_lookup_client_t ctypes struct (kvpool.kv.LookupClient or
    LookupPool), kept alive as long as this scheduler.  store_groups: the
    KV-cache group ids the pool stores, in store order (None: all).
    token_ids=False sends every ReqMeta without its token ids (None): the
    workers never read them (the original keeps them for KV events), and in
    a prefill step they are most of the metadata's bytes."""

    def __init__(self, lookup, *, store_groups=None, token_ids=True, **config):
        bad = sorted(set(config) - set(CONFIG_KEYS))
        if bad:
            raise TypeError("Scheduler: unknown option(s) %s; known: %s"
                            % (", ".join(bad), ", ".join(CONFIG_KEYS)))
        client = getattr(lookup, "client", None)
        if not isinstance(client, ctypes.Structure):
            raise TypeError("Scheduler: lookup must have a .client kvp_kv_lookup_client_t "
                            "(kvpool.kv.LookupClient or LookupPool), got %r" % (lookup,))
        cfg = {k: v for k, v in config.items() if v is not None}
        self._lookup = None
        self._s = _ext.Scheduler(cfg, ctypes.addressof(client), lookup,
                                 None if store_groups is None else list(store_groups),
                                 bool(token_ids))
        if hasattr(lookup, "retain"):  # its close() is refused while we use it
            lookup.retain()
            self._lookup = lookup
        # The hooks, bound once (they run every step).
        self.get_num_new_matched_tokens = self._s.get_num_new_matched_tokens
        self.update_state_after_alloc = self._s.update_state_after_alloc
        self.build_connector_meta = self._s.build_connector_meta
        self.request_finished = self._s.request_finished
        self.reset_cache = self._s.reset_cache
        self.load_spec = self._s.load_spec
        # load_policy="faster": the load bandwidth measured recently (bytes/s)
        self.set_load_bandwidth = self._s.set_load_bandwidth

    def stats(self):
        """load_specs, trackers, unfinished, unfinished_ids (the C
        scheduler's tables), views (request views held), and
        loads_declined, tokens_declined (load_policy="faster": hits
        recomputed because loading them was predicted no faster)."""
        return self._s.stats()

    def close(self):
        """Destroys the C scheduler, then lets the lookup client go."""
        if self._s is None:
            return
        for name in ("get_num_new_matched_tokens", "update_state_after_alloc",
                     "build_connector_meta", "request_finished", "reset_cache", "load_spec",
                     "set_load_bandwidth"):
            self.__dict__.pop(name, None)
        self._s = None  # the extension object (and the C scheduler) go here
        if self._lookup is not None:
            self._lookup.release()
            self._lookup = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter teardown)
            pass

"""KvpoolConnector: a vLLM KVConnectorBase_V1 over the kvpool C core.

The scheduler role hands every hook to the C scheduler (kvpool.sched, rules
K1-K18 of the connectors spec) and sends its decisions to the workers as the
C msgpack encoding of the step's metadata.  The worker role registers vLLM's
KV tensors with the C worker (kvpool.kv.Worker: W1-W8), which saves and loads
blocks on its own threads; rank 0 also answers the scheduler's lookups
(kvpool.kv.LookupServer over a ZeroMQ ipc socket).  Python only moves
objects across: no block byte and no decision passes through it.

kv_connector_extra_config keys (all optional):
  pool            kvpool URI; default "embedded://" (a pool inside the worker
                  process).  "kvpool://HOST:PORT" shares a `kvpool server`
                  between instances (every instance then needs the same
                  block-hash algorithm and, for sha256/xxhash, the same
                  PYTHONHASHSEED: keys are the engine's block hashes).
  load_async      default true: loads run while the engine schedules others.
                  false: a hit is loaded before the step's forward pass.
  lookup_async    default false: true asks the lookup without waiting (the
                  request is retried on a later step).
  enable_lookup   default true; false never loads (a saving-only instance).
  cache_prefix    a namespace put in front of every key.
  lookup_rpc_port default 0: part of the lookup socket's name.
  load_threads    default 2: threads serving loads.
  lookup_timeout_ms  default 2000: a lookup slower than this is a miss.
  drain_timeout_s    default 30: how long shutdown/exit waits for saves.
  max_save_bytes  default 1 GiB: block bytes queued for saving; beyond,
                  saves are dropped (counted).
  pool_timeout_ms default 0 (the pool's own): per pool call.
  load_policy     "always" (default): every pool hit is loaded, as the seed
                  does.  "faster": a hit is loaded only when its predicted
                  load time (lookup_rtt_us + its bytes at load_bytes_per_s)
                  is below the prefill time it replaces (prefill_us_per_token
                  per token); otherwise it is recomputed (rule F1,
                  kv_sched.c).  The prediction needs load_bytes_per_token
                  and load_bytes_per_s: without either every hit is loaded.
  prefill_us_per_token  default 40.0: modelled prefill cost of one token.
  lookup_rtt_us   default 100.0: modelled fixed cost of a load.
  load_bytes_per_token  default 0 (unknown): KV bytes of one token a load moves.
  load_bytes_per_s      default 0 (unknown): the load bandwidth.

Quirk switches.  The C scheduler decides as the seed scheduler (vLLM 0.27's
MooncakeStoreScheduler) does, except for fix_k12_save_without_new_blocks,
which is always on here: vLLM 0.32 allocates a request's blocks a step ahead,
so a chunked prefill's chunk often brings no new block ids, and the seed
would skip that chunk's save for good.
"""
import atexit
import logging
import os
import threading
import weakref

from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1,
                                                               KVConnectorMetadata,
                                                               KVConnectorRole, SupportsHMA)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (KVConnectorPromMetrics,
                                                                  KVConnectorStats)

import kvpool
from kvpool import kv as _kv
from kvpool.sched import Scheduler

logger = logging.getLogger("kvpool.vllm")

EXTRA_KEYS = {  # key -> (type, default)
    "pool": (str, "embedded://"),
    "load_async": (bool, True),
    "lookup_async": (bool, False),
    "enable_lookup": (bool, True),
    "cache_prefix": (str, None),
    "lookup_rpc_port": (int, 0),
    "load_threads": (int, 2),
    "lookup_timeout_ms": (int, 2000),
    "drain_timeout_s": (float, 30.0),
    "max_save_bytes": (int, None),
    "pool_timeout_ms": (int, 0),
    # load or recompute (rule F1); None: the C scheduler's defaults
    "load_policy": (str, None),
    "prefill_us_per_token": (float, None),
    "lookup_rtt_us": (float, None),
    "load_bytes_per_token": (int, None),
    "load_bytes_per_s": (float, None),
}
LOAD_POLICIES = ("always", "faster")
COST_KEYS = ("prefill_us_per_token", "lookup_rtt_us", "load_bytes_per_s")
# The seed's K12 switch that vLLM 0.32's early block allocation needs.
QUIRK_FIXES = {"fix_k12_save_without_new_blocks": True}
FALLBACK_POOL = "embedded://?capacity=64MiB"

_warned = set()


def _warn_once(key, msg, *args):
    if key not in _warned:
        _warned.add(key)
        logger.warning(msg, *args)


def parse_extra_config(extra):
    """kv_connector_extra_config -> dict of every EXTRA_KEYS key.  None or {}
    is all defaults; a non-dict, or a value of the wrong type, is a ValueError
    naming the key; unknown keys are logged once and ignored."""
    if extra is None:
        extra = {}
    if not isinstance(extra, dict):
        raise ValueError("KvpoolConnector: kv_connector_extra_config must be a dict, got %s"
                         % type(extra).__name__)
    out = {}
    for key, (typ, default) in EXTRA_KEYS.items():
        v = extra.get(key, default)
        if v is not None:
            ok = (isinstance(v, bool) if typ is bool else
                  isinstance(v, (int, float)) and not isinstance(v, bool) if typ is float else
                  isinstance(v, int) and not isinstance(v, bool) if typ is int else
                  isinstance(v, typ))
            if not ok:
                raise ValueError("KvpoolConnector: kv_connector_extra_config[%r] must be %s, got %r"
                                 % (key, typ.__name__, v))
            if typ is int and v < 0:
                raise ValueError("KvpoolConnector: kv_connector_extra_config[%r] must be >= 0, "
                                 "got %r" % (key, v))
        out[key] = v
    if out["load_policy"] is not None and out["load_policy"] not in LOAD_POLICIES:
        raise ValueError("KvpoolConnector: kv_connector_extra_config['load_policy'] must be one "
                         "of %s, got %r" % (", ".join(LOAD_POLICIES), out["load_policy"]))
    for key in COST_KEYS:
        if out[key] is not None and not 0 <= out[key] < float("inf"):
            raise ValueError("KvpoolConnector: kv_connector_extra_config[%r] must be a finite "
                             "number >= 0, got %r" % (key, out[key]))
    unknown = sorted(set(extra) - set(EXTRA_KEYS))
    if unknown:
        _warn_once(("unknown",) + tuple(unknown), "KvpoolConnector: ignoring unknown "
                   "kv_connector_extra_config keys %s (known: %s)", unknown, sorted(EXTRA_KEYS))
    return out


# ----------------------------------------------------------------- the engine's shape

def _groups(kv_cache_config):
    """(CacheGroup list in store order, store group ids) from vLLM's groups."""
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, MambaSpec, MLAAttentionSpec,
                                            SlidingWindowSpec)
    groups = kv_cache_config.kv_cache_groups
    ids = list(getattr(kv_cache_config, "prefix_cacheable_group_ids", None) or range(len(groups)))
    out = []
    for gid in ids:
        spec = groups[gid].kv_cache_spec
        if isinstance(spec, MLAAttentionSpec):
            kind = "mla"
        elif isinstance(spec, SlidingWindowSpec):
            kind = "sliding_window"
        elif isinstance(spec, MambaSpec):
            if getattr(spec, "mamba_cache_mode", "align") != "align":
                raise ValueError("KvpoolConnector: Mamba group %d needs mamba_cache_mode='align', "
                                 "not %r" % (gid, spec.mamba_cache_mode))
            kind = "mamba"
        elif isinstance(spec, FullAttentionSpec):
            kind = "full_attention"
        else:
            raise ValueError("KvpoolConnector: KV cache group %d has a %s, which kvpool does not "
                             "store" % (gid, type(spec).__name__))
        out.append(_kv.CacheGroup(kind, spec.block_size, mamba_align=kind == "mamba",
                                  sliding_window=getattr(spec, "sliding_window", 0) or 0
                                  if kind == "sliding_window" else 0))
    return out, ids


def _shape(vllm_config, kv_cache_config):
    """What the scheduler, the worker and the lookup share."""
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    groups, ids = _groups(kv_cache_config)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv_cache_config, vllm_config)
    pc, mc = vllm_config.parallel_config, vllm_config.model_config
    return {
        "groups": groups, "store_groups": ids,
        "block_size": block_size, "hash_block_size": hash_block_size,
        "partial_hits": any(g.kind == "mamba" and g.block_size > hash_block_size for g in groups),
        "model_name": mc.model,
        "tp_size": pc.tensor_parallel_size, "pp_size": pc.pipeline_parallel_size,
        "pcp_size": getattr(pc, "prefill_context_parallel_size", 1) or 1,
        "dcp_size": getattr(pc, "decode_context_parallel_size", 1) or 1,
        "num_kv_heads": mc.get_total_num_kv_heads(),
        "use_mla": bool(getattr(mc, "use_mla", False)),
        "use_eagle": _uses_eagle(vllm_config),
    }


def _uses_eagle(vllm_config):
    sc = getattr(vllm_config, "speculative_config", None)
    return bool(sc is not None and getattr(sc, "use_eagle", lambda: False)())


def lookup_endpoint(vllm_config, rpc_port):
    """The rank-0 lookup socket: the §2.4 name, inside a directory of this
    engine's own (engine_id), so instances on one host never collide: (endpoint, dir)."""
    import vllm.envs as envs
    kvc = vllm_config.kv_transfer_config
    base = os.path.join(envs.VLLM_RPC_BASE_PATH, "kvpool-%s" % (kvc.engine_id or "0")[:12])
    os.makedirs(base, mode=0o700, exist_ok=True)
    dp = getattr(vllm_config.parallel_config, "data_parallel_index", None)
    if dp is None:
        dp = vllm_config.parallel_config.data_parallel_rank
    return _kv.ipc_endpoint(base, rpc_port, None, dp), base


# ----------------------------------------------------------------- metadata and stats

class KvpoolConnectorMetadata(KVConnectorMetadata):
    """One step's decisions for the workers: the C scheduler's msgpack
    encoding (kv_meta_codec.c), decoded and checked by each worker."""
    __slots__ = ("data",)

    def __init__(self, data: bytes):
        self.data = data

    def __reduce__(self):
        return (KvpoolConnectorMetadata, (self.data,))


STAT_KEYS = ("blocks_saved", "blocks_deduped", "blocks_loaded", "load_errors", "save_errors",
             "saves_dropped", "bytes_saved", "bytes_loaded")


class KvpoolConnectorStats(KVConnectorStats):
    """Counters of the worker since the last report (summed over workers)."""

    def reset(self):
        self.data = {k: 0 for k in STAT_KEYS}

    def aggregate(self, other):
        for k, v in (other.data or {}).items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self):
        return {k: self.data.get(k, 0) for k in STAT_KEYS}

    def is_empty(self):
        return not any(self.data.get(k, 0) for k in STAT_KEYS)


class KvpoolPromMetrics(KVConnectorPromMetrics):
    """vllm:kvpool_<counter>_total per engine, from the stats deltas."""

    def __init__(self, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            k: self._counter_cls(name="vllm:kvpool_%s_total" % k,
                                 documentation="kvpool KV connector: %s" % k.replace("_", " "),
                                 labelnames=labelnames)
            for k in STAT_KEYS}
        self._bound = {}

    def observe(self, transfer_stats_data, engine_idx=0):
        if not transfer_stats_data:
            return
        for k, v in transfer_stats_data.items():
            if k not in self._counters or not v:
                continue
            c = self._bound.get((engine_idx, k))
            if c is None:
                c = self._bound[(engine_idx, k)] = self._counters[k].labels(
                    *self.per_engine_labelvalues[engine_idx])
            c.inc(v)


_WORKERS = weakref.WeakSet()


def worker_stats():
    """The C worker stats of this process's KvpoolConnector workers, summed
    (tests and tools; in multi-process mode, ask the worker process)."""
    total = {}
    for w in list(_WORKERS):
        for k, v in w.stats().items():
            total[k] = total.get(k, 0) + v
    return total


# ----------------------------------------------------------------- the connector

class KvpoolConnector(KVConnectorBase_V1, SupportsHMA):
    """kvpool's KV connector (see the module docstring)."""

    def __init__(self, vllm_config, role, kv_cache_config=None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        if kv_cache_config is None:
            raise ValueError("KvpoolConnector needs kv_cache_config (vLLM >= 0.32)")
        kvc = vllm_config.kv_transfer_config
        self._cfg = parse_extra_config(kvc.kv_connector_extra_config)
        self._kv_role = kvc.kv_role or "kv_both"
        self._shape = _shape(vllm_config, kv_cache_config)
        self._endpoint, self._ipc_dir = lookup_endpoint(vllm_config, self._cfg["lookup_rpc_port"])
        self._sched = self._client = None
        self._pool = self._worker = self._lookup = self._server = None
        self._last = dict.fromkeys(STAT_KEYS, 0)
        self._closed = False
        if role == KVConnectorRole.SCHEDULER:
            self._init_scheduler(kvc)
        else:
            self._init_worker(vllm_config, kv_cache_config)

    # .................................................. scheduler role
    def _init_scheduler(self, kvc):
        if getattr(kvc, "kv_load_failure_policy", "recompute") == "fail":
            _warn_once("fail", "KvpoolConnector: kv_load_failure_policy is 'fail': a block the pool "
                       "lost fails its request; set \"kv_load_failure_policy\": \"recompute\" to "
                       "recompute it instead")
        c, s = self._cfg, self._shape
        self._client = _kv.LookupClient(self._endpoint, timeout_ms=c["lookup_timeout_ms"],
                                        send_eagle=s["use_eagle"], apply_eagle=s["use_eagle"])
        self._sched = Scheduler(
            self._client, store_groups=s["store_groups"], token_ids=False, kv_role=self._kv_role,
            load_async=c["load_async"], lookup_async=c["lookup_async"],
            enable_lookup=c["enable_lookup"], block_size=s["block_size"],
            hash_block_size=s["hash_block_size"], partial_hits=s["partial_hits"],
            model_name=s["model_name"], cache_prefix=c["cache_prefix"], tp_size=s["tp_size"],
            pp_size=s["pp_size"], pcp_size=s["pcp_size"], dcp_size=s["dcp_size"],
            num_kv_heads=s["num_kv_heads"], use_mla=s["use_mla"],
            **{k: c[k] for k in ("load_policy", "load_bytes_per_token") + COST_KEYS},
            **QUIRK_FIXES)
        h = self._sched
        self.get_num_new_matched_tokens = h.get_num_new_matched_tokens
        self._build = h.build_connector_meta

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        ids = blocks.get_block_ids() if num_external_tokens > 0 else ()
        self._sched.update_state_after_alloc(request, ids, num_external_tokens)

    def build_connector_meta(self, scheduler_output):
        return KvpoolConnectorMetadata(self._build(scheduler_output))

    def request_finished(self, request, block_ids):
        return self._sched.request_finished(request.request_id, len(block_ids)), None

    def request_finished_all_groups(self, request, block_ids):
        return self._sched.request_finished(request.request_id, sum(map(len, block_ids))), None

    def reset_cache(self):
        if self._sched is None:
            return None
        return self._sched.reset_cache()

    @property
    def requires_kv_delivery(self):
        return False  # a cache: a dropped save is a later miss, never a wrong answer

    # .................................................. worker role
    def _init_worker(self, vllm_config, kv_cache_config):
        from vllm.distributed import (get_tensor_model_parallel_rank,
                                      get_tensor_model_parallel_world_size)
        c, s = self._cfg, self._shape
        try:
            self._pool = kvpool.Pool(c["pool"])
        except kvpool.Error as e:
            logger.error("KvpoolConnector: pool %s unreachable (%s): this instance uses a private "
                         "%s pool instead (nothing shared; outputs are unaffected)",
                         c["pool"], e, FALLBACK_POOL)
            self._pool = kvpool.Pool(FALLBACK_POOL)
        pc = vllm_config.parallel_config
        tp_rank, tp_size = get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()
        pp_rank = (pc.rank // tp_size) % s["pp_size"]
        self._worker = _kv.Worker(
            self._pool, s["model_name"], role=self._kv_role, cache_prefix=c["cache_prefix"],
            tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=s["pp_size"],
            pcp_size=s["pcp_size"], dcp_size=s["dcp_size"], num_kv_heads=s["num_kv_heads"],
            groups=s["groups"], block_size=s["block_size"], hash_block_size=s["hash_block_size"],
            use_eagle=s["use_eagle"], load_threads=max(1, c["load_threads"]),
            max_save_bytes=c["max_save_bytes"], timeout_ms=c["pool_timeout_ms"])
        self._num_blocks = kv_cache_config.num_blocks
        if pc.rank == 0:
            self._lookup = _kv.LookupPool(
                self._pool, s["model_name"], cache_prefix=c["cache_prefix"], tp_size=s["tp_size"],
                pp_size=s["pp_size"], pcp_size=s["pcp_size"], dcp_size=s["dcp_size"],
                num_kv_heads=s["num_kv_heads"], groups=s["groups"], block_size=s["block_size"],
                hash_block_size=s["hash_block_size"], use_eagle=s["use_eagle"])
            self._server = _kv.LookupServer(self._endpoint, self._lookup, drain=self._worker)
        _WORKERS.add(self)
        atexit.register(_drain_at_exit, weakref.ref(self))

    def register_kv_caches(self, kv_caches):
        tensors = list(kv_caches.values())
        try:
            self._worker.register(tensors, self._num_blocks)
        except kvpool.Error as e:
            layers = ["%s %s stride %s" % (n, tuple(t.shape), tuple(t.stride()))
                      for n, t in list(kv_caches.items())[:4]]
            raise ValueError("KvpoolConnector: KV cache layout not supported: %s (layers: %s%s; "
                             "%d blocks)" % (e, "; ".join(layers),
                                             " ..." if len(kv_caches) > 4 else "",
                                             self._num_blocks)) from e

    def start_load_kv(self, forward_context, **kwargs):
        # W1: asynchronous loads are queued in get_finished, after the forward
        # pass is launched.  load_async=False: vLLM calls this before the
        # forward pass of a step with synchronous hits, which need their KV now.
        if not self._cfg["load_async"] and self.has_connector_metadata():
            meta = self._get_connector_metadata()
            if isinstance(meta, KvpoolConnectorMetadata):
                self._worker.load_now(meta.data)

    def wait_for_layer_load(self, layer_name):
        return

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs):
        return

    def wait_for_save(self):
        return  # saves run on the worker's thread; shutdown drains them

    def get_finished(self, finished_req_ids):
        meta = self._get_connector_metadata() if self.has_connector_metadata() else None
        data = meta.data if isinstance(meta, KvpoolConnectorMetadata) else None
        sending, recving = self._worker.get_finished(data, finished_req_ids)
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self):
        return self._worker.load_errors() if self._worker is not None else set()

    def get_kv_connector_stats(self):
        if self._worker is None:
            return None
        now = self._worker.stats()
        delta = {k: now.get(k, 0) - self._last.get(k, 0) for k in STAT_KEYS}
        self._last = {k: now.get(k, 0) for k in STAT_KEYS}
        if not any(delta.values()):
            return None
        return KvpoolConnectorStats(data=delta)

    @classmethod
    def build_kv_connector_stats(cls, data=None):
        s = KvpoolConnectorStats(data=dict(data) if data else {})
        if data is None:
            s.reset()
        return s

    @classmethod
    def build_prom_metrics(cls, vllm_config, metric_types, labelnames, per_engine_labelvalues):
        return KvpoolPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def stats(self):
        """The C worker's counters (worker role) or the scheduler's tables."""
        if self._worker is not None:
            return self._worker.stats()
        return self._sched.stats() if self._sched is not None else {}

    # .................................................. shutdown
    def drain(self, timeout_s=None):
        """Waits (bounded) for the queued saves; True when they are done."""
        if self._worker is None or self._closed:
            return True
        t = threading.Thread(target=self._worker.drain, name="kvpool-drain", daemon=True)
        t.start()
        t.join(self._cfg["drain_timeout_s"] if timeout_s is None else timeout_s)
        if t.is_alive():
            logger.warning("KvpoolConnector: %d saves still queued after %.0f s; not waiting",
                           self._worker.stats().get("save_queue_depth", 0),
                           self._cfg["drain_timeout_s"])
            return False
        return True

    def shutdown(self):
        if self._closed:
            return
        done = self.drain()
        self._closed = True
        if self._sched is not None:
            self._sched.close()
        for obj in (self._server, self._lookup, self._client):
            if obj is not None:
                obj.close()
        if self._worker is not None and done:  # a worker stuck in a save is left to exit
            self._worker.close()
            self._pool.close()
        if self._server is not None:
            try:  # the socket went with the server; its directory is ours to remove
                os.rmdir(self._ipc_dir)
            except OSError:
                pass
        self._server = self._lookup = self._client = None


def _drain_at_exit(ref):
    conn = ref()
    if conn is not None:
        conn.shutdown()

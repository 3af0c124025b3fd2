"""ctypes binding of libkvpool.so: where the library is found, the C structs
mirrored field for field, and argtypes/restype of every function the package
calls.

Where the library comes from:
  1. $KVPOOL_LIB, a path to libkvpool.so (a build tree's build/libkvpool.so):
     when set, that one or an ImportError, nothing else is tried;
  otherwise, first found wins:
  2. a copy inside this package (libkvpool.so.0 or libkvpool.so next to this
     file: `pip install ./python` copies one in when it finds it, see setup.py);
  3. the system loader's libkvpool.so.0 (what `make install` puts in the
     library path; LD_LIBRARY_PATH counts here).
None found: ImportError naming each place tried and why it failed.

Pointer fields the package only fills with addresses are c_void_p (the same
size and offset as the C pointer types); tests/python/test_pool.py checks
every mirrored struct's sizeof and offsets against the C compiler's.
"""
import ctypes
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def _load():
    env = os.environ.get("KVPOOL_LIB")
    if env:  # named explicitly: that one or nothing
        candidates = [("$KVPOOL_LIB", env)]
    else:
        candidates = [("package copy", os.path.join(_HERE, n))
                      for n in ("libkvpool.so.0", "libkvpool.so")]
        candidates.append(("system loader", "libkvpool.so.0"))
    tried = []
    for where, p in candidates:
        if where == "package copy" and not os.path.exists(p):
            tried.append("%s %s: not installed" % (where, p))
            continue
        try:  # RTLD_GLOBAL: kvpool._kvsched takes its symbols from this library
            return ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL), p
        except OSError as e:
            tried.append("%s %s: %s" % (where, p, e))
    raise ImportError("kvpool: cannot load libkvpool.so; tried:\n  " + "\n  ".join(tried) +
                      "\nSet KVPOOL_LIB=/path/to/build/libkvpool.so, reinstall the package "
                      "with a built library (see python/README.md), or `make install`.")


lib, path = _load()


def load_ext(name):
    """The package's extension kvpool.<name> (_kvsched, _kvio): its own copy
    (pip install), else the one a build tree puts next to the libkvpool.so
    loaded above (CMake target kvpool_pyext), so PYTHONPATH=python with
    KVPOOL_LIB=build/libkvpool.so works too.  ImportError if neither."""
    import glob
    import importlib
    import importlib.util
    import sys
    try:
        return importlib.import_module("kvpool." + name)
    except ImportError as e:
        first = e
    here = os.path.dirname(os.path.realpath(path))
    for p in sorted(glob.glob(os.path.join(here, name + ".*.so"))):
        spec = importlib.util.spec_from_file_location("kvpool." + name, p)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        sys.modules["kvpool." + name] = mod
        return mod
    raise ImportError("kvpool: the extension kvpool.%s is not built (%s; and no %s.*.so next to "
                      "%s). `pip install ./python` builds it (needs a C compiler and "
                      "python3-dev); a CMake build makes build/%s.*.so."
                      % (name, first, name, path, name))

c_status = ctypes.c_int  # kvp_status_t (an int enum)
c_size_p = ctypes.POINTER(ctypes.c_size_t)


# ---------------------------------------------------------------- pool.h
class Key(ctypes.Structure):  # kvp_key_t
    _fields_ = [("data", ctypes.c_char_p), ("len", ctypes.c_uint32)]


class Iov(ctypes.Structure):  # kvp_iov_t
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


class Sgl(ctypes.Structure):  # kvp_sgl_t
    _fields_ = [("iov", ctypes.c_void_p), ("iovcnt", ctypes.c_uint32)]


class KeyResult(ctypes.Structure):  # kvp_key_result_t
    _fields_ = [("status", c_status), ("flags", ctypes.c_uint32), ("size", ctypes.c_uint64)]


STATS_FIELDS = (
    "capacity_bytes", "used_bytes", "live_bytes", "live", "committed", "evicted", "removed",
    "reset", "expired_put", "reserved", "pinned", "leased", "put_existed", "put_no_space",
    "get_hits", "get_misses", "evicted_bytes", "index_bytes", "high_watermark_bytes",
    "low_watermark_bytes",
)


class PoolStats(ctypes.Structure):  # kvp_pool_stats_t
    _fields_ = [(f, ctypes.c_uint64) for f in STATS_FIELDS]


KVP_KEY_MAX = 512
KVP_VALUE_MAX = 256 * 1024 * 1024
KVP_BATCH_MAX = 65536
KVP_RESULT_EXISTED = 0x1

# ---------------------------------------------------------------- hash.h
KVP_HASH_MAX_LEN = 32


class Hash(ctypes.Structure):  # kvp_hash_t
    _fields_ = [("len", ctypes.c_uint8), ("bytes", ctypes.c_uint8 * KVP_HASH_MAX_LEN)]


class HashMmItem(ctypes.Structure):  # kvp_hash_mm_item_t
    _fields_ = [("identifier", ctypes.c_char_p), ("identifier_len", ctypes.c_size_t),
                ("offset", ctypes.c_int64), ("length", ctypes.c_int64)]


class HashRequest(ctypes.Structure):  # kvp_hash_request_t
    _fields_ = [("lora_name", ctypes.c_char_p), ("lora_name_len", ctypes.c_size_t),
                ("mm_items", ctypes.c_void_p), ("num_mm_items", ctypes.c_size_t),
                ("cache_salt", ctypes.c_char_p), ("cache_salt_len", ctypes.c_size_t),
                ("prompt_embeds_sha256", ctypes.c_char_p),
                ("num_prompt_embeds_blocks", ctypes.c_size_t),
                ("keys", ctypes.c_int), ("lora_path", ctypes.c_char_p),
                ("lora_path_len", ctypes.c_size_t)]


KVP_HASH_KEYS = {"untagged": 0, "tagged": 1}  # kvp_hash_keys_t


# ---------------------------------------------------------------- kv_connector.h store keys
KVP_KV_STORE_KEY_MAX = 512


class StoreKey(ctypes.Structure):  # kvp_kv_store_key_t
    _fields_ = [("cache_prefix", ctypes.c_void_p), ("cache_prefix_len", ctypes.c_size_t),
                ("model_name", ctypes.c_void_p), ("model_name_len", ctypes.c_size_t),
                ("tp_rank", ctypes.c_uint32), ("pcp_rank", ctypes.c_uint32),
                ("dcp_rank", ctypes.c_uint32), ("pp_rank", ctypes.c_uint32),
                ("group_id", ctypes.c_uint32), ("hash", Hash)]


# ---------------------------------------------------------------- kv_connector.h (kvpool.kv)
# The lookup pool, the lookup server and ZeroMQ client, the worker and the
# metadata codec (python/kvpool/kv.py).  The scheduler (kvp_kv_sched_*) is
# not bound here.  Enums are C ints; every pointer field is c_void_p.
KVP_KV_GROUP_KINDS = {"full_attention": 0, "sliding_window": 1, "mamba": 2, "mla": 3}
KVP_KV_ROLES = {"kv_producer": 0, "kv_consumer": 1, "kv_both": 2}
KVP_KV_MISS_COUNT = 7  # KVP_KV_MISS__COUNT
KVP_KV_TRI_NONE = -1
KVP_KV_TENSOR_MAX_DIMS = 8
KVP_KV_META_MAX_ID_LEN = 4096


class KvCacheGroup(ctypes.Structure):  # kvp_kv_cache_group_t
    _fields_ = [("kind", ctypes.c_int), ("block_size", ctypes.c_int64),
                ("mamba_align_mode", ctypes.c_bool), ("sliding_window", ctypes.c_int64),
                ("is_eagle_group", ctypes.c_bool)]


class KvIds(ctypes.Structure):  # kvp_kv_ids_t
    _fields_ = [("ids", ctypes.c_void_p), ("n", ctypes.c_size_t)]


class KvBlocks(ctypes.Structure):  # kvp_kv_blocks_t
    _fields_ = [("groups", ctypes.c_void_p), ("num_groups", ctypes.c_uint32)]


class KvTailOffload(ctypes.Structure):  # kvp_kv_tail_offload_t
    _fields_ = [("group_id", ctypes.c_int64), ("cow_block_id", ctypes.c_int64),
                ("boundary_tokens", ctypes.c_int64)]


class KvLoadSpec(ctypes.Structure):  # kvp_kv_load_spec_t
    _fields_ = [("vllm_cached_tokens", ctypes.c_int64), ("kvpool_cached_tokens", ctypes.c_int64),
                ("can_load", ctypes.c_bool)]


class KvReqMeta(ctypes.Structure):  # kvp_kv_req_meta_t
    _fields_ = [("req_id", ctypes.c_void_p), ("token_len_chunk", ctypes.c_int64),
                ("block_ids", KvBlocks), ("block_hashes", ctypes.c_void_p),
                ("num_block_hashes", ctypes.c_size_t), ("hash_len", ctypes.c_uint32),
                ("can_save", ctypes.c_bool), ("is_last_chunk", ctypes.c_int8),
                ("has_load_spec", ctypes.c_bool), ("load_spec", KvLoadSpec),
                ("num_prompt_tokens", ctypes.c_int64), ("token_ids", ctypes.c_void_p),
                ("num_token_ids", ctypes.c_size_t), ("has_token_ids", ctypes.c_bool),
                ("partial_tail_offloads", ctypes.c_void_p),
                ("num_partial_tail_offloads", ctypes.c_size_t)]


class KvMeta(ctypes.Structure):  # kvp_kv_meta_t
    _fields_ = [("unfinished_req_ids", ctypes.c_void_p), ("num_unfinished", ctypes.c_size_t),
                ("preempted_req_ids", ctypes.c_void_p), ("num_preempted", ctypes.c_size_t),
                ("requests", ctypes.c_void_p), ("num_requests", ctypes.c_size_t)]


class KvLookupOps(ctypes.Structure):  # kvp_kv_lookup_ops_t
    _fields_ = [("lookup", ctypes.c_void_p), ("discard", ctypes.c_void_p),
                ("reset", ctypes.c_void_p)]


class KvLookupClient(ctypes.Structure):  # kvp_kv_lookup_client_t
    _fields_ = [("ops", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


# kvp_kv_lookup_ops_t.reset, to call a client's reset op from Python
KvResetFn = ctypes.CFUNCTYPE(c_status, ctypes.c_void_p, ctypes.POINTER(ctypes.c_bool))


class KvRequest(ctypes.Structure):  # kvp_kv_request_t
    _fields_ = [("req_id", ctypes.c_char_p), ("num_tokens", ctypes.c_int64),
                ("num_computed_tokens", ctypes.c_int64), ("all_token_ids", ctypes.c_void_p),
                ("num_all_token_ids", ctypes.c_size_t), ("block_hashes", ctypes.c_void_p),
                ("num_block_hashes", ctypes.c_size_t), ("hash_len", ctypes.c_uint32)]


# The other two ops, for lookup clients written in Python (kvpool.kv.CallbackLookup).
KvLookupFn = ctypes.CFUNCTYPE(c_status, ctypes.c_void_p, ctypes.POINTER(KvRequest), ctypes.c_bool,
                              ctypes.POINTER(ctypes.c_int64))
KvDiscardFn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)


class KvLookupPoolParams(ctypes.Structure):  # kvp_kv_lookup_pool_params_t
    _fields_ = [("size", ctypes.c_uint32), ("model_name", ctypes.c_char_p),
                ("cache_prefix", ctypes.c_char_p), ("tp_size", ctypes.c_uint32),
                ("pp_size", ctypes.c_uint32), ("pcp_size", ctypes.c_uint32),
                ("dcp_size", ctypes.c_uint32), ("num_kv_heads", ctypes.c_uint32),
                ("groups", ctypes.c_void_p), ("num_groups", ctypes.c_uint32),
                ("group_kind", ctypes.c_int), ("block_size", ctypes.c_int64),
                ("hash_block_size", ctypes.c_int64), ("use_eagle", ctypes.c_bool)]


class KvLookupResult(ctypes.Structure):  # kvp_kv_lookup_result_t
    _fields_ = [("hit_tokens", ctypes.c_int64), ("reason", ctypes.c_int),
                ("group_id", ctypes.c_uint32), ("block_index", ctypes.c_int64),
                ("tp_rank", ctypes.c_uint32), ("pcp_rank", ctypes.c_uint32),
                ("dcp_rank", ctypes.c_uint32), ("pp_rank", ctypes.c_uint32),
                ("keys_probed", ctypes.c_uint64)]


KV_LOOKUP_STATS_FIELDS = ("lookups", "hit_tokens", "queried_tokens", "keys_probed", "resets")


class KvLookupStats(ctypes.Structure):  # kvp_kv_lookup_stats_t
    _fields_ = ([(f, ctypes.c_uint64) for f in KV_LOOKUP_STATS_FIELDS] +
                [("reasons", ctypes.c_uint64 * KVP_KV_MISS_COUNT)])


class KvLookupServerParams(ctypes.Structure):  # kvp_kv_lookup_server_params_t
    _fields_ = [("size", ctypes.c_uint32), ("endpoint", ctypes.c_char_p),
                ("lookup", ctypes.c_void_p), ("drain", ctypes.c_void_p),
                ("drain_arg", ctypes.c_void_p), ("max_hashes", ctypes.c_uint32)]


KV_SERVER_STATS_FIELDS = ("requests", "lookups", "resets", "bad_frames", "unknown_tags")


class KvLookupServerStats(ctypes.Structure):  # kvp_kv_lookup_server_stats_t
    _fields_ = [(f, ctypes.c_uint64) for f in KV_SERVER_STATS_FIELDS]


class KvLookupZmqParams(ctypes.Structure):  # kvp_kv_lookup_zmq_params_t
    _fields_ = [("size", ctypes.c_uint32), ("endpoint", ctypes.c_char_p),
                ("timeout_ms", ctypes.c_uint32), ("send_eagle", ctypes.c_bool),
                ("apply_eagle", ctypes.c_bool), ("max_inflight", ctypes.c_uint32)]


KV_ZMQ_STATS_FIELDS = ("lookups", "errors", "timeouts", "reconnects", "inflight")


class KvLookupZmqStats(ctypes.Structure):  # kvp_kv_lookup_zmq_stats_t
    _fields_ = [(f, ctypes.c_uint64) for f in KV_ZMQ_STATS_FIELDS]


class KvCacheTensor(ctypes.Structure):  # kvp_kv_cache_tensor_t
    _fields_ = [("storage", ctypes.c_void_p), ("storage_bytes", ctypes.c_size_t),
                ("elem_size", ctypes.c_uint32), ("ndim", ctypes.c_uint32),
                ("shape", ctypes.c_int64 * KVP_KV_TENSOR_MAX_DIMS),
                ("stride", ctypes.c_int64 * KVP_KV_TENSOR_MAX_DIMS)]


class KvWorkerParams(ctypes.Structure):  # kvp_kv_worker_params_t
    _fields_ = [("size", ctypes.c_uint32), ("pool", ctypes.c_void_p), ("role", ctypes.c_int),
                ("model_name", ctypes.c_char_p), ("cache_prefix", ctypes.c_char_p)] + \
               [(f, ctypes.c_uint32) for f in (
                   "tp_rank", "tp_size", "pp_rank", "pp_size", "pcp_rank", "pcp_size",
                   "dcp_rank", "dcp_size", "num_kv_heads")] + \
               [("groups", ctypes.c_void_p), ("num_groups", ctypes.c_uint32),
                ("group_kind", ctypes.c_int), ("block_size", ctypes.c_int64),
                ("hash_block_size", ctypes.c_int64), ("use_eagle", ctypes.c_bool),
                ("num_load_threads", ctypes.c_uint32), ("max_save_bytes", ctypes.c_uint64),
                ("staging_budget_bytes", ctypes.c_uint64), ("timeout_ms", ctypes.c_uint32),
                ("copy", ctypes.c_void_p)]


class KvFinished(ctypes.Structure):  # kvp_kv_finished_t
    _fields_ = [("sending", ctypes.c_void_p), ("num_sending", ctypes.c_size_t),
                ("recving", ctypes.c_void_p), ("num_recving", ctypes.c_size_t)]


KV_WORKER_STATS_FIELDS = (
    "blocks_saved", "blocks_deduped", "blocks_loaded", "load_errors", "save_errors",
    "saves_dropped", "pressure_skips", "bytes_saved", "bytes_loaded", "save_queue_depth",
    "save_queue_bytes", "load_queue_depth", "save_ns", "load_ns",
)


class KvWorkerStats(ctypes.Structure):  # kvp_kv_worker_stats_t
    _fields_ = [(f, ctypes.c_uint64) for f in KV_WORKER_STATS_FIELDS]


# C name -> ctypes mirror, for the layout test.
STRUCTS = {
    "kvp_key_t": Key, "kvp_iov_t": Iov, "kvp_sgl_t": Sgl, "kvp_key_result_t": KeyResult,
    "kvp_pool_stats_t": PoolStats, "kvp_hash_t": Hash, "kvp_hash_mm_item_t": HashMmItem,
    "kvp_hash_request_t": HashRequest, "kvp_kv_store_key_t": StoreKey,
    # kv_connector.h (kvpool.kv)
    "kvp_kv_cache_group_t": KvCacheGroup, "kvp_kv_ids_t": KvIds, "kvp_kv_blocks_t": KvBlocks,
    "kvp_kv_tail_offload_t": KvTailOffload, "kvp_kv_load_spec_t": KvLoadSpec,
    "kvp_kv_req_meta_t": KvReqMeta, "kvp_kv_meta_t": KvMeta, "kvp_kv_lookup_ops_t": KvLookupOps,
    "kvp_kv_lookup_client_t": KvLookupClient, "kvp_kv_request_t": KvRequest,
    "kvp_kv_lookup_pool_params_t": KvLookupPoolParams,
    "kvp_kv_lookup_result_t": KvLookupResult, "kvp_kv_lookup_stats_t": KvLookupStats,
    "kvp_kv_lookup_server_params_t": KvLookupServerParams,
    "kvp_kv_lookup_server_stats_t": KvLookupServerStats,
    "kvp_kv_lookup_zmq_params_t": KvLookupZmqParams, "kvp_kv_lookup_zmq_stats_t": KvLookupZmqStats,
    "kvp_kv_cache_tensor_t": KvCacheTensor, "kvp_kv_worker_params_t": KvWorkerParams,
    "kvp_kv_finished_t": KvFinished, "kvp_kv_worker_stats_t": KvWorkerStats,
}

# ---------------------------------------------------------------- functions
_P = ctypes.POINTER
_v = ctypes.c_void_p
_SIGS = {
    "kvp_status_str": (ctypes.c_char_p, [c_status]),
    "kvp_status_name": (ctypes.c_char_p, [c_status]),
    "kvp_pool_open": (c_status, [ctypes.c_char_p, _P(_v)]),
    "kvp_pool_close": (None, [_v]),
    "kvp_pool_exists": (c_status, [_v, _v, ctypes.c_size_t, _v]),
    "kvp_pool_prefix": (c_status, [_v, _v, ctypes.c_size_t, c_size_p]),
    "kvp_pool_put": (c_status, [_v, _v, _v, ctypes.c_size_t, _v]),
    "kvp_pool_get": (c_status, [_v, _v, _v, ctypes.c_size_t, _v]),
    "kvp_pool_remove": (c_status, [_v, _v, ctypes.c_size_t, _v]),
    "kvp_pool_remove_all": (c_status, [_v, _P(ctypes.c_uint64)]),
    "kvp_pool_stats": (c_status, [_v, _P(PoolStats)]),
    "kvp_hash_algo_parse": (c_status, [ctypes.c_char_p, _P(ctypes.c_int)]),
    "kvp_hash_none_hash": (c_status, [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, _P(Hash)]),
    "kvp_hash_request_blocks_i64": (c_status, [ctypes.c_int, _P(Hash), _v, ctypes.c_size_t,
                                               ctypes.c_size_t, _P(HashRequest), _v,
                                               ctypes.c_size_t, c_size_p]),
    "kvp_kv_store_key_format": (c_status, [_P(StoreKey), ctypes.c_char_p, ctypes.c_size_t,
                                           c_size_p]),
    "kvp_kv_store_key_parse": (c_status, [ctypes.c_char_p, ctypes.c_size_t, _P(StoreKey)]),
    "kvp_kv_store_key_model_name": (c_status, [ctypes.c_char_p, ctypes.c_size_t, _P(_v),
                                               c_size_p]),
    # kv_connector.h (kvpool.kv); buffers of bytes are passed as addresses (_v)
    "kvp_kv_miss_reason_name": (ctypes.c_char_p, [ctypes.c_int]),
    "kvp_kv_meta_encode": (c_status, [_P(KvMeta), _P(_v), c_size_p]),
    "kvp_kv_meta_buf_free": (None, [_v, ctypes.c_size_t]),
    "kvp_kv_meta_decode": (c_status, [_v, ctypes.c_size_t, _P(_v)]),
    "kvp_kv_meta_free": (None, [_v]),
    "kvp_kv_lookup_pool_params_init": (None, [_P(KvLookupPoolParams)]),
    "kvp_kv_lookup_pool_create": (c_status, [_v, _P(KvLookupPoolParams), _P(_v)]),
    "kvp_kv_lookup_pool_destroy": (None, [_v]),
    "kvp_kv_lookup_pool_client": (KvLookupClient, [_v]),
    "kvp_kv_lookup_pool_query": (c_status, [_v, ctypes.c_int64, _v, ctypes.c_size_t,
                                            ctypes.c_uint32, ctypes.c_bool, _P(KvLookupResult)]),
    "kvp_kv_lookup_pool_stats": (None, [_v, _P(KvLookupStats)]),
    "kvp_kv_lookup_ipc_endpoint": (c_status, [ctypes.c_char_p, ctypes.c_uint32, ctypes.c_char_p,
                                              ctypes.c_uint32, ctypes.c_char_p, ctypes.c_size_t]),
    "kvp_kv_lookup_server_params_init": (None, [_P(KvLookupServerParams)]),
    "kvp_kv_lookup_server_start": (c_status, [_P(KvLookupServerParams), _P(_v)]),
    "kvp_kv_lookup_server_stop": (None, [_v]),
    "kvp_kv_lookup_server_endpoint": (ctypes.c_char_p, [_v]),
    "kvp_kv_lookup_server_stats": (None, [_v, _P(KvLookupServerStats)]),
    "kvp_kv_lookup_server_metrics": (c_status, [_v, _v, ctypes.c_size_t, c_size_p]),
    "kvp_kv_lookup_zmq_params_init": (None, [_P(KvLookupZmqParams)]),
    "kvp_kv_lookup_zmq_create": (c_status, [_P(KvLookupZmqParams), _P(_v)]),
    "kvp_kv_lookup_zmq_destroy": (None, [_v]),
    "kvp_kv_lookup_zmq_client": (KvLookupClient, [_v]),
    "kvp_kv_lookup_zmq_query": (c_status, [_v, ctypes.c_int64, _v, ctypes.c_size_t,
                                           ctypes.c_uint32, _P(ctypes.c_int64)]),
    "kvp_kv_lookup_zmq_stats": (None, [_v, _P(KvLookupZmqStats)]),
    "kvp_kv_worker_params_init": (None, [_P(KvWorkerParams)]),
    "kvp_kv_worker_create": (c_status, [_P(KvWorkerParams), _P(_v)]),
    "kvp_kv_worker_destroy": (None, [_v]),
    "kvp_kv_worker_register": (c_status, [_v, _P(KvCacheTensor), ctypes.c_size_t,
                                          ctypes.c_uint64]),
    "kvp_kv_worker_get_finished": (c_status, [_v, _v, _v, ctypes.c_size_t, _P(KvFinished)]),
    "kvp_kv_worker_load_now": (c_status, [_v, _v]),
    "kvp_kv_worker_load_errors": (c_status, [_v, _P(_v), c_size_p]),
    "kvp_kv_worker_drain": (c_status, [_v]),
    "kvp_kv_worker_stats": (None, [_v, _P(KvWorkerStats)]),
    "kvp_kv_worker_metrics": (c_status, [_v, _v, ctypes.c_size_t, c_size_p]),
}
for _name, (_res, _args) in _SIGS.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    _f.argtypes = _args
    globals()[_name] = _f
del _name, _res, _args, _f


def status_name(status):
    """kvp_status_name() from the library, as str."""
    return kvp_status_name(status).decode()


def status_str(status):
    """kvp_status_str() from the library, as str."""
    return kvp_status_str(status).decode()


# ---------------------------------------------------------------- zero-copy buffers
class PyBuffer(ctypes.Structure):  # CPython's Py_buffer (stable layout since 3.3)
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p),
                ("len", ctypes.c_ssize_t), ("itemsize", ctypes.c_ssize_t),
                ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p),
                ("strides", ctypes.c_void_p), ("suboffsets", ctypes.c_void_p),
                ("internal", ctypes.c_void_p)]


PyBUF_SIMPLE = 0     # C-contiguous bytes, read access
PyBUF_WRITABLE = 1   # ... and writable
get_buffer = ctypes.pythonapi.PyObject_GetBuffer
get_buffer.restype = ctypes.c_int
get_buffer.argtypes = [ctypes.py_object, _P(PyBuffer), ctypes.c_int]
release_buffer = ctypes.pythonapi.PyBuffer_Release
release_buffer.restype = None
release_buffer.argtypes = [_P(PyBuffer)]

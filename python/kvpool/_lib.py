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
        try:
            return ctypes.CDLL(p), p
        except OSError as e:
            tried.append("%s %s: %s" % (where, p, e))
    raise ImportError("kvpool: cannot load libkvpool.so; tried:\n  " + "\n  ".join(tried) +
                      "\nSet KVPOOL_LIB=/path/to/build/libkvpool.so, reinstall the package "
                      "with a built library (see python/README.md), or `make install`.")


lib, path = _load()

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


# C name -> ctypes mirror, for the layout test.
STRUCTS = {
    "kvp_key_t": Key, "kvp_iov_t": Iov, "kvp_sgl_t": Sgl, "kvp_key_result_t": KeyResult,
    "kvp_pool_stats_t": PoolStats, "kvp_hash_t": Hash, "kvp_hash_mm_item_t": HashMmItem,
    "kvp_hash_request_t": HashRequest, "kvp_kv_store_key_t": StoreKey,
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

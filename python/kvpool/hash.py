"""kvpool.hash: the block-hash contract of include/kvpool/hash.h and the KV
connector's store keys (include/kvpool/kv_connector.h, "Store keys").

block_hashes() is vLLM's request.block_hashes for a prompt hashed from token
0 (full blocks only, chained from NONE_HASH), for prefix_caching_hash_algo
"sha256_cbor" (32-byte hashes) or "xxhash_cbor" (16 bytes).  seed is the
engine's PYTHONHASHSEED string exactly as set; None means unset, as vLLM 0.32
treats it: sha256_cbor then uses the fixed seed "vllm-none-hash"
(DEFAULT_SEED), xxhash_cbor a random one (nothing else can ever match those
hashes).  vLLM up to 0.27 drew a random NONE_HASH for every algorithm.

keys is how the extra keys are spelled: "tagged" (vLLM 0.32, the default, as
for `kvpool hash`: ("lora", name, path), ("mm", id, offset),
("cache_salt", salt), ("prompt_embeds", digest)) or "untagged" (vLLM 0.27's
bare values).  extra (optional dict) feeds them:
  lora_name             str: the request's LoRA adapter name (every block)
  lora_path             str: its lora_path (tagged keys only; default "")
  mm_items              [(identifier, offset, length)], sorted by offset:
                        multimodal items in absolute token positions
  cache_salt            str: the request's cache salt (block 0 only)
  prompt_embeds_sha256  bytes: 32 bytes per full block, block i's digest
"""
import ctypes

from . import _lib
from .errors import raise_for

__all__ = ["block_hashes", "none_hash", "store_key", "parse_store_key", "ALGOS",
           "DEFAULT_SEED"]

ALGOS = ("sha256_cbor", "xxhash_cbor")
DEFAULT_SEED = "vllm-none-hash"  # KVP_HASH_DEFAULT_SEED
_EXTRA_KEYS = frozenset(("lora_name", "lora_path", "mm_items", "cache_salt",
                         "prompt_embeds_sha256"))


def _algo(name):
    """kvp_hash_algo_t of a vLLM algo name: kvpool.Unsupported for the
    pickle-based "sha256"/"xxhash", kvpool.InvalidArg for any other name."""
    a = ctypes.c_int()
    raise_for(_lib.kvp_hash_algo_parse(_text(name, "algo"), ctypes.byref(a)))
    return a.value


def _text(s, what):
    if not isinstance(s, str):
        raise TypeError("kvpool.hash: %s must be str, not %s" % (what, type(s).__name__))
    return s.encode("utf-8", "surrogatepass")


def _none_hash(algo, seed):
    h = _lib.Hash()
    if seed is None:
        raise_for(_lib.kvp_hash_none_hash(algo, None, 0, ctypes.byref(h)))
    else:
        b = _text(seed, "seed")
        raise_for(_lib.kvp_hash_none_hash(algo, b, len(b), ctypes.byref(h)))
    return h


def _bytes(h):
    return bytes(h.bytes[:h.len])


def none_hash(algo, seed):
    """NONE_HASH of algo for the PYTHONHASHSEED string seed (None: unset, see
    the module text)."""
    return _bytes(_none_hash(_algo(algo), seed))


def _request(extra, keys, keep):
    """A kvp_hash_request_t from the extra dict; objects it points into are
    appended to keep."""
    req = _lib.HashRequest()
    try:
        req.keys = _lib.KVP_HASH_KEYS[keys]
    except (KeyError, TypeError):
        raise ValueError("kvpool.hash: keys must be 'tagged' or 'untagged', not %r"
                         % (keys,)) from None
    if not extra:
        return req
    unknown = set(extra) - _EXTRA_KEYS
    if unknown:
        raise ValueError("kvpool.hash: unknown extra keys %s (known: %s)"
                         % (sorted(unknown), ", ".join(sorted(_EXTRA_KEYS))))
    lora = extra.get("lora_name")
    if lora is not None:
        b = _text(lora, "lora_name")
        req.lora_name, req.lora_name_len = b, len(b)
    path = extra.get("lora_path")
    if path is not None:
        b = _text(path, "lora_path")
        req.lora_path, req.lora_path_len = b, len(b)
    salt = extra.get("cache_salt")
    if salt is not None:
        b = _text(salt, "cache_salt")
        req.cache_salt, req.cache_salt_len = b, len(b)
    mm = extra.get("mm_items") or ()
    if mm:
        items = (_lib.HashMmItem * len(mm))()
        for i, (ident, off, length) in enumerate(mm):
            b = _text(ident, "mm identifier")
            items[i].identifier, items[i].identifier_len = b, len(b)
            items[i].offset, items[i].length = off, length
        keep.append(items)
        req.mm_items, req.num_mm_items = ctypes.addressof(items), len(mm)
    pe = extra.get("prompt_embeds_sha256")
    if pe is not None:
        pe = bytes(pe)
        if len(pe) % 32:
            raise ValueError("kvpool.hash: prompt_embeds_sha256 must be 32 bytes per block")
        req.prompt_embeds_sha256, req.num_prompt_embeds_blocks = pe, len(pe) // 32
    return req


def block_hashes(algo, seed, block_size, tokens, extra=None, keys="tagged"):
    """[bytes] per full block of tokens: vLLM's request.block_hashes."""
    a = _algo(algo)
    if not isinstance(block_size, int):
        raise TypeError("kvpool.hash: block_size must be int, not %s" % type(block_size).__name__)
    if block_size < 0:
        raise ValueError("kvpool.hash: block_size must be >= 1, not %d" % block_size)
    nh = _none_hash(a, seed)
    tokens = tokens if isinstance(tokens, (list, tuple, range)) else list(tokens)
    if tokens and (min(tokens) < -(1 << 63) or max(tokens) >= (1 << 63)):
        raise ValueError("kvpool.hash: token ids must fit a signed 64-bit integer")
    toks = (ctypes.c_int64 * len(tokens))(*tokens)
    nblocks = len(toks) // block_size if block_size else 0
    out = (_lib.Hash * max(nblocks, 1))()
    count = ctypes.c_size_t(0)
    keep = []
    req = _request(extra, keys, keep)
    raise_for(_lib.kvp_hash_request_blocks_i64(a, ctypes.byref(nh), toks, len(toks), block_size,
                                               ctypes.byref(req), out, nblocks,
                                               ctypes.byref(count)))
    return [_bytes(out[i]) for i in range(count.value)]


def store_key(model, hash, tp_rank=0, pcp_rank=0, dcp_rank=0, pp_rank=0, group=0,
              cache_prefix=""):
    """The store key of one chunk:
    [cache_prefix@]model@tp_rank:T@pcp<P>@dcp<D>@pp_rank:<PP>@group:<G>@<hex>
    model is the model path (its last component is used, as in vLLM); hash
    the chunk's block hash (bytes, 1..32); tp_rank is T, the rank already
    divided by the group's replication factor."""
    path = _text(model, "model")
    name = ctypes.c_void_p()
    name_len = ctypes.c_size_t()
    raise_for(_lib.kvp_kv_store_key_model_name(path, len(path), ctypes.byref(name),
                                                ctypes.byref(name_len)))
    if not isinstance(hash, (bytes, bytearray, memoryview)):
        raise TypeError("kvpool.hash: hash must be bytes, not %s" % type(hash).__name__)
    hb = bytes(hash)
    if not 1 <= len(hb) <= _lib.KVP_HASH_MAX_LEN:
        raise ValueError("kvpool.hash: hash must be 1..32 bytes, not %d" % len(hb))
    prefix = _text(cache_prefix or "", "cache_prefix")
    k = _lib.StoreKey()
    pbuf = ctypes.create_string_buffer(prefix, len(prefix) or 1)
    k.cache_prefix, k.cache_prefix_len = ctypes.addressof(pbuf), len(prefix)
    k.model_name, k.model_name_len = name.value, name_len.value
    k.tp_rank, k.pcp_rank, k.dcp_rank, k.pp_rank, k.group_id = (
        tp_rank, pcp_rank, dcp_rank, pp_rank, group)
    k.hash.len = len(hb)
    ctypes.memmove(k.hash.bytes, hb, len(hb))
    buf = ctypes.create_string_buffer(_lib.KVP_KV_STORE_KEY_MAX + 1)
    n = ctypes.c_size_t()
    raise_for(_lib.kvp_kv_store_key_format(ctypes.byref(k), buf, len(buf), ctypes.byref(n)))
    return buf.raw[:n.value].decode("utf-8")


def parse_store_key(key):
    """The fields of a store key (str or bytes) as a dict: cache_prefix (""
    if none), model, tp_rank, pcp_rank, dcp_rank, pp_rank, group, hash
    (bytes).  kvpool.Decode if malformed."""
    b = _text(key, "key") if isinstance(key, str) else bytes(key)
    k = _lib.StoreKey()
    raise_for(_lib.kvp_kv_store_key_parse(b, len(b), ctypes.byref(k)))
    return {
        "cache_prefix": ctypes.string_at(k.cache_prefix, k.cache_prefix_len).decode()
        if k.cache_prefix_len else "",
        "model": ctypes.string_at(k.model_name, k.model_name_len).decode(),
        "tp_rank": k.tp_rank, "pcp_rank": k.pcp_rank, "dcp_rank": k.dcp_rank,
        "pp_rank": k.pp_rank, "group": k.group_id, "hash": _bytes(k.hash),
    }

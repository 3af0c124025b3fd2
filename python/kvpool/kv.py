"""kvpool.kv: the KV connector's pool lookup, lookup service, worker and
metadata codec (include/kvpool/kv_connector.h) over ctypes.

  LookupPool(pool, model, ...)      the in-process lookup: hit length of a prefix
  LookupServer(endpoint, lookup)    answers LOOKUP/RESET over ZeroMQ (a C thread)
  LookupClient(endpoint)            the ZeroMQ client (LookupKeyClient)
  Worker(pool, model, ...)          saves and loads a paged KV cache (W1-W8)
  encode_meta(Meta) / decode_meta(bytes)   the scheduler -> worker metadata
  ipc_endpoint(base_path, rpc_port) the lookup service's ipc:// address
  CacheGroup, TensorDesc, LoadSpec, ReqMeta, Meta, LookupResult   plain data

The scheduler (kvp_kv_sched_*) is not bound here.

Lifetimes.  Every object keeps a reference to what its C side points to
(a LookupPool and a Worker to their Pool, a LookupServer to its LookupPool
and drain Worker, a Worker to its registered tensors), so nothing is
collected under it.  An explicit close() is ordered by refusal: closing an
object that another live one still uses raises kvpool.Busy and changes
nothing (Pool.close() under a LookupPool or Worker, LookupPool.close() under
a LookupServer, Worker.close() under the LookupServer it drains).  Close
the users first (the server, then the lookup and worker, then the pool).
Code outside this module that keeps a C pointer (the scheduler extension
takes ctypes.addressof(x.client)) calls x.retain() while it does and
x.release() after; close() is refused in between.  close() is idempotent;
any other call on a closed object raises kvpool.Closed.

Threads.  C calls release the GIL.  A lookup (the C kvp_kv_lookup_pool_t) is
used by one thread at a time, so a LookupPool served by a LookupServer
refuses query() and reset() (kvpool.Busy): ask through a LookupClient, or
before starting / after closing the server; and one LookupPool takes one
server.  A Worker is driven by one thread (the engine's step loop).  The
server's RESET calls the drain Worker's kvp_kv_worker_drain directly (a C
function pointer, no Python callback, so no GIL in the server thread).

Errors.  A C status raises its kvpool.Error subclass (kvpool.Decode,
kvpool.Timeout, ...).  An argument of the wrong type is a TypeError, a
value out of range a ValueError; a tensor layout the worker refuses is
TensorLayoutError (both kvpool.InvalidArg and ValueError) naming every
tensor's shape and strides.
"""
import collections
import collections.abc
import ctypes
import dataclasses
import operator

from . import _lib
from ._handle import Handle
from .errors import error_for, raise_for
from .pool import Pool

__all__ = [
    "CacheGroup", "TensorDesc", "LoadSpec", "ReqMeta", "Meta", "LookupResult",
    "TensorLayoutError", "ipc_endpoint", "encode_meta", "decode_meta",
    "LookupPool", "LookupServer", "LookupClient", "Worker",
]

_byref = ctypes.byref
_addressof = ctypes.addressof
_c_int64 = ctypes.c_int64
_c_char_p = ctypes.c_char_p
_INVALID_ARG, _BUFFER_TOO_SMALL, _BUSY, _CLOSED = -1, -6, -22, -43
_INPROGRESS, _IO_ERROR = 1, -64  # kvp_status_t values a Python lookup callback returns
_U32, _U64 = (1 << 32) - 1, (1 << 64) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1
_REASONS = tuple(_lib.kvp_kv_miss_reason_name(r).decode() for r in range(_lib.KVP_KV_MISS_COUNT))
_DRAIN = ctypes.cast(_lib.kvp_kv_worker_drain, ctypes.c_void_p).value  # its C address


class TensorLayoutError(error_for(_INVALID_ARG), ValueError):
    """Worker.register: the worker refused the tensors' layout (KVP_ERR_INVALID_ARG)."""


# ---------------------------------------------------------------- argument checks
def _int(what, v, lo=_I64_MIN, hi=_I64_MAX):
    if isinstance(v, bool):
        raise TypeError("kvpool.kv: %s must be an int, not bool" % what)
    try:
        v = operator.index(v)
    except TypeError:
        raise TypeError("kvpool.kv: %s must be an int, not %s" % (what, type(v).__name__)) from None
    if not lo <= v <= hi:
        raise ValueError("kvpool.kv: %s must be in %d..%d, not %d" % (what, lo, hi, v))
    return v


def _bool(what, v):
    if not isinstance(v, bool):
        raise TypeError("kvpool.kv: %s must be a bool, not %s" % (what, type(v).__name__))
    return v


def _text(what, v, optional=False):
    """str -> NUL-free UTF-8 bytes (None stays None when optional)."""
    if v is None and optional:
        return None
    if not isinstance(v, str):
        raise TypeError("kvpool.kv: %s must be str%s, not %s"
                        % (what, " or None" if optional else "", type(v).__name__))
    b = v.encode("utf-8", "surrogateescape")
    if b"\0" in b:
        raise ValueError("kvpool.kv: %s must not contain NUL" % what)
    return b


def _req_id(v):
    b = _text("request id", v)
    if not 0 < len(b) <= _lib.KVP_KV_META_MAX_ID_LEN:
        raise ValueError("kvpool.kv: request id must be 1..%d bytes, not %d"
                         % (_lib.KVP_KV_META_MAX_ID_LEN, len(b)))
    return b


def _hashes(hashes, hash_len):
    """(bytes of n * hash_len, n, hash_len) from a sequence of equal-length
    bytes, or from one bytes of n * hash_len (hash_len given)."""
    if isinstance(hashes, (bytes, bytearray, memoryview)):
        b = bytes(hashes)
        if hash_len is None:
            if not b:
                return b, 0, 0
            raise ValueError("kvpool.kv: hashes given as one bytes need hash_len=")
        hl = _int("hash_len", hash_len, 1, _U32)
        if len(b) % hl:
            raise ValueError("kvpool.kv: %d bytes of hashes is not a multiple of hash_len %d"
                             % (len(b), hl))
        return b, len(b) // hl, hl
    if isinstance(hashes, str) or not isinstance(hashes, collections.abc.Iterable):
        raise TypeError("kvpool.kv: hashes must be a sequence of bytes (or one bytes with "
                        "hash_len=), not %s" % type(hashes).__name__)
    items = list(hashes)
    for h in items:
        if not isinstance(h, (bytes, bytearray, memoryview)):
            raise TypeError("kvpool.kv: each hash must be bytes, not %s" % type(h).__name__)
    lens = {len(h) for h in items}
    if len(lens) > 1:
        raise ValueError("kvpool.kv: hashes of different lengths %s" % sorted(lens))
    hl = lens.pop() if lens else 0
    if items and hl == 0:
        raise ValueError("kvpool.kv: hashes must not be empty")
    if hash_len is not None and items and _int("hash_len", hash_len) != hl:
        raise ValueError("kvpool.kv: hash_len=%d but the hashes are %d bytes" % (hash_len, hl))
    return b"".join(bytes(h) for h in items), len(items), hl


def _strs(addr, n):
    """The n NUL-terminated strings of a C `const char *const *`, as str."""
    if not n:
        return []
    return [s.decode("utf-8", "surrogateescape") for s in (_c_char_p * n).from_address(addr)]


def _i64s(addr, n):
    return (_c_int64 * n).from_address(addr)[:] if n else []


def _i64_array(what, seq, keep):
    """(address or None, n) of an int64 array holding seq, kept alive in keep."""
    if isinstance(seq, (str, bytes)) or not isinstance(seq, collections.abc.Iterable):
        raise TypeError("kvpool.kv: %s must be a list of ints, not %s" % (what, type(seq).__name__))
    vals = [_int(what, v) for v in seq]
    if not vals:
        return None, 0
    arr = (_c_int64 * len(vals))(*vals)
    keep.append(arr)
    return _addressof(arr), len(vals)


def _metrics(fn, h):
    """Prometheus text from a kvp_*_metrics call."""
    n = ctypes.c_size_t()
    buf = ctypes.create_string_buffer(16384)
    st = fn(h, buf, len(buf), _byref(n))
    if st == _BUFFER_TOO_SMALL:
        buf = ctypes.create_string_buffer(n.value + 1)
        st = fn(h, buf, len(buf), _byref(n))
    raise_for(st)
    return buf.raw[:n.value].decode()


# ---------------------------------------------------------------- plain data
@dataclasses.dataclass(frozen=True)
class CacheGroup:
    """One KV-cache group (kvp_kv_cache_group_t).  kind: "full_attention",
    "sliding_window", "mamba" or "mla"."""
    kind: str
    block_size: int
    mamba_align: bool = False
    sliding_window: int = 0
    eagle: bool = False

    def __post_init__(self):
        _kind(self.kind)
        set_ = object.__setattr__  # (frozen) the ints as plain int
        set_(self, "block_size", _int("CacheGroup.block_size", self.block_size))
        _bool("CacheGroup.mamba_align", self.mamba_align)
        set_(self, "sliding_window", _int("CacheGroup.sliding_window", self.sliding_window))
        _bool("CacheGroup.eagle", self.eagle)


def _kind(kind):
    if not isinstance(kind, str):
        raise TypeError("kvpool.kv: group kind must be str, not %s" % type(kind).__name__)
    try:
        return _lib.KVP_KV_GROUP_KINDS[kind]
    except KeyError:
        raise ValueError("kvpool.kv: group kind must be one of %s, not %r"
                         % (", ".join(_lib.KVP_KV_GROUP_KINDS), kind)) from None


@dataclasses.dataclass(frozen=True)
class TensorDesc:
    """A KV-cache tensor by address (Worker.register): storage is the base
    address of its memory (numpy: arr.ctypes.data), storage_bytes its size,
    elem_size bytes per element, shape and stride (in elements) its view,
    which starts at storage.  The caller keeps the memory alive while the
    Worker lives."""
    storage: int
    storage_bytes: int
    elem_size: int
    shape: tuple
    stride: tuple


@dataclasses.dataclass
class LoadSpec:
    vllm_cached_tokens: int
    kvpool_cached_tokens: int
    can_load: bool


@dataclasses.dataclass
class ReqMeta:
    """One request's save/load order (kvp_kv_req_meta_t).  block_ids: one
    list per KV-cache group; block_hashes: equal-length bytes;
    partial_tail_offloads: (group_id, cow_block_id, boundary_tokens)."""
    req_id: str
    token_len_chunk: int = 0
    block_ids: tuple = ()
    block_hashes: list = dataclasses.field(default_factory=list)
    can_save: bool = False
    is_last_chunk: object = None  # bool or None
    load_spec: object = None      # LoadSpec or None
    num_prompt_tokens: int = 0
    token_ids: object = None      # list of int or None
    partial_tail_offloads: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Meta:
    """The connector metadata of one engine step (kvp_kv_meta_t)."""
    unfinished_req_ids: set = dataclasses.field(default_factory=set)
    preempted_req_ids: set = dataclasses.field(default_factory=set)
    requests: list = dataclasses.field(default_factory=list)


class LookupResult(collections.namedtuple("LookupResult", "hit reason")):
    """A LookupPool.query answer: hit (tokens) and reason (the miss reason's
    name: "none", "missing_block", ...); also .group_id, .block_index and
    .keys_probed (kvp_kv_lookup_result_t)."""

    def __new__(cls, hit, reason, group_id=0, block_index=-1, keys_probed=0):
        self = super().__new__(cls, hit, reason)
        self.group_id, self.block_index, self.keys_probed = group_id, block_index, keys_probed
        return self


# ---------------------------------------------------------------- metadata codec
def _id_array(what, ids, keep):
    if isinstance(ids, (str, bytes)) or not isinstance(ids, collections.abc.Iterable):
        raise TypeError("kvpool.kv: %s must be a set of str, not %s" % (what, type(ids).__name__))
    bs = [_req_id(i) for i in ids]
    if not bs:
        return None, 0
    arr = (_c_char_p * len(bs))(*bs)  # the array keeps the bytes alive
    keep.append(arr)
    return _addressof(arr), len(bs)


def _c_req_meta(r, m, keep):
    """Fills the kvp_kv_req_meta_t m from the ReqMeta r."""
    if not isinstance(r, ReqMeta):
        raise TypeError("kvpool.kv: Meta.requests holds ReqMeta, not %s" % type(r).__name__)
    rid = ctypes.create_string_buffer(_req_id(r.req_id))
    keep.append(rid)
    m.req_id = _addressof(rid)
    m.token_len_chunk = _int("token_len_chunk", r.token_len_chunk)
    if not isinstance(r.block_ids, (tuple, list)):
        raise TypeError("kvpool.kv: block_ids must be a tuple of lists, not %s"
                        % type(r.block_ids).__name__)
    groups = (_lib.KvIds * len(r.block_ids))()
    for g, ids in zip(groups, r.block_ids):
        g.ids, g.n = _i64_array("block id", ids, keep)
    keep.append(groups)
    m.block_ids.groups, m.block_ids.num_groups = _addressof(groups), len(r.block_ids)
    hb, m.num_block_hashes, m.hash_len = _hashes(r.block_hashes, None)
    keep.append(hb)
    m.block_hashes = ctypes.cast(_c_char_p(hb), ctypes.c_void_p).value if hb else None
    m.can_save = _bool("can_save", r.can_save)
    if r.is_last_chunk is None:
        m.is_last_chunk = _lib.KVP_KV_TRI_NONE
    else:
        m.is_last_chunk = int(_bool("is_last_chunk", r.is_last_chunk))
    ls = r.load_spec
    if ls is not None:
        if not isinstance(ls, LoadSpec):
            raise TypeError("kvpool.kv: load_spec must be a LoadSpec or None, not %s"
                            % type(ls).__name__)
        m.has_load_spec = True
        m.load_spec.vllm_cached_tokens = _int("vllm_cached_tokens", ls.vllm_cached_tokens)
        m.load_spec.kvpool_cached_tokens = _int("kvpool_cached_tokens", ls.kvpool_cached_tokens)
        m.load_spec.can_load = _bool("can_load", ls.can_load)
    m.num_prompt_tokens = _int("num_prompt_tokens", r.num_prompt_tokens)
    if r.token_ids is not None:
        m.has_token_ids = True
        m.token_ids, m.num_token_ids = _i64_array("token id", r.token_ids, keep)
    tails = [tuple(t) for t in r.partial_tail_offloads]
    if any(len(t) != 3 for t in tails):
        raise ValueError("kvpool.kv: a partial tail offload is (group_id, cow_block_id, "
                         "boundary_tokens)")
    if tails:
        arr = (_lib.KvTailOffload * len(tails))(
            *[tuple(_int("partial tail offload", v) for v in t) for t in tails])
        keep.append(arr)
        m.partial_tail_offloads, m.num_partial_tail_offloads = _addressof(arr), len(tails)


def _c_meta(meta, keep):
    """A kvp_kv_meta_t of the Meta, every array it points to kept in keep."""
    if not isinstance(meta, Meta):
        raise TypeError("kvpool.kv: expected a kvpool.kv.Meta, not %s" % type(meta).__name__)
    c = _lib.KvMeta()
    c.unfinished_req_ids, c.num_unfinished = _id_array("unfinished_req_ids",
                                                       meta.unfinished_req_ids, keep)
    c.preempted_req_ids, c.num_preempted = _id_array("preempted_req_ids",
                                                     meta.preempted_req_ids, keep)
    reqs = list(meta.requests)
    arr = (_lib.KvReqMeta * len(reqs))()
    for r, m in zip(reqs, arr):
        _c_req_meta(r, m, keep)
    keep.append(arr)
    c.requests, c.num_requests = (_addressof(arr) if reqs else None), len(reqs)
    return c


def encode_meta(meta):
    """The msgpack encoding of a Meta (kvp_kv_meta_encode), as bytes."""
    keep = []
    c = _c_meta(meta, keep)
    buf, n = ctypes.c_void_p(), ctypes.c_size_t()
    raise_for(_lib.kvp_kv_meta_encode(_byref(c), _byref(buf), _byref(n)))
    try:
        return ctypes.string_at(buf.value, n.value)
    finally:
        _lib.kvp_kv_meta_buf_free(buf, n.value)


def _decode_c(data):
    """The address of a kvp_kv_meta_t decoded from data; free it with
    kvp_kv_meta_free.  kvpool.Decode (or Version) on bad input."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError("kvpool.kv: a meta encoding must be bytes, not %s" % type(data).__name__)
    b = data if type(data) is bytes else bytes(data)
    p = ctypes.c_void_p()
    raise_for(_lib.kvp_kv_meta_decode(b, len(b), _byref(p)))
    return p.value


def _py_req_meta(m):
    hl = m.hash_len
    blob = ctypes.string_at(m.block_hashes, m.num_block_hashes * hl) if m.num_block_hashes else b""
    groups = (_lib.KvIds * m.block_ids.num_groups).from_address(m.block_ids.groups) \
        if m.block_ids.num_groups else ()
    ls = m.load_spec
    tails = (_lib.KvTailOffload * m.num_partial_tail_offloads).from_address(
        m.partial_tail_offloads) if m.num_partial_tail_offloads else ()
    return ReqMeta(
        req_id=ctypes.string_at(m.req_id).decode("utf-8", "surrogateescape"),
        token_len_chunk=m.token_len_chunk,
        block_ids=tuple(_i64s(g.ids, g.n) for g in groups),
        block_hashes=[blob[i * hl:(i + 1) * hl] for i in range(m.num_block_hashes)],
        can_save=m.can_save,
        is_last_chunk=None if m.is_last_chunk == _lib.KVP_KV_TRI_NONE else bool(m.is_last_chunk),
        load_spec=LoadSpec(ls.vllm_cached_tokens, ls.kvpool_cached_tokens, ls.can_load)
        if m.has_load_spec else None,
        num_prompt_tokens=m.num_prompt_tokens,
        token_ids=_i64s(m.token_ids, m.num_token_ids) if m.has_token_ids else None,
        partial_tail_offloads=[(t.group_id, t.cow_block_id, t.boundary_tokens) for t in tails],
    )


def decode_meta(data):
    """The Meta of an encoding (kvp_kv_meta_decode).  kvpool.Decode (or
    kvpool.Version) when data is not a valid encoding."""
    p = _decode_c(data)
    try:
        c = _lib.KvMeta.from_address(p)
        reqs = (_lib.KvReqMeta * c.num_requests).from_address(c.requests) \
            if c.num_requests else ()
        return Meta(set(_strs(c.unfinished_req_ids, c.num_unfinished)),
                    set(_strs(c.preempted_req_ids, c.num_preempted)),
                    [_py_req_meta(m) for m in reqs])
    finally:
        _lib.kvp_kv_meta_free(p)


def ipc_endpoint(base_path, rpc_port, hostname=None, dp_rank=0):
    """ipc://{base_path}/lookup_rpc_port_{rpc_port}_host_{hostname}_dp_rank{dp_rank}
    (hostname None: this host's name)."""
    buf = ctypes.create_string_buffer(4096)
    raise_for(_lib.kvp_kv_lookup_ipc_endpoint(
        _text("base_path", base_path), _int("rpc_port", rpc_port, 0, _U32),
        _text("hostname", hostname, optional=True), _int("dp_rank", dp_rank, 0, _U32),
        buf, len(buf)))
    return buf.value.decode("utf-8", "surrogateescape")


# ---------------------------------------------------------------- handles
class _Handle(Handle):
    """A C object: its handle, what it keeps alive (_deps, whose _users it
    counts in) and retain()/release() (see the module text)."""

    _deps = ()

    def _hold(self, *deps):
        """Marks deps as used by self until self closes."""
        for d in deps:
            d._users += 1
        self._deps = deps

    def retain(self):
        """Marks this object as used by C code outside it: close() raises
        kvpool.Busy until the matching release()."""
        self._handle()
        self._users += 1

    def release(self):
        """Undoes one retain()."""
        if self._users <= 0:
            raise ValueError("kvpool.kv: release() without retain()")
        self._users -= 1

    @property
    def closed(self):
        return self._h is None

    def _handle(self):
        h = self._h
        if h is None:
            raise error_for(_CLOSED)("kvpool.kv.%s is closed" % type(self).__name__,
                                     status=_CLOSED)
        return h

    def _destroy(self, h):  # pragma: no cover (every subclass has its own)
        raise NotImplementedError

    def close(self):
        """Destroys the C object; a second close is a no-op.  kvpool.Busy (and
        nothing closed) while another live object uses this one."""
        if self._h is None:
            return
        self._refuse_if_used()
        h, self._h = self._h, None
        self._destroy(h)
        for d in self._deps:
            d._users -= 1
        self._deps = ()

    def __repr__(self):
        return "<kvpool.kv.%s%s>" % (type(self).__name__, " closed" if self._h is None else "")

    def _stats(self, fn, cls, names):
        """A kvp_*_stats struct as a dict of its fields."""
        s = cls()
        fn(self._handle(), _byref(s))
        return {f: getattr(s, f) for f in names}, s


class _ClientView(_Handle):
    """A kvp_kv_lookup_client_t implementation: .client and its reset op."""

    _client = None

    def _local(self):
        """The handle, when this thread may use the client now."""
        return self._handle()

    @property
    def client(self):
        """The kvp_kv_lookup_client_t (ctypes structure; retain() while C holds it)."""
        self._handle()
        return self._client

    def reset(self):
        """The RESET op (every object of the pool removed); True on ACK."""
        self._local()
        ops = _lib.KvLookupOps.from_address(self._client.ops)
        ack = ctypes.c_bool(False)
        raise_for(_lib.KvResetFn(ops.reset)(self._client.ctx, _byref(ack)))
        return ack.value


class CallbackLookup:
    """A kvp_kv_lookup_client_t written in Python, for the scheduler
    (kvpool.sched.Scheduler): tests, replays, or a lookup answered by other
    means.  lookup(req_id, num_tokens, block_hashes: list[bytes], non_block)
    returns the hit in tokens, or None for "not ready" (non_block only); an
    exception counts as a hit of 0, as LookupKeyClient's.  discard(req_id)
    and reset() -> bool are optional.  The callbacks run with the GIL held,
    in the thread that called the scheduler."""

    def __init__(self, lookup, discard=None, reset=None):
        if not callable(lookup):
            raise TypeError("kvpool.kv.CallbackLookup: lookup must be callable")
        self._fns = (lookup, discard, reset)

        def _lookup(ctx, req, non_block, hit_p):
            r = req.contents
            hl, n = r.hash_len, r.num_block_hashes
            raw = ctypes.string_at(r.block_hashes, hl * n) if hl and n else b""
            hashes = [raw[i * hl:(i + 1) * hl] for i in range(n)] if hl else []
            try:
                hit = lookup(r.req_id.decode(), r.num_tokens, hashes, bool(non_block))
            except Exception:  # noqa: BLE001 (the original: any exception is a miss)
                return _IO_ERROR
            if hit is None:
                return _INPROGRESS
            hit_p[0] = int(hit)
            return 0

        def _discard(ctx, req_id):
            if discard is not None:
                discard(req_id.decode())

        def _reset(ctx, ack_p):
            if reset is None:
                return _IO_ERROR
            try:
                ack_p[0] = bool(reset())
            except Exception:  # noqa: BLE001
                return _IO_ERROR
            return 0

        self._cbs = (_lib.KvLookupFn(_lookup), _lib.KvDiscardFn(_discard), _lib.KvResetFn(_reset))
        self._ops = _lib.KvLookupOps(*[ctypes.cast(f, ctypes.c_void_p) for f in self._cbs])
        self.client = _lib.KvLookupClient(ctypes.addressof(self._ops), None)


def _pool_handle(pool):
    if not isinstance(pool, Pool):
        raise TypeError("kvpool.kv: pool must be a kvpool.Pool, not %s" % type(pool).__name__)
    return pool._handle()


def _fill_layout(p, keep, model, cache_prefix, groups, group_kind, block_size, hash_block_size,
                 use_eagle, counts):
    """The fields the lookup pool and worker params share; counts: (field,
    value, minimum) of the rank counts."""
    p.model_name = _text("model", model)
    p.cache_prefix = _text("cache_prefix", cache_prefix, optional=True)
    for field, v, lo in counts:
        setattr(p, field, _int(field, v, lo, _U32))
    if groups is not None:
        if isinstance(groups, (str, bytes)) or not isinstance(groups, collections.abc.Iterable):
            raise TypeError("kvpool.kv: groups must be a list of CacheGroup, not %s"
                            % type(groups).__name__)
        gs = list(groups)
        for g in gs:
            if not isinstance(g, CacheGroup):
                raise TypeError("kvpool.kv: groups holds CacheGroup, not %s" % type(g).__name__)
        arr = (_lib.KvCacheGroup * len(gs))(*[
            (_kind(g.kind), g.block_size, g.mamba_align, g.sliding_window, g.eagle) for g in gs])
        keep.append(arr)
        p.groups, p.num_groups = (_addressof(arr) if gs else None), len(gs)
    p.group_kind = _kind(group_kind)
    p.block_size = _int("block_size", block_size)
    p.hash_block_size = _int("hash_block_size", hash_block_size)
    p.use_eagle = _bool("use_eagle", use_eagle)


class LookupPool(_ClientView):
    """The in-process pool lookup (kvp_kv_lookup_pool_t) over a kvpool.Pool.
    query() gives the hit length of a prefix; .client is its
    kvp_kv_lookup_client_t (a ctypes structure, valid while this object is
    open: retain() it while C code holds it)."""

    def __init__(self, pool, model, *, cache_prefix=None, tp_size=1, pp_size=1, pcp_size=1,
                 dcp_size=1, num_kv_heads=1, groups=None, group_kind="full_attention",
                 block_size=16, hash_block_size=16, use_eagle=False):
        ph = _pool_handle(pool)
        p = _lib.KvLookupPoolParams()
        _lib.kvp_kv_lookup_pool_params_init(_byref(p))
        keep = []
        _fill_layout(p, keep, model, cache_prefix, groups, group_kind, block_size,
                     hash_block_size, use_eagle,
                     (("tp_size", tp_size, 1), ("pp_size", pp_size, 1), ("pcp_size", pcp_size, 1),
                      ("dcp_size", dcp_size, 1), ("num_kv_heads", num_kv_heads, 1)))
        h = ctypes.c_void_p()
        raise_for(_lib.kvp_kv_lookup_pool_create(ph, _byref(p), _byref(h)))
        self._h = h.value
        self._hold(pool)
        self._served = False  # a LookupServer answers on it (one thread at a time)
        self._client = _lib.kvp_kv_lookup_pool_client(h)
        self._res = _lib.KvLookupResult()

    def _destroy(self, h, _destroy=_lib.kvp_kv_lookup_pool_destroy):
        _destroy(h)

    def _local(self):
        h = self._handle()
        if self._served:
            raise error_for(_BUSY)("kvpool.kv.LookupPool is served by a LookupServer (one "
                                   "thread at a time): ask through a LookupClient", status=_BUSY)
        return h

    def query(self, num_tokens, hashes, apply_eagle=False, *, hash_len=None):
        """LookupResult(hit, reason) for a request of num_tokens tokens whose
        block hashes (at hash_block_size granularity) are hashes."""
        h = self._local()
        b, n, hl = _hashes(hashes, hash_len)
        r = self._res
        raise_for(_lib.kvp_kv_lookup_pool_query(h, _int("num_tokens", num_tokens), b or None, n,
                                                hl, _bool("apply_eagle", apply_eagle), _byref(r)))
        return LookupResult(r.hit_tokens, _REASONS[r.reason] if 0 <= r.reason < len(_REASONS)
                            else "unknown", r.group_id, r.block_index, r.keys_probed)

    def stats(self):
        """kvp_kv_lookup_stats_t as a dict; "reasons" maps reason names to counts."""
        d, s = self._stats(_lib.kvp_kv_lookup_pool_stats, _lib.KvLookupStats,
                           _lib.KV_LOOKUP_STATS_FIELDS)
        d["reasons"] = dict(zip(_REASONS, s.reasons))
        return d


class LookupServer(_Handle):
    """Answers LOOKUP and RESET on endpoint ("ipc://PATH" or
    "tcp://HOST:PORT", port 0: any) from a LookupPool, in one C thread.
    drain: a Worker whose queued saves RESET joins first."""

    def __init__(self, endpoint, lookup, *, drain=None, max_hashes=None):
        if not isinstance(lookup, LookupPool):
            raise TypeError("kvpool.kv: lookup must be a LookupPool, not %s"
                            % type(lookup).__name__)
        if drain is not None and not isinstance(drain, Worker):
            raise TypeError("kvpool.kv: drain must be a Worker or None, not %s"
                            % type(drain).__name__)
        p = _lib.KvLookupServerParams()
        _lib.kvp_kv_lookup_server_params_init(_byref(p))
        p.endpoint = _text("endpoint", endpoint)  # (the struct keeps the bytes)
        if max_hashes is not None:
            p.max_hashes = _int("max_hashes", max_hashes, 1, _U32)
        p.lookup = lookup._local()
        if drain is not None:
            p.drain, p.drain_arg = _DRAIN, drain._handle()
        h = ctypes.c_void_p()
        raise_for(_lib.kvp_kv_lookup_server_start(_byref(p), _byref(h)))
        self._h = h.value
        self._lookup = lookup
        lookup._served = True
        self._hold(*((lookup,) if drain is None else (lookup, drain)))
        self._endpoint = _lib.kvp_kv_lookup_server_endpoint(h).decode()

    def _destroy(self, h, _stop=_lib.kvp_kv_lookup_server_stop):
        _stop(h)
        self._lookup._served = False

    @property
    def endpoint(self):
        """The bound endpoint (a tcp port 0 resolved)."""
        self._handle()
        return self._endpoint

    def stats(self):
        return self._stats(_lib.kvp_kv_lookup_server_stats, _lib.KvLookupServerStats,
                           _lib.KV_SERVER_STATS_FIELDS)[0]

    def metrics(self):
        """Prometheus text of the server's and its lookup's counters (kvpool_lookup_*)."""
        return _metrics(_lib.kvp_kv_lookup_server_metrics, self._handle())


class LookupClient(_ClientView):
    """The ZeroMQ lookup client (kvp_kv_lookup_zmq_t).  query() is one
    blocking LOOKUP; .client is its kvp_kv_lookup_client_t (as LookupPool's)."""

    def __init__(self, endpoint, *, timeout_ms=2000, send_eagle=False, apply_eagle=False,
                 max_inflight=4096):
        p = _lib.KvLookupZmqParams()
        _lib.kvp_kv_lookup_zmq_params_init(_byref(p))
        p.endpoint = _text("endpoint", endpoint)  # (the struct keeps the bytes)
        p.timeout_ms = _int("timeout_ms", timeout_ms, 1, _U32)
        p.send_eagle = _bool("send_eagle", send_eagle)
        p.apply_eagle = _bool("apply_eagle", apply_eagle)
        p.max_inflight = _int("max_inflight", max_inflight, 1, _U32)
        h = ctypes.c_void_p()
        raise_for(_lib.kvp_kv_lookup_zmq_create(_byref(p), _byref(h)))
        self._h = h.value
        self._client = _lib.kvp_kv_lookup_zmq_client(h)

    def _destroy(self, h, _destroy=_lib.kvp_kv_lookup_zmq_destroy):
        _destroy(h)

    def query(self, num_tokens, hashes, *, hash_len=None):
        """The hit in tokens; kvpool.Timeout, kvpool.Io or kvpool.Decode on failure."""
        h = self._handle()
        b, n, hl = _hashes(hashes, hash_len)
        hit = _c_int64()
        raise_for(_lib.kvp_kv_lookup_zmq_query(h, _int("num_tokens", num_tokens), b or None, n,
                                               hl, _byref(hit)))
        return hit.value

    def stats(self):
        return self._stats(_lib.kvp_kv_lookup_zmq_stats, _lib.KvLookupZmqStats,
                           _lib.KV_ZMQ_STATS_FIELDS)[0]


def _tensor(t):
    """A TensorDesc of a TensorDesc or a torch tensor (duck-typed)."""
    if isinstance(t, TensorDesc):
        return t
    if not hasattr(t, "untyped_storage"):
        raise TypeError("kvpool.kv: a KV-cache tensor is a torch tensor or a TensorDesc, not %s"
                        % type(t).__name__)
    dev = getattr(getattr(t, "device", None), "type", "cpu")
    if dev != "cpu":
        raise ValueError("kvpool.kv: the worker copies host memory in place; a %s tensor needs "
                         "a copy seam this binding does not have" % dev)
    # The region a layer lives in is its view's own span, not the whole
    # storage: vLLM's CPU backend slices every layer out of one allocation
    # (storage_offset > 0), and the worker splits a region into num_blocks
    # pages.  Negative strides have no layout the worker knows.
    shape, stride, elem = tuple(t.shape), tuple(t.stride()), t.element_size()
    if any(s < 0 for s in stride):
        raise ValueError("kvpool.kv: a KV-cache tensor with a negative stride (shape %s, "
                         "stride %s)" % (shape, stride))
    span = 0 if 0 in shape else elem * (1 + sum((n - 1) * s for n, s in zip(shape, stride)))
    return TensorDesc(t.data_ptr(), span, elem, shape, stride)


def _c_tensor(d, c):
    shape, stride = tuple(d.shape), tuple(d.stride)
    if not 1 <= len(shape) <= _lib.KVP_KV_TENSOR_MAX_DIMS or len(stride) != len(shape):
        raise ValueError("kvpool.kv: a tensor has 1..%d dims and one stride per dim "
                         "(shape %s, stride %s)" % (_lib.KVP_KV_TENSOR_MAX_DIMS, shape, stride))
    c.storage = _int("tensor storage", d.storage, 1, _U64)
    c.storage_bytes = _int("tensor storage_bytes", d.storage_bytes, 0, _U64)
    c.elem_size = _int("tensor elem_size", d.elem_size, 1, _U32)
    c.ndim = len(shape)
    for i, (n, s) in enumerate(zip(shape, stride)):
        c.shape[i], c.stride[i] = _int("tensor shape", n), _int("tensor stride", s)


class Worker(_Handle):
    """The KV connector's worker (kvp_kv_worker_t) over a kvpool.Pool: saves
    and loads the blocks of a registered paged KV cache in host memory, as
    the metas of each step say.  role: "kv_producer", "kv_consumer" or
    "kv_both"; max_save_bytes None: the library's default (1 GiB)."""

    def __init__(self, pool, model, *, role="kv_both", cache_prefix=None, tp_rank=0, tp_size=1,
                 pp_rank=0, pp_size=1, pcp_rank=0, pcp_size=1, dcp_rank=0, dcp_size=1,
                 num_kv_heads=1, groups=None, group_kind="full_attention", block_size=16,
                 hash_block_size=16, use_eagle=False, load_threads=2, max_save_bytes=None,
                 staging_budget_bytes=0, timeout_ms=0):
        ph = _pool_handle(pool)
        p = _lib.KvWorkerParams()
        _lib.kvp_kv_worker_params_init(_byref(p))
        p.pool = ph
        if not isinstance(role, str):
            raise TypeError("kvpool.kv: role must be str, not %s" % type(role).__name__)
        if role not in _lib.KVP_KV_ROLES:
            raise ValueError("kvpool.kv: role must be one of %s, not %r"
                             % (", ".join(_lib.KVP_KV_ROLES), role))
        p.role = _lib.KVP_KV_ROLES[role]
        self._keep = []
        _fill_layout(p, self._keep, model, cache_prefix, groups, group_kind, block_size,
                     hash_block_size, use_eagle,
                     (("tp_rank", tp_rank, 0), ("tp_size", tp_size, 1), ("pp_rank", pp_rank, 0),
                      ("pp_size", pp_size, 1), ("pcp_rank", pcp_rank, 0),
                      ("pcp_size", pcp_size, 1), ("dcp_rank", dcp_rank, 0),
                      ("dcp_size", dcp_size, 1), ("num_kv_heads", num_kv_heads, 1),
                      ("num_load_threads", load_threads, 1), ("timeout_ms", timeout_ms, 0)))
        if max_save_bytes is not None:
            p.max_save_bytes = _int("max_save_bytes", max_save_bytes, 0, _U64)
        p.staging_budget_bytes = _int("staging_budget_bytes", staging_budget_bytes, 0, _U64)
        h = ctypes.c_void_p()
        raise_for(_lib.kvp_kv_worker_create(_byref(p), _byref(h)))
        self._h = h.value
        self._hold(pool)
        self._tensors = None
        self._fin = _lib.KvFinished()

    def _destroy(self, h, _destroy=_lib.kvp_kv_worker_destroy):
        _destroy(h)  # joins the threads: queued work is finished first
        self._tensors = None

    def register(self, tensors, num_blocks):
        """Registers the KV cache: a list of torch CPU tensors or TensorDesc,
        each a layer's paged cache [num_blocks, ...] (blocks-first) or
        [2, num_blocks, ...] (K/V-first), or one cross-layer tensor.  Once.
        TensorLayoutError when the worker refuses the layout."""
        h = self._handle()
        if isinstance(tensors, (str, bytes)) or not isinstance(tensors, collections.abc.Iterable):
            raise TypeError("kvpool.kv: tensors must be a list, not %s" % type(tensors).__name__)
        objs = list(tensors)
        descs = [_tensor(t) for t in objs]
        arr = (_lib.KvCacheTensor * len(descs))()
        for d, c in zip(descs, arr):
            _c_tensor(d, c)
        nb = _int("num_blocks", num_blocks, 0, _U64)
        st = _lib.kvp_kv_worker_register(h, arr, len(descs), nb)
        if st == _INVALID_ARG:
            raise TensorLayoutError(
                "kvpool.kv: the worker refused the KV-cache layout (num_blocks %d): %s" % (
                    nb, "; ".join("tensor %d shape %s stride %s elem_size %d storage_bytes %d"
                                  % (i, tuple(d.shape), tuple(d.stride), d.elem_size,
                                     d.storage_bytes) for i, d in enumerate(descs))),
                status=st)
        raise_for(st)
        self._tensors = objs  # the worker reads and writes their memory from now on

    def get_finished(self, meta, finished_ids=()):
        """One engine step: queues the loads and saves of meta (None, or the
        bytes of encode_meta / kvp_kv_meta_encode) and reports (done_sending,
        done_recving) as sets of request ids.  finished_ids: the engine's
        finished request ids of this step."""
        h = self._handle()
        if isinstance(finished_ids, (str, bytes)) or not isinstance(
                finished_ids, collections.abc.Iterable):
            raise TypeError("kvpool.kv: finished_ids must be a set of str, not %s"
                            % type(finished_ids).__name__)
        if finished_ids:
            ids = [_req_id(i) for i in finished_ids]
            arr, n = (_c_char_p * len(ids))(*ids), len(ids)
        else:
            arr, n = None, 0
        mp = _decode_c(meta) if meta is not None else None
        fin = self._fin
        try:
            st = _lib.kvp_kv_worker_get_finished(h, mp, arr, n, _byref(fin))
        finally:
            if mp is not None:  # the worker copied what it keeps (job_copy)
                _lib.kvp_kv_meta_free(mp)
        raise_for(st)
        return set(_strs(fin.sending, fin.num_sending)), set(_strs(fin.recving, fin.num_recving))

    def load_now(self, meta):
        """Synchronous loads (the engine's load_async=False), before the
        forward pass: the loads of meta (the step's metadata bytes) run now
        and the call returns when they are done.  Failed blocks show in
        load_errors(); the requests are not reported by get_finished, which
        does not load them again when handed the same meta."""
        h = self._handle()
        mp = _decode_c(meta)
        try:
            st = _lib.kvp_kv_worker_load_now(h, mp)
        finally:
            _lib.kvp_kv_meta_free(mp)
        raise_for(st)

    def load_errors(self):
        """Block ids whose load failed since the last call (then cleared)."""
        p, n = ctypes.c_void_p(), ctypes.c_size_t()
        raise_for(_lib.kvp_kv_worker_load_errors(self._handle(), _byref(p), _byref(n)))
        return set(_i64s(p.value, n.value))

    def drain(self):
        """Blocks until every queued save has been handled."""
        raise_for(_lib.kvp_kv_worker_drain(self._handle()))

    def stats(self):
        return self._stats(_lib.kvp_kv_worker_stats, _lib.KvWorkerStats,
                           _lib.KV_WORKER_STATS_FIELDS)[0]

    def metrics(self):
        """Prometheus text of the worker's counters (kvpool_kv_worker_*)."""
        return _metrics(_lib.kvp_kv_worker_metrics, self._handle())

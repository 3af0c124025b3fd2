"""kvpool.Pool: the pool API of include/kvpool/pool.h over ctypes.

Values cross without a copy in Python: put() hands the C library the address
of the caller's buffer (any object with the buffer protocol: bytes,
bytearray, memoryview, array.array, numpy arrays, mmap), and get_into()
writes straight into the caller's writable buffer; a torch CPU tensor (which
has no buffer protocol) is taken by data_ptr().  The address comes from
PyObject_GetBuffer, and the Py_buffer is held until the C call returns, so
the exporter can neither move nor free the memory meanwhile (a bytearray
cannot be resized while exported).  Buffers must be C-contiguous: anything
else is a TypeError, as is a read-only buffer given to get_into().

Errors: a single-key call raises the kvpool.Error subclass of its status
(kvpool.NotFound, kvpool.NoSpace, ...); a batch call raises only for what
fails the whole batch (bad arguments: KeyLength, ValueEmpty, ValueTooLarge,
DuplicateKey, BatchTooLarge, or the connection) and otherwise returns one
KeyResult per key.  A put of a key that already exists succeeds with
existed=True and leaves the stored value as it was.

One Pool may be used from many threads (the C pool is thread-safe and every
call releases the GIL while in C), but close() must not race other calls.
"""
import collections
import ctypes

from . import _lib
from ._handle import Handle
from .errors import Error, error_for, raise_for

__all__ = ["Pool", "KeyResult"]

try:  # the single-key fast path (python/kvpool/_kvio.c); ctypes alone without it
    _io = _lib.load_ext("_kvio")
except ImportError:
    _io = None
_FAST_KEYS = (str, bytes)
_byref = ctypes.byref
_addressof = ctypes.addressof
_Key, _Iov, _Sgl, _Res = _lib.Key, _lib.Iov, _lib.Sgl, _lib.KeyResult
_PyBuffer = _lib.PyBuffer
_get_buffer, _release_buffer = _lib.get_buffer, _lib.release_buffer
_KEY_LEN_CAP = _lib.KVP_KEY_MAX + 1  # longer keys are passed as this length: refused, never read
_BUFFER_TOO_SMALL = -6
_CLOSED = -43
_NOT_FOUND = -40


class KeyResult(collections.namedtuple("KeyResult", "status existed size")):
    """One key's outcome in a batch: status (0 = KVP_OK, else a negative
    kvp_status_t), existed (put: the key was already stored) and size (get: the
    value's size, also on BufferTooSmall; put: bytes stored)."""

    __slots__ = ()

    @property
    def ok(self):
        return self.status == 0

    @property
    def error(self):
        """The kvpool.Error for a failed key (not raised), or None."""
        return None if self.status == 0 else error_for(self.status)(status=self.status)


def _key(k):
    """A key as (bytes, length for kvp_key_t.len)."""
    if type(k) is bytes:
        b = k
    elif isinstance(k, str):
        b = k.encode("utf-8")
    elif isinstance(k, (bytes, bytearray, memoryview)):
        b = bytes(k)
    else:
        raise TypeError("kvpool key must be bytes or str, not %s" % type(k).__name__)
    n = len(b)
    return b, (n if n < _KEY_LEN_CAP else _KEY_LEN_CAP)


def _keys(keys):
    if isinstance(keys, (bytes, str)):
        raise TypeError("kvpool batch calls take a sequence of keys, not one %s"
                        % type(keys).__name__)
    ks = [_key(k) for k in keys]
    return (_Key * len(ks))(*ks), len(ks)


def _tensor_span(obj, writable):
    """(address, nbytes) of a torch CPU tensor, or None if obj is not one."""
    if not type(obj).__module__.startswith("torch") or not hasattr(obj, "data_ptr"):
        return None
    if obj.device.type != "cpu":
        raise TypeError("kvpool needs a CPU tensor, not one on %s" % obj.device)
    if not obj.is_contiguous():
        raise TypeError("kvpool needs a contiguous tensor")
    return obj.data_ptr(), obj.numel() * obj.element_size()


def _acquire(obj, writable, held):
    """(address, length) of obj's bytes; a Py_buffer taken is appended to
    `held` and must be released with _release(held) after the C call."""
    pb = _PyBuffer()
    try:
        _get_buffer(obj, _byref(pb), 1 if writable else 0)
    except (TypeError, BufferError, ValueError) as e:  # numpy: ValueError for read-only
        span = _tensor_span(obj, writable)
        if span is not None:
            return span
        if not isinstance(e, TypeError) or (writable and _is_buffer(obj)):
            raise TypeError("kvpool needs a C-contiguous%s buffer: %s"
                            % (" writable" if writable else "", e)) from None
        raise TypeError("kvpool value must support the buffer protocol (bytes, bytearray, "
                        "memoryview, numpy array, ...), not %s" % type(obj).__name__) from None
    held.append(pb)
    return pb.buf, pb.len


def _is_buffer(obj):
    try:
        memoryview(obj).release()
        return True
    except TypeError:
        return False


def _release(held):
    for pb in held:
        _release_buffer(_byref(pb))


def _sgls(values, n, writable, held):
    if len(values) != n:
        raise ValueError("kvpool: %d keys but %d values" % (n, len(values)))
    iovs = (_Iov * n)(*[_acquire(v, writable, held) for v in values])
    base, size = _addressof(iovs), ctypes.sizeof(_Iov)
    sgls = (_Sgl * n)(*[(base + i * size, 1) for i in range(n)])
    return iovs, sgls


def _results(res):
    return [KeyResult(r.status, bool(r.flags & 1), r.size) for r in res]


class Pool(Handle):
    """A kvpool pool: Pool("embedded://?capacity=1GiB") or Pool("kvpool://HOST:PORT").

    Keys are bytes or str (UTF-8), 1..512 bytes.  See the module text for values
    and errors.  Use as a context manager or call close()."""

    def __init__(self, uri):
        if not isinstance(uri, str):
            raise TypeError("kvpool.Pool uri must be str, not %s" % type(uri).__name__)
        self._uri = uri
        self._h = None
        h = ctypes.c_void_p()
        raise_for(_lib.kvp_pool_open(uri.encode("utf-8"), _byref(h)),
                  None)
        self._h = h.value

    @property
    def uri(self):
        return self._uri

    @property
    def closed(self):
        return self._h is None

    def close(self, _close=_lib.kvp_pool_close):  # (bound early: __del__ at exit)
        """Closes the pool (waits for calls in flight); a second close is a no-op.
        kvpool.Busy while a kvpool.kv object (LookupPool, Worker) still uses it."""
        self._refuse_if_used()
        h, self._h = self._h, None
        if h is not None:
            _close(h)

    def __repr__(self):
        return "<kvpool.Pool %r%s>" % (self._uri, " closed" if self._h is None else "")

    def _handle(self):
        h = self._h
        if h is None:
            raise error_for(_CLOSED)("kvpool.Pool %r is closed" % self._uri, status=_CLOSED)
        return h

    # ------------------------------------------------------------ put
    def put(self, key, value):
        """Stores value (any C-contiguous buffer) under key; returns its
        KeyResult (existed=True if the key was already stored: not an error).
        Raises the Error of a failed key (e.g. NoSpace)."""
        h = self._handle()
        if _io is not None and type(key) in _FAST_KEYS:
            try:
                st, rst, flags, size = _io.put(h, key, value)
            except (TypeError, BufferError, ValueError):
                pass  # not a plain buffer: the ctypes path takes it (or says why not)
            else:
                raise_for(st)
                raise_for(rst)
                return KeyResult(0, bool(flags & 1), size)
        k = _Key(*_key(key))
        held = []
        try:
            iov = _Iov(*_acquire(value, False, held))
            sgl = _Sgl(_addressof(iov), 1)
            r = _Res()
            raise_for(_lib.kvp_pool_put(h, _byref(k), _byref(sgl), 1, _byref(r)))
        finally:
            _release(held)
        raise_for(r.status)
        return KeyResult(0, bool(r.flags & 1), r.size)

    def put_many(self, keys, values):
        """Stores values[i] under keys[i]; returns one KeyResult per key."""
        h = self._handle()
        ks, n = _keys(keys)
        if n == 0 and len(values) == 0:
            return []
        held = []
        try:
            _iovs, sgls = _sgls(values, n, False, held)
            res = (_Res * n)()
            raise_for(_lib.kvp_pool_put(h, ks, sgls, n, res))
        finally:
            _release(held)
        return _results(res)

    # ------------------------------------------------------------ get
    def get_into(self, key, buffer):
        """Copies key's value into buffer (writable, C-contiguous); returns the
        value's size.  NotFound if absent; BufferTooSmall (nothing copied,
        .size = the size needed) if the buffer is shorter than the value."""
        h = self._handle()
        if _io is not None and type(key) in _FAST_KEYS:
            try:
                st, rst, _flags, size = _io.get_into(h, key, buffer)
            except (TypeError, BufferError, ValueError):
                pass  # not a plain writable buffer: the ctypes path takes it (or says why not)
            else:
                if st != 0:
                    raise_for(st)
                if rst != 0:
                    _raise_key(_Res(rst, 0, size))
                return size
        k = _Key(*_key(key))
        held = []
        try:
            iov = _Iov(*_acquire(buffer, True, held))
            sgl = _Sgl(_addressof(iov), 1)
            r = _Res()
            st = _lib.kvp_pool_get(h, _byref(k), _byref(sgl), 1, _byref(r))
        finally:
            _release(held)
        if st != 0:
            raise_for(st)
        if r.status != 0:
            _raise_key(r)
        return r.size

    def get(self, key):
        """The value of key as bytes (convenience: allocates and copies once;
        use get_into for zero-copy reads).  NotFound if absent."""
        buf = bytearray(1 << 16)
        while True:
            try:
                n = self.get_into(key, buf)
                return bytes(memoryview(buf)[:n])
            except Error as e:
                if e.status != _BUFFER_TOO_SMALL:
                    raise
                buf = bytearray(e.size)

    def get_many_into(self, keys, buffers):
        """Copies each key's value into buffers[i]; one KeyResult per key
        (NotFound, BufferTooSmall with the size needed, ...)."""
        h = self._handle()
        ks, n = _keys(keys)
        if n == 0 and len(buffers) == 0:
            return []
        held = []
        try:
            _iovs, sgls = _sgls(buffers, n, True, held)
            res = (_Res * n)()
            raise_for(_lib.kvp_pool_get(h, ks, sgls, n, res))
        finally:
            _release(held)
        return _results(res)

    # ------------------------------------------------------------ lookups
    def exists(self, key):
        """True if key is stored."""
        return self.exists_many((key,))[0]

    def exists_many(self, keys):
        """[bool] per key (a key may repeat)."""
        h = self._handle()
        ks, n = _keys(keys)
        if n == 0:
            return []
        present = (ctypes.c_uint8 * n)()
        raise_for(_lib.kvp_pool_exists(h, ks, n, present))
        return [bool(p) for p in present]

    def prefix(self, keys):
        """m such that keys[0..m) are all stored and keys[m] is not."""
        h = self._handle()
        ks, n = _keys(keys)
        if n == 0:
            return 0
        m = ctypes.c_size_t()
        raise_for(_lib.kvp_pool_prefix(h, ks, n, _byref(m)))
        return m.value

    # ------------------------------------------------------------ remove
    def remove(self, key):
        """Removes key; NotFound if it is not stored."""
        r = self.remove_many((key,))[0]
        if r.status != 0:
            raise error_for(r.status)(status=r.status)

    def remove_many(self, keys):
        """Removes each key; one KeyResult per key (KVP_OK or NotFound)."""
        h = self._handle()
        ks, n = _keys(keys)
        if n == 0:
            return []
        res = (_Res * n)()
        raise_for(_lib.kvp_pool_remove(h, ks, n, res))
        return _results(res)

    def remove_all(self):
        """Drops every object; returns how many were removed."""
        h = self._handle()
        removed = ctypes.c_uint64()
        raise_for(_lib.kvp_pool_remove_all(h, _byref(removed)))
        return removed.value

    def stats(self):
        """kvp_pool_stats_t as a dict (capacity_bytes, used_bytes, live, ...)."""
        h = self._handle()
        s = _lib.PoolStats()
        raise_for(_lib.kvp_pool_stats(h, _byref(s)))
        return {f: getattr(s, f) for f in _lib.STATS_FIELDS}


def _raise_key(r):
    e = error_for(r.status)(status=r.status)
    if r.status == _BUFFER_TOO_SMALL:
        e = error_for(r.status)("buffer too small for the value: it needs %d bytes" % r.size,
                                status=r.status)
    e.size = r.size
    raise e

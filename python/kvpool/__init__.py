"""kvpool: a thin, fast Python layer over libkvpool.so (the C core).

  kvpool.Pool(uri)    the pool API (pool.h), zero-copy from and into buffers
  kvpool.Error        base of one exception class per kvp_status_t
                      (kvpool.NotFound, kvpool.NoSpace, kvpool.ConnLost, ...)
  kvpool.error_for    status code -> exception class
  kvpool.hash         vLLM block hashes and the KV connector's store keys
  kvpool.kv           the KV connector's lookup pool, lookup server and client,
                      worker and metadata codec (kv_connector.h)

The library is found through $KVPOOL_LIB, a copy inside this package, or the
system loader's libkvpool.so.0 (see kvpool/_lib.py); kvpool.LIB_PATH tells
which one was loaded.
"""
from . import _lib
from . import hash  # noqa: F401  (kvpool.hash)
from . import kv  # noqa: F401  (kvpool.kv)
from .errors import *  # noqa: F401,F403  (Error, error_for and the subclasses)
from .errors import __all__ as _errors_all
from .pool import KeyResult, Pool

__version__ = "0.1.0"
LIB_PATH = _lib.path

__all__ = ["Pool", "KeyResult", "hash", "kv", "LIB_PATH"] + list(_errors_all)

"""What every kvpool class over a C handle shares (kvpool.Pool and the
kvpool.kv classes): the handle in _h (None once closed), the count of other
objects whose C side points into this one (_users: while it is not 0,
close() is refused with kvpool.Busy, so nothing is freed under a live
user), and the context-manager and finaliser protocol.  A subclass has
_handle() (the handle, or kvpool.Closed) and close() (idempotent, calling
_refuse_if_used() before it frees anything)."""
from .errors import error_for

_BUSY = -22


class Handle:
    _h = None
    _users = 0

    def _refuse_if_used(self):
        if self._users:
            raise error_for(_BUSY)("%r is still used by %d kvpool.kv object(s); close them first"
                                   % (self, self._users), status=_BUSY)

    def __enter__(self):
        self._handle()
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if self._h is not None:
            self.close()

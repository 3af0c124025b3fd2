"""kvpool.Error and one subclass per kvp_status_t error code.

The classes come from the one status list, include/kvpool/status.h, through
the generated table in _status.py (python/gen_status.py): KVP_ERR_NOT_FOUND
is kvpool.NotFound, KVP_ERR_CONN_LOST kvpool.ConnLost, and so on (the C name
after KVP_ERR_, in CamelCase).  Every instance carries .status (the int code)
and .name (the C name); error_for(status) gives the class of a code.
"""
from ._status import STATUSES

__all__ = ["Error", "error_for", "raise_for"]


class Error(Exception):
    """A kvpool call failed.  .status: the kvp_status_t code; .name: its C name."""

    status = None
    name = None

    def __init__(self, message=None, status=None):
        if status is not None:
            self.status = status
            self.name = _NAMES.get(status, "KVP_STATUS_%d" % status)
        if message is None:
            message = _MESSAGES.get(self.status, "unknown status %r" % (self.status,))
        super().__init__(message)


_NAMES = {value: name for name, value, _msg, _cls in STATUSES}
_MESSAGES = {value: msg for _name, value, msg, _cls in STATUSES}
_CLASSES = {}

for _cname, _value, _msg, _pyname in STATUSES:
    if _value >= 0:  # KVP_OK and KVP_INPROGRESS are not errors
        continue
    _CLASSES[_value] = type(_pyname, (Error,), {
        "__doc__": "%s (%d): %s." % (_cname, _value, _msg),
        "__module__": "kvpool",
        "status": _value,
        "name": _cname,
    })
    globals()[_pyname] = _CLASSES[_value]
    __all__.append(_pyname)


def error_for(status):
    """The Error subclass of a negative kvp_status_t; Error for an unknown
    negative code.  ValueError for KVP_OK, KVP_INPROGRESS and other
    non-negative values (they are not errors)."""
    status = int(status)
    if status >= 0:
        raise ValueError("status %d is not an error" % status)
    return _CLASSES.get(status, Error)


def raise_for(status, message=None):
    """Raises the Error of a negative status (with the library's message, or
    `message`); does nothing for KVP_OK."""
    if status == 0:
        return
    cls = error_for(status)
    raise cls(message, status=status)


del _cname, _value, _msg, _pyname

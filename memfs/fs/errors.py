"""The errno table of the filesystem and the guard every handler runs under (SPEC §6).

Library errors carry an errno *name* (``MemfsError.errno_name``); this is the one place
that turns names and OS errors into the numbers FUSE replies with. Anything unexpected
becomes ``EIO`` with its traceback logged: one bad request must never take the mount down.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import traceback
from types import CoroutineType

import pyfuse3
from memfs.errors import MemfsError

log = logging.getLogger("memfs.fs")

# Testing hook: handler names listed here raise an unexpected error, so the tests can show
# that the guard keeps the mount up. Read once at import; empty in normal use.
INJECTED_FAULTS = frozenset(filter(None, os.environ.get("MEMFS_INJECT_FAULT", "").split(",")))


def errno_of(name: str) -> int:
    """``"EBADMSG"`` → ``errno.EBADMSG``; unknown names map to ``EIO``."""
    return getattr(errno, name, errno.EIO)


def fuse_error(exc: BaseException) -> pyfuse3.FUSEError:
    """The FUSE reply for an exception raised while serving a request."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, MemfsError):
        return pyfuse3.FUSEError(errno_of(exc.errno_name))
    if isinstance(exc, OSError) and exc.errno:
        return pyfuse3.FUSEError(exc.errno)
    return pyfuse3.FUSEError(errno.EIO)


def inject_fault(name: str) -> None:
    """Raise the testing hook's unexpected error when handler ``name`` is listed in it."""
    if name in INJECTED_FAULTS:
        raise RuntimeError(f"injected fault in {name} (MEMFS_INJECT_FAULT)")


def guarded(handler):
    """Wrap an ``Operations`` method: known errors become their errno, a refused write's
    reason is logged in one line, anything else is ``EIO`` plus a traceback.

    ``handler`` is an async method, or a plain one that returns its result or, when it has to
    wait, a coroutine (awaited here). The plain form is for the hottest request, ``write``:
    a second coroutine per request costs the mount measurably (pyfuse3 passes arguments
    positionally, so neither does the wrapper take keywords)."""

    name = handler.__name__

    @functools.wraps(handler)
    async def wrapper(*args):
        try:
            if INJECTED_FAULTS:
                inject_fault(name)
            result = handler(*args)
            if type(result) is CoroutineType:
                result = await result
            return result
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:
            error = refusal(name, args, exc)
        try:  # outside the except: the reply carries no context holding the failed request
            raise error
        finally:  # nor does its traceback, through this frame, hold the request's arguments
            error = args = None

    return wrapper


def refusal(name: str, args: tuple, exc: Exception) -> pyfuse3.FUSEError:
    """The reply to handler ``name`` called with ``args`` that raised ``exc``: a refused
    request's reason is logged in one line, anything unexpected is ``EIO`` with its traceback
    (:func:`guarded`)."""
    if isinstance(exc, pyfuse3.FUSEError):
        return exc
    if isinstance(exc, MemfsError):
        log.info("%s%s: %s", name, _about(name, args), exc)
        error = fuse_error(exc)
    elif isinstance(exc, OSError):
        log.warning("%s%s: %s", name, _about(name, args), exc)
        error = fuse_error(exc)
    else:
        log.error("unexpected error in %s%s", name, _about(name, args), exc_info=exc)
        error = pyfuse3.FUSEError(errno.EIO)
    _drop_frames(exc)
    return error


def _drop_frames(exc: BaseException) -> None:
    """Clear the locals of the frames a refused request went through: the exception and its
    traceback form a cycle that would otherwise keep the request's buffers (a refused 16 MiB
    line, say) alive until the cyclic GC runs, so memory would grow with every refusal."""
    traceback.clear_frames(exc.__traceback__)
    exc.__traceback__ = None


def _about(handler: str, args: tuple) -> str:
    """`` [session NAME]`` for a log line about a request to one session (SPEC §6: every log
    line about a session names it), or ''. Never raises."""
    try:
        session = args[0].session_of(handler, args[1:])
    except Exception:
        return ""
    return f" [session {session}]" if session else ""


def fail(name: str) -> pyfuse3.FUSEError:
    """``raise fail("EPERM")``: a refusal by errno name."""
    return pyfuse3.FUSEError(errno_of(name))

"""From scopefs errors to the errno a file tool understands.

A refusal of something outside the view or hidden from it is ``ENOENT``,
exactly like a missing name; every other policy refusal is ``EACCES``; an
integrity failure is ``EIO``; read-only places are ``EROFS``.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import logging
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

import pyfuse3

from scopefs.catalog.errors import BadInput, Conflict, Denied, IntegrityError, ScopefsError, StorageError, TooLarge
from scopefs.catalog.reasons import Reason

log = logging.getLogger("scopefs.vfs")
T = TypeVar("T")
P = ParamSpec("P")


def fail(code: int) -> pyfuse3.FUSEError:
    """The reply the kernel gets: an errno and nothing else."""
    return pyfuse3.FUSEError(code)


def errno_for(exc: BaseException) -> int:
    if isinstance(exc, pyfuse3.FUSEError):
        return exc.errno
    if isinstance(exc, Denied):
        return errno.ENOENT if exc.reason == Reason.OUTSIDE_VIEW else errno.EACCES
    if isinstance(exc, IntegrityError):
        return errno.EIO
    if isinstance(exc, TooLarge):
        return errno.EFBIG
    if isinstance(exc, BadInput):
        return errno.EINVAL
    if isinstance(exc, Conflict):
        return errno.EAGAIN
    if isinstance(exc, StorageError):
        cause = exc.__cause__
        if isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT):
            return cause.errno
        return errno.EIO
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    return errno.EIO


def fuse_error(exc: BaseException) -> pyfuse3.FUSEError:
    return pyfuse3.FUSEError(errno_for(exc))


class Answering:
    """How many requests the handlers are answering right now.

    The kernel's own count of the requests it waits on (``vfs.abort``) leaves
    out the ones it sends whatever happens (a mapping's written pages), and a
    lock it holds for one is let go once answered (``vfs.watchdog``). pyfuse3
    serves one mount per process, so one count serves. ``RELEASE`` is left
    out, as the kernel leaves it out: it is sent whatever happens, after the
    kernel let go of everything of the file.
    """

    def __init__(self) -> None:
        self.count = 0
        # Set in a handler's task while it answers: whatever that task waits on, a request waits on.
        self._in_handler = contextvars.ContextVar("scopefs_in_handler", default=False)

    def in_handler(self) -> bool:
        """Whether the calling task is a handler answering a request (one of ``count``)."""
        return self._in_handler.get()

    def begin(self) -> contextvars.Token[bool]:
        """The calling task starts answering a request; ``end`` with what this returns (a handler's
        every request passes here: a context manager would cost a generator each)."""
        self.count += 1
        return self._in_handler.set(True)

    def end(self, began: contextvars.Token[bool]) -> None:
        self._in_handler.reset(began)
        self.count -= 1


ANSWERING = Answering()


def guarded(handler: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """Turn every failure of a request handler into an errno reply.

    pyfuse3 replies only to FUSEError; any other exception would escape into
    its main loop and take the whole mount down. Unexpected failures are
    logged by type only: messages and tracebacks can carry note names.
    """

    @functools.wraps(handler)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        began = ANSWERING.begin()
        try:
            return await handler(*args, **kwargs)
        except pyfuse3.FUSEError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure must become an errno
            if not isinstance(exc, (ScopefsError, OSError)):
                log.error("unexpected %s in %s", type(exc).__name__, handler.__name__)
            raise fuse_error(exc) from None
        finally:
            ANSWERING.end(began)

    return wrapper

"""The exceptions aiolock raises.

Every error of aiolock's own derives from :class:`LockError`::

    Exception
    └── LockError
        ├── LockNotOwnedError      release()/extend() of a holding that is not (or no longer) ours
        │   └── LockLostError      the lease ran out or the key was taken while we held it
        └── AcquireTimeout         `async with` could not get the lock in time
            (also a subclass of the builtin TimeoutError)

Errors of redis-py (``redis.exceptions.ConnectionError``, ``TimeoutError``,
``ResponseError``, ...) are not wrapped: they reach the caller as they are,
after aiolock has done the cleanup that keeps a lock from leaking.
``asyncio.CancelledError`` is never caught for good nor wrapped.
"""

from __future__ import annotations

__all__ = ["AcquireTimeout", "LockError", "LockLostError", "LockNotOwnedError"]


class LockError(Exception):
    """Base class of every error raised by aiolock itself.

    Also raised directly for misuse that is not a bad argument, such as a
    task acquiring a non-reentrant lock it already holds.
    """


class LockNotOwnedError(LockError):
    """The lock is not held by this holder.

    Raised by ``release()`` and ``extend()`` when the holding they would act
    on is not (or is no longer) the current owner on the server. aiolock never
    touches another holder's key when it raises this.
    """


class LockLostError(LockNotOwnedError):
    """The lock was lost while it was held.

    The lease ran out before it could be renewed (the server was unreachable,
    the event loop was blocked, the process was paused), or the key was found
    to belong to someone else. ``async with`` raises it on exit; with
    ``cancel_on_lost=True`` the body is cancelled at once and this is raised
    in place of the cancellation.
    """


class AcquireTimeout(LockError, TimeoutError):
    """The lock could not be acquired within the timeout.

    Raised by ``async with`` (``acquire()`` returns ``False`` instead). It is
    also a builtin :class:`TimeoutError`, so ``except TimeoutError`` catches it.
    """

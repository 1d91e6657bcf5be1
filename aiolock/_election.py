"""Election: one leader at a time among candidates in many processes, on the lock engine.

A term of leadership is a holding of a lock on the election's name, made
by the engine (:class:`~aiolock._leaselock.LeaseLock`) like any other: with
``fair=True`` (every candidate waits in the lock's queue on the server, in
the order it came, and a release or resignation hands the lock straight
to the next), ``fencing=True`` (each term has a fence above every earlier
one) and ``cancel_on_lost=True`` (the body of :meth:`Election.lead` is
cancelled when the term is lost). Its tokens carry the candidate's
identity (:mod:`aiolock._identity`), which is how anyone reads who leads.

What the election adds is around the holding: a watch on the candidate's
own link while it campaigns (a candidate whose server stopped answering
stops campaigning and says so, rather than waiting for ever), resignation,
a loop that campaigns again (:meth:`Election.run`), and the observers
(:meth:`Election.observe`, :meth:`Election.leader`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar, final

import anyio
import anyio.lowlevel
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import _notify
from . import backoff as _backoff
from ._cancel import finish
from ._checks import check_client, check_ttl
from ._exceptions import LockLostError
from ._holding import no_task
from ._identity import UNKNOWN, check_identity, default_identity, identity_of
from ._keys import DEFAULT_PREFIX, keys_for
from ._leaselock import LeaseLock
from ._options import Options
from ._server_lease import server_lease

if TYPE_CHECKING:
    from ._types import Client

__all__ = ["Election", "Term", "standby"]

logger = logging.getLogger("aiolock")

T = TypeVar("T")

#: The pause policy of :meth:`Election.run` between a term's end and the next campaign.
DEFAULT_RUN_BACKOFF: Final = _backoff.exponential(base=0.1, factor=2.0, cap=5.0)
#: How often :meth:`Election.observe` reads the leader at the least (seconds): a
#: candidate that takes a free lock announces nothing.
OBSERVE_POLL: Final = 0.25
#: A campaigning candidate stops when its server has not answered for this long (at
#: least; two leases if longer).
LINK_BOUND: Final = 2.0
#: What :meth:`Election.observe` reports for a holder whose token names nobody (a plain
#: lock on the election's name).
#: What says that the link to the server failed (not the server's answer to a command):
#: redis-py's connection errors and timeouts, the cluster client's own (not a
#: ``RedisError``), and the socket's.
_LINK_ERRORS: Final = (RedisConnectionError, RedisTimeoutError, RedisClusterException, OSError)


class ElectionLock(LeaseLock):
    """The lock a term holds: the engine, with tokens that carry the candidate's identity.

    Observers see it as the event's ``lock`` (``aiolock.lock.type`` is
    ``ElectionLock`` in the OpenTelemetry metrics).
    """

    __slots__ = ()
    _MARKS = "e"

    def _what(self) -> str:
        return "Election"


@final
class Term:
    """One term of leadership: what ``Election.lead()`` gives its body.

    A term is made by :meth:`Election.lead` and ends with its body.
    """

    __slots__ = ("_ended", "_fence", "_identity", "_name", "_scope")

    def __init__(self, name: str, identity: str, fence: int, scope: anyio.CancelScope) -> None:
        self._name = name
        self._identity = identity
        self._fence = fence
        self._ended = asyncio.Event()
        self._scope = scope

    @property
    def name(self) -> str:
        """The election's name."""
        return self._name

    @property
    def identity(self) -> str:
        """The leader's identity (this candidate's), as others read it."""
        return self._identity

    @property
    def fence(self) -> int:
        """The term's fencing number, above that of every earlier term of the election.

        A resource that remembers the highest fence it has seen can refuse
        a deposed leader's late writes with it.
        """
        return self._fence

    @property
    def ended(self) -> asyncio.Event:
        """Set once the term is over (its lock released or lost)."""
        return self._ended

    def __repr__(self) -> str:
        state = "ended" if self._ended.is_set() else "leading"
        return f"<Term {self.name!r} identity={self.identity!r} fence={self.fence} {state}>"


@final
class Election:
    """Leader election: one leader at a time among the candidates of every process.

    ``Election(client, "scheduler", ttl=10.0)`` names an election; nothing
    is sent to the server until a candidate campaigns. ``async with
    election.lead() as term:`` waits until this candidate leads and runs the
    body as the leader; :meth:`run` leads, runs a job, and campaigns again
    after a loss or a failure of the job; :meth:`observe` and
    :meth:`leader` tell who leads; :meth:`resign` ends the term at once.

    Args:
        client: a ``redis.asyncio.Redis`` (Sentinel's ``master_for()`` gives
            one) or ``redis.asyncio.RedisCluster``.
        name: the election's name. It is a lock name: the term is a lock on
            ``<prefix>{<name>}``, so an ``AsyncLock`` on the same name
            excludes the leader and is excluded by it.
        ttl: the term's lease in seconds: how long the server keeps a dead
            leader's term. Renewed every ``ttl/3`` while the leader lives.
        identity: how others see this candidate (:meth:`leader`,
            :meth:`observe`): a printable ``str`` of at most 256 characters.
            Default: ``host:pid:task-name`` of the campaigning task.
        backoff: the pause policy of :meth:`run` between the end of a term
            (lost, or its job failed) and the next campaign (see
            :mod:`aiolock.backoff`); its steps start again after a term that
            lasted a whole lease.
        prefix: the key prefix.

    **Ownership.** A term belongs to the task that campaigned
    (:meth:`lead`); the tasks it starts run in it. Two tasks of one process
    may campaign through one object; each is a candidate of its own.

    **Fairness.** Candidates are served in the order they started to
    campaign, across every process: each waits in the lock's queue on the
    server, and a term that ends (released, resigned) goes straight to the
    first live candidate. A term that is lost without a release (its leader
    died or was paused) goes to the first live candidate once its lease has
    run out.

    **Cancellation.** Cancelling a campaign leaves no key and no queue
    entry behind; cancelling the body ends the term (the lock is released,
    shielded). When the term is lost, the body is cancelled at once and
    :class:`LockLostError` is raised in its place.

    **Expiry.** A term lasts while its leader renews it; the server ends it
    ``ttl`` seconds after the last renewal. A leader that was paused (a
    stopped process, a blocked event loop, a long GC) may still run its
    body for a moment after its term has passed to someone else: the body
    is cancelled as soon as the leader runs again and sees that, but a
    write it has in flight is not taken back. Guard such writes with
    :attr:`Term.fence`. A failover to a replica that had not received the
    term ends it without notice, as for any lock.

    **Raises.** ``TypeError``/``ValueError`` for bad arguments;
    :class:`LockLostError` from :meth:`lead` when the term was lost;
    redis-py's ``ConnectionError`` from :meth:`lead` and :meth:`run` when
    this candidate's server stopped answering while it campaigned (it has
    stopped campaigning), and redis-py's own exceptions, unchanged, from the
    observers.
    """

    __slots__ = (
        "_client",
        "_identity",
        "_keys",
        "_lock",
        "_name",
        "_pauses",
        "_terms",
        "_ttl",
    )

    def __init__(
        self,
        client: Client,
        name: str,
        *,
        ttl: float = 10.0,
        identity: str | None = None,
        backoff: _backoff.Backoff | Callable[[int], float] | None = None,
        prefix: str = DEFAULT_PREFIX,
    ) -> None:
        if client.__class__ is not Redis:
            client = check_client(client)
        ttl = check_ttl(ttl)
        if identity is not None:
            identity = check_identity(identity)
        self._keys = keys_for(name, prefix)
        self._client = client
        self._name = name
        self._ttl = ttl
        self._identity = identity
        self._pauses = DEFAULT_RUN_BACKOFF if backoff is None else _backoff._coerce(backoff)
        lease = server_lease(client, name, prefix, ttl, True, True, 0, None, False, True)
        self._lock = ElectionLock(
            lease,
            Options.of(
                ttl=ttl,
                timeout=None,
                blocking=True,
                backoff=None,
                auto_renew=True,
                on_lost=None,
                cancel_on_lost=True,
                reentrant=False,
                max_hold=None,
                identity=identity,
            ),
        )
        self._terms: dict[asyncio.Task[Any], Term] = {}

    # -- read-only facts ---------------------------------------------------------------

    @property
    def name(self) -> str:
        """The election's name, as given."""
        return self._name

    @property
    def key(self) -> str:
        """The key a term holds: ``<prefix>{<name>}``."""
        return self._keys.lock

    @property
    def ttl(self) -> float:
        """The lease of a term, in seconds."""
        return self._ttl

    @property
    def identity(self) -> str | None:
        """The identity given, or None (then each campaigning task's default is used)."""
        return self._identity

    def __repr__(self) -> str:
        leading = "leading" if self._terms else "not leading"
        return f"<Election {self._name!r} key={self.key!r} ttl={self._ttl} {leading}>"

    # -- leading -------------------------------------------------------------------------

    def lead(self) -> AbstractAsyncContextManager[Term]:
        """Campaign until this candidate leads; the body of ``async with`` is the term.

        ``async with election.lead() as term:`` returns once this candidate
        leads (it waits for ever otherwise), with the :class:`Term`. Leaving
        the body ends the term (the lock goes to the next candidate at once).

        Raises:
            LockLostError: the term was lost while the body ran (the body was
                cancelled at once, and this raised in its place); or, if the
                body raised, noted on its exception.
            redis.exceptions.ConnectionError: the server did not answer this
                candidate for two leases (at least 2 s) while it campaigned:
                it has stopped campaigning (it left nothing on the server
                that does not expire).
            LockError: the name is another kind's (a semaphore's, say).
        """
        return self._lead()

    @asynccontextmanager
    async def _lead(self) -> AsyncIterator[Term]:
        lock = self._lock
        task = asyncio.current_task() or no_task()
        await self._campaign()
        holding = lock._by_task[task]
        # The loss's scope first (cancel_on_lost), then the term's own (resign()).
        lock._enter_scope(task, holding)
        scope = anyio.CancelScope()
        term = Term(self._name, identity_of(holding.token) or UNKNOWN, holding.fence or 0, scope)
        self._terms[task] = term
        try:
            with scope:
                yield term
        except BaseException as exc:
            self._forget(task, term)
            try:
                await lock.__aexit__(type(exc), exc, exc.__traceback__)
            finally:
                term._ended.set()
            raise
        self._forget(task, term)
        try:
            await lock.__aexit__(None, None, None)
        finally:
            term._ended.set()

    def _forget(self, task: asyncio.Task[Any], term: Term) -> None:
        """``term`` of ``task`` is ending: :meth:`resign` no longer sees it."""
        if self._terms.get(task) is term:
            del self._terms[task]

    async def _campaign(self) -> bool:
        """Acquire the term's lock, watching this candidate's link to the server meanwhile.

        Returns whether it was acquired (False only past a ``timeout`` of
        the lock's: ``aiolock run --elect --timeout``).

        Raises:
            redis.exceptions.ConnectionError: the server did not answer for
                :meth:`_link_bound` seconds, or the campaign failed on the link.
        """
        failure: list[BaseException] = []
        acquired = False
        stop = asyncio.Event()
        with anyio.CancelScope() as scope:
            watchdog = asyncio.ensure_future(self._watch_link(scope, failure, stop))
            try:
                acquired = await self._lock.acquire()
            except _LINK_ERRORS as exc:
                failure.append(exc)
            finally:
                # Told, then cancelled: a cancellation that redis-py's wait_for swallowed
                # (CPython gh-86296) must not leave the watchdog running, and us waiting.
                stop.set()
                watchdog.cancel()
                await finish([watchdog])
        if acquired or not failure:
            return acquired  # (a win is ours, whatever the watchdog saw: renewal watches it)
        error = failure[0]
        message = (
            f"election {self._name!r}: the server did not answer this candidate "
            f"({self._lock.identity or default_identity()}) for {self._link_bound():g} s, "
            f"or failed ({error!r}); stopped campaigning"
        )
        logger.warning("%s", message)
        raise RedisConnectionError(message) from error

    def _link_bound(self) -> float:
        """How long a campaigning candidate waits for any answer of its server."""
        return max(2 * self._ttl, LINK_BOUND)

    async def _watch_link(
        self, scope: anyio.CancelScope, failure: list[BaseException], stop: asyncio.Event
    ) -> None:
        """Ask the server for the term's ``PTTL`` now and then; cancel ``scope`` if it is silent.

        Silent: no answer for :meth:`_link_bound` seconds (a failed link, a
        timeout, is no answer; an error reply is one). The campaign itself
        never sees this: a queued candidate sends nothing but refreshes,
        which it lets fail quietly. It ends when ``stop`` is set, whatever
        happened to a cancellation meanwhile.
        """
        bound = self._link_bound()
        every = min(self._ttl / 3, bound / 4)
        answered = time.monotonic()
        error: BaseException | None = None
        while True:
            with anyio.move_on_after(every):
                await stop.wait()
            if stop.is_set():
                return
            left = answered + bound - time.monotonic()
            if left > 0:
                with anyio.move_on_after(left):
                    try:
                        await self._client.pttl(self._keys.lock)
                    except _LINK_ERRORS as exc:
                        error = exc
                    except RedisError:
                        answered = time.monotonic()  # an error reply is an answer
                        continue
                    else:
                        answered = time.monotonic()
                        continue
            if stop.is_set():
                return
            if time.monotonic() >= answered + bound:
                failure.append(
                    error or RedisTimeoutError(f"no answer from the server within {bound:g} s")
                )
                scope.cancel()
                return

    async def resign(self) -> bool:
        """End this object's terms now: their bodies are cancelled and their locks released.

        The next candidate leads at once (the release hands the lock to it).
        A body it cancels ends without an error: ``lead()`` returns as if
        the body had finished. Called in the body of ``lead()`` itself, it
        does not return: the body ends there. Called from another task, it
        returns once the terms have ended.

        Returns:
            Whether this object led (a term was ended).
        """
        terms = list(self._terms.items())
        if not terms:
            return False
        me = asyncio.current_task()
        for _, term in terms:
            term._scope.cancel()
        await anyio.lowlevel.checkpoint()  # in the body: the cancellation is raised here
        for task, term in terms:
            if task is not me:
                await term._ended.wait()
        return True

    async def run(self, job: Callable[[Term], Awaitable[T]]) -> T:
        """Lead, run ``job(term)``, and campaign again after a loss or a failure, until cancelled.

        A term that is lost (``job`` is cancelled at once) or whose job
        raises is logged (a WARNING, with the job's traceback), and the
        candidate campaigns again after the next pause of ``backoff``.
        When ``job`` returns, the term ends and ``run()`` returns its value.
        Cancel the task that awaits ``run()`` to stop it: the term (or the
        campaign) ends, and nothing is left on the server.

        Raises:
            TypeError: ``job`` is not callable.
            redis.exceptions.ConnectionError: the server did not answer this
                candidate for two leases (at least 2 s) while it campaigned
                (see :meth:`lead`); any other error of a campaign (not of a
                term) ends ``run()`` too: a ``LockError`` when the name is
                another kind's, redis-py's error when the server refuses.
        """
        if not callable(job):
            raise TypeError(f"job must be a callable that takes the Term, got {job!r}")
        pauses = self._pauses.delays()
        step = 0.0
        while True:
            started: float | None = None
            try:
                async with self.lead() as term:
                    started = time.monotonic()
                    return await job(term)
            except Exception as exc:
                if started is None:
                    raise  # the campaign failed: its server does not answer, a wrong kind, ...
                if isinstance(exc, LockLostError):
                    logger.warning("election %r: leadership lost: %s", self._name, exc)
                else:
                    logger.warning(
                        "election %r: the job failed; campaigning again",
                        self._name,
                        exc_info=True,
                    )
            if started is not None and time.monotonic() - started >= self._ttl:
                pauses = self._pauses.delays()  # a term that lasted: the pauses start again
            step = _backoff._check_delay(next(pauses, step))
            await anyio.sleep(step)

    # -- observing -----------------------------------------------------------------------

    async def leader(self) -> str | None:
        """The current leader's identity, or None while nobody leads (asks the server)."""
        leader, _ = await self._read()
        return leader

    async def observe(self) -> AsyncGenerator[str | None]:
        """Yield the leader's identity at once and on every change; None while nobody leads.

        A leader is never reported once its term has ended: the leader is
        read again when its lease would end, when a term is released (a
        release notification), and at least every 0.25 s (a candidate that
        takes a vacant term announces nothing). Two terms with a vacancy
        between them give ``None, "a", None, "b", None``; a term handed
        straight to the next candidate gives ``"a", "b"``. Close the
        iterator when done (``contextlib.aclosing``), or leave the loop.

        Raises:
            redis.exceptions.RedisError: the server failed (the iterator ends).
        """
        subscription: _notify.Subscription | None = None
        channel = self._keys.channel
        last: object = _NOTHING
        try:
            while True:
                if subscription is None or subscription.stale:
                    if subscription is not None:
                        subscription.close()
                    subscription = await _notify.subscribe(self._client, channel, None)
                if subscription is not None:
                    subscription.mark()
                leader, pttl = await self._read()
                if leader != last:
                    last = leader
                    yield leader
                delay = OBSERVE_POLL
                if leader is not None and pttl >= 0:
                    delay = min(delay, pttl / 1000 + 0.001)
                if subscription is None:
                    await anyio.sleep(delay)
                else:
                    await subscription.wait(delay)
        finally:
            if subscription is not None:
                subscription.close()

    async def _read(self) -> tuple[str | None, int]:
        """Who holds the term now, and its remaining lease in ms (one round trip)."""
        key = self._keys.lock
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.pttl(key)
            token, pttl = await pipe.execute()
        pttl = int(pttl)
        if token is None or pttl == -2:
            return None, -2
        return identity_of(token) or UNKNOWN, pttl


def standby(
    client: Client,
    name: str,
    *,
    ttl: float,
    identity: str | None,
    prefix: str,
    timeout: float | None,
    on_lost: Callable[[Any], object],
) -> Election:
    """An election whose candidate waits at most ``timeout`` and reports a loss to ``on_lost``.

    For ``aiolock run --elect``, which terminates its command on a loss
    rather than cancelling a body: it campaigns with
    :meth:`Election._campaign` and holds the term as a lock (``_lock``).
    """
    election = Election(client, name, ttl=ttl, identity=identity, prefix=prefix)
    election._lock = ElectionLock(
        election._lock._lease,
        Options.of(
            ttl=election.ttl,
            timeout=timeout,
            blocking=True,
            backoff=None,
            auto_renew=True,
            on_lost=on_lost,
            cancel_on_lost=False,
            reentrant=False,
            max_hold=None,
            identity=election.identity,
        ),
    )
    return election


#: No leader reported yet.
_NOTHING: Final = object()

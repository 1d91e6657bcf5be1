"""Throughput and waiting under contention: aiolock against redis-py's lock and a raw floor.

Four workloads, each run with every subject on a private embedded Valkey:

* W1: 1 coroutine, 3000 uncontended acquire + release cycles on one key, in
  60 rounds of 50 with the subjects taking turns (each round starts with the
  next subject in line). A cycle's cost is the median round's wall time per
  cycle; a ratio to the floor is the median over rounds of (the subject's
  cycle / the floor's cycle in the same round). W1 measures both ways a lock
  object is used: *reused* (one lock object for all 3000 cycles, as a worker
  holds one) and *fresh* (a new lock object per acquisition, as a web handler
  makes one: ``async with AsyncLock(client, name): ...`` per request), against
  the one floor;
* W2: 1000 coroutines sharing 2000 acquisitions of one key;
* W3: 50 coroutines sharing 2000 acquisitions;
* W4: 4 processes (spawned, one client each) x 50 coroutines, 2000 acquisitions in all.

Subjects (:data:`benchmarks._subjects.CONTENTION` for W2-W4: ``aiolock``, both
``redis-py`` and ``floor``; :data:`benchmarks._subjects.W1` for W1, which also runs
``aiolock fresh``, ``redis-py reused`` and ``floor raw``):

* ``aiolock``: ``AsyncLock(client, name)`` with every default; one client per
  process shared by all coroutines, one ``AsyncLock`` object per coroutine,
  reused for all its acquisitions (W1 *reused*);
* ``aiolock fresh`` (W1 only): ``async with AsyncLock(client, name, timeout=...)``
  with a new ``AsyncLock`` per acquisition (W1 *fresh*);
* ``redis-py 0.1``/``redis-py 0.001``: ``redis.asyncio.lock.Lock`` with
  ``sleep=0.1`` (its default) and ``sleep=0.001``, a fresh ``Lock`` per
  acquisition (its token is thread-local); ``redis-py 0.1`` is W1's *fresh*
  redis-py (uncontended, the two never sleep);
* ``redis-py reused`` (W1 only): one ``redis.asyncio.lock.Lock`` (``sleep=0.1``)
  for all the coroutine's acquisitions (W1 *reused*);
* ``floor``: one ``SET key token NX PX`` per attempt plus one ``EVALSHA``
  compare-and-delete per release, polling every 1 ms while contended: the
  least a lock can send, written with redis-py's usual API
  (``client.set(key, token, nx=True, px=...)`` and a registered script);
* ``floor raw`` (W1 only): the same two commands sent with
  ``execute_command``, skipping redis-py's argument checks: the least the
  client itself can spend (aiolock sends its commands this way).

Every subject gets the same shared client per process (its pool sized so no
coroutine waits for a connection), the same 10 s lease, a 10 s bound on each
acquisition (a timeout counts as a failure) and a time bound per run, so a
collapsing baseline is reported rather than waited for. Each holder records
``(acquired_at, released_at)`` and holds across one event-loop turn; sorted
intervals must never overlap.

After the main table, a "W1 both ways" table gives, for *reused* and *fresh*,
each subject's cycle in microseconds and its median ratio to the floor; the
targets checked are: one reused ``AsyncLock`` at most 1.2x the floor, and a
fresh ``AsyncLock`` per acquisition at most 1.05x the floor and cheaper than
redis-py's fresh ``Lock`` (median over rounds of the two side by side).

Run ``python -m benchmarks.contention`` (``--quick`` for a smoke run, 10
rounds of 40 W1 cycles); ``--workload W1`` runs only W1, both ways (about
10 s; ``--quick`` about 2 s); ``--w1-rounds N`` changes W1's number of rounds
(50 cycles each, 40 with ``--quick``). The JSON's ``w1`` list holds the
rows of the "W1 both ways" table. To compare two revisions of aiolock in
one run, see ``python -m benchmarks.compare``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from redis.asyncio import Redis

from ._measure import embedded_server
from ._rounds import ACQUIRE_TIMEOUT, Outcome, Workload, run_rounds, summarize
from ._runner import Benchmark, Session, overlapping, print_table
from ._subjects import (
    AIOLOCK,
    AIOLOCK_FRESH,
    CONTENTION,
    FLOOR,
    FLOOR_RAW,
    LEASE,
    REDIS_PY_REUSED,
    REDIS_PY_SLOW,
    W1,
    Subject,
    by_label,
)

BENCHMARK: Final = Benchmark("contention", __doc__.split("\n")[0])

#: W1's two ways of using a lock object: (way, aiolock's subject, redis-py's subject).
W1_WAYS: Final = (
    ("reused", AIOLOCK, REDIS_PY_REUSED),
    ("fresh", AIOLOCK_FRESH, REDIS_PY_SLOW),
)
#: W1's cycles per round (the full run's and ``--quick``'s).
W1_ROUND_CYCLES: Final = 50
W1_ROUND_CYCLES_QUICK: Final = 40

FULL_WORKLOADS: Final = (
    Workload("W1", 1, 1, 60 * W1_ROUND_CYCLES, rounds=60),
    Workload("W2", 1, 1000, 2000),
    Workload("W3", 1, 50, 2000),
    Workload("W4", 4, 50, 2000),
)
QUICK_WORKLOADS: Final = (
    Workload("W1", 1, 1, 10 * W1_ROUND_CYCLES_QUICK, rounds=10),
    Workload("W2", 1, 50, 100),
    Workload("W3", 1, 10, 100),
    Workload("W4", 2, 5, 50),
)


# -- report --------------------------------------------------------------------------------


@dataclass
class Target:
    """One of the issue's targets, checked against this run's figures."""

    name: str
    passed: bool
    detail: str


def _find(outcomes: Sequence[Outcome], workload: str, subject: Subject) -> Outcome | None:
    return next(
        (o for o in outcomes if o.workload == workload and o.subject == subject.label), None
    )


def _paired(subject: Outcome, baseline: Outcome) -> float:
    """The median over rounds of the subject's cycle over the baseline's in the same round.

    Rounds of the subjects run side by side: the ratio of each pair sees the
    same background load, and their median ignores the odd disturbed pair.
    Rounds where either measured nothing are left out (NaN if none is left).
    """
    ratios = [
        a / b
        for a, b in zip(subject.round_cycle_us, baseline.round_cycle_us, strict=True)
        if math.isfinite(a) and math.isfinite(b) and b > 0
    ]
    return statistics.median(ratios) if ratios else math.nan


@dataclass
class W1Row:
    """One row of the "W1 both ways" table.

    Attributes:
        way: ``"reused"`` (one lock object for every cycle) or ``"fresh"`` (a new
            lock object per acquisition).
        subject: the subject's name.
        cycle_us: the median round's microseconds per cycle.
        best_us: the fastest round's microseconds per cycle.
        vs_floor: the median over rounds of the cycle over the floor's in the same round.
        rounds: how many rounds were measured.
    """

    way: str
    subject: str
    cycle_us: float
    best_us: float
    vs_floor: float
    rounds: int


def _w1_rows(outcomes: Sequence[Outcome]) -> list[W1Row]:
    """The "W1 both ways" rows: for each way, aiolock, redis-py and the floor."""
    floor = _find(outcomes, "W1", FLOOR)
    rows: list[W1Row] = []
    for way, ours, theirs in W1_WAYS:
        for subject in (ours, theirs, FLOOR, FLOOR_RAW):
            found = _find(outcomes, "W1", subject)
            if found is None or not found.acquired:
                continue
            rows.append(
                W1Row(
                    way=way,
                    subject=subject.label,
                    cycle_us=found.cycle_us,
                    best_us=min(found.round_cycle_us),
                    vs_floor=math.nan if floor is None else _paired(found, floor),
                    rounds=len(found.round_cycle_us),
                )
            )
    return rows


def _targets(outcomes: Sequence[Outcome]) -> tuple[dict[str, float], list[Target]]:
    floor_w1 = _find(outcomes, "W1", FLOOR)
    ratios: dict[str, float] = {}
    targets: list[Target] = []
    if floor_w1 is None or not floor_w1.acquired:
        return ratios, targets
    floor_cycle = floor_w1.cycle_us / 1e6
    floor_rate = 1 / floor_cycle
    ratios["floor_w1_cycle_us"] = floor_cycle * 1e6
    ratios["floor_w1_cycles_per_s"] = floor_rate
    rounds = len(floor_w1.round_cycle_us)
    ours_w1 = _find(outcomes, "W1", AIOLOCK)
    if ours_w1 is not None and ours_w1.acquired:
        ours_cycle = ours_w1.cycle_us / 1e6
        paired = _paired(ours_w1, floor_w1)
        ratios["aiolock_w1_cycle_us"] = ours_cycle * 1e6
        ratios["aiolock_w1_cycle_vs_floor"] = paired
        ratios["aiolock_w1_cycle_vs_floor_best_rounds"] = min(ours_w1.round_cycle_us) / min(
            floor_w1.round_cycle_us
        )
        targets.append(
            Target(
                "W1 aiolock (one AsyncLock reused) cycle <= 1.2x floor",
                paired <= 1.2,
                f"{paired:.2f}x (median over {rounds} side-by-side rounds; "
                f"median cycle {ours_cycle * 1e6:.0f} us vs {floor_cycle * 1e6:.0f} us, "
                f"best {min(ours_w1.round_cycle_us):.0f} us "
                f"vs {min(floor_w1.round_cycle_us):.0f} us)",
            )
        )
    for subject, key in (
        (AIOLOCK_FRESH, "aiolock_fresh"),
        (REDIS_PY_SLOW, "redispy_fresh"),
        (REDIS_PY_REUSED, "redispy_reused"),
    ):
        found = _find(outcomes, "W1", subject)
        if found is not None and found.acquired:
            ratios[f"{key}_w1_cycle_us"] = found.cycle_us
            ratios[f"{key}_w1_cycle_vs_floor"] = _paired(found, floor_w1)
    fresh = _find(outcomes, "W1", AIOLOCK_FRESH)
    theirs = _find(outcomes, "W1", REDIS_PY_SLOW)
    if fresh is not None and fresh.acquired and theirs is not None and theirs.acquired:
        fresh_ratio = _paired(fresh, floor_w1)
        theirs_ratio = _paired(theirs, floor_w1)
        vs_theirs = _paired(fresh, theirs)
        ratios["aiolock_fresh_w1_vs_redispy_fresh"] = vs_theirs
        targets.append(
            Target(
                "W1 aiolock fresh (a new AsyncLock per acquisition) cycle <= 1.05x floor "
                "and < redis-py's fresh Lock",
                fresh_ratio <= 1.05 and vs_theirs < 1,
                f"{fresh_ratio:.3f}x floor, redis-py {theirs_ratio:.3f}x floor, "
                f"aiolock/redis-py {vs_theirs:.3f}x (medians over {rounds} side-by-side rounds; "
                f"median cycle {fresh.cycle_us:.0f} us vs floor {floor_cycle * 1e6:.0f} us, "
                f"redis-py {theirs.cycle_us:.0f} us)",
            )
        )
    w2 = _find(outcomes, "W2", AIOLOCK)
    if w2 is not None:
        share = w2.acq_per_s / floor_rate
        ratios["aiolock_w2_rate_vs_floor_w1"] = share
        targets.append(
            Target(
                "W2 aiolock: 0 failures, 0 overlaps, <= 4 client cmds/acq, acq/s >= 0.6x floor W1",
                w2.failures == 0
                and w2.overlaps == 0
                and w2.client_cmds_per_acq <= 4
                and share >= 0.6,
                f"{w2.failures} failures, {w2.overlaps} overlaps, "
                f"{w2.client_cmds_per_acq:.2f} cmds/acq, {w2.acq_per_s:.0f} acq/s "
                f"= {share:.2f}x floor W1 ({floor_rate:.0f}/s)",
            )
        )
    w3 = _find(outcomes, "W3", AIOLOCK)
    if w3 is not None:
        share = w3.acq_per_s / floor_rate
        ratios["aiolock_w3_rate_vs_floor_w1"] = share
        p99 = w3.wait_ms[99]
        targets.append(
            Target(
                "W3 aiolock: acq/s >= 0.6x floor W1, p99 wait < 50 ms",
                share >= 0.6 and p99 < 50,
                f"{w3.acq_per_s:.0f} acq/s = {share:.2f}x floor W1, p99 wait {p99:.1f} ms",
            )
        )
    w4 = _find(outcomes, "W4", AIOLOCK)
    if w4 is not None:
        ratios["aiolock_w4_rate_vs_floor_w1"] = w4.acq_per_s / floor_rate
    return ratios, targets


def _print(outcomes: Sequence[Outcome], workloads: Sequence[Workload]) -> None:
    floor_w1 = _find(outcomes, "W1", FLOOR)
    floor_rate = 1e6 / floor_w1.cycle_us if floor_w1 is not None else math.nan
    rows: list[list[object]] = []
    for o in outcomes:
        fail = str(o.failures)
        if o.failures:
            fail += f" ({o.timeouts}t/{o.errors}e/{o.cut}c)"
        rows.append(
            [
                o.workload,
                o.subject,
                f"{o.wall:.2f}",
                f"{o.acquired}/{o.attempted + o.cut}",
                f"{o.acq_per_s:,.0f}",
                f"{o.acq_per_s / floor_rate:.2f}x",
                fail,
                f"{o.wait_ms[50]:.2f}",
                f"{o.wait_ms[99]:.2f}",
                f"{o.wait_ms[100]:.1f}",
                f"{o.client_cmds_per_acq:.2f}",
                f"{o.server_cmds_per_acq:.2f}",
                str(o.overlaps),
            ]
        )
    print_table(
        "Contention: " + "; ".join(w.label for w in workloads),
        [
            "load",
            "subject",
            "wall s",
            "acq ok",
            "acq/s",
            "vs floor W1",
            "failures",
            "wait p50 ms",
            "p99 ms",
            "max ms",
            "client cmd/acq",
            "server cmd/acq",
            "overlaps",
        ],
        rows,
    )
    errors = [o for o in outcomes if o.first_error]
    for o in errors:
        print(f"  {o.workload} {o.subject}: first error: {o.first_error}")
    print(
        "  failures = timeouts (t) + errors (e) + acquisitions cut by the time bound (c); "
        "vs floor W1 = acq/s over the floor's uncontended W1 cycles/s (median round)"
    )
    w1 = next((w for w in workloads if w.name == "W1"), None)
    w1_rows = _w1_rows(outcomes)
    if w1 is None or not w1_rows:
        return
    objects = {
        AIOLOCK.label: "one AsyncLock",
        AIOLOCK_FRESH.label: "new AsyncLock each",
        REDIS_PY_REUSED.label: "one Lock",
        REDIS_PY_SLOW.label: "new Lock each",
        FLOOR.label: "-",
        FLOOR_RAW.label: "-",
    }
    print_table(
        f"W1 both ways: 1 coroutine, uncontended acquire + release, {w1.rounds} rounds of "
        f"{w1.acquisitions // max(w1.rounds, 1)} cycles, subjects taking turns in each round",
        ["way", "subject", "lock object", "cycle us", "best us", "vs floor"],
        [
            [
                r.way,
                r.subject,
                objects.get(r.subject, ""),
                f"{r.cycle_us:.1f}",
                f"{r.best_us:.1f}",
                f"{r.vs_floor:.3f}x",
            ]
            for r in w1_rows
        ],
    )
    print(
        "  cycle us = the median round's microseconds per acquire + release; best us = the "
        "fastest round's; vs floor = the median over rounds of (cycle / the floor's cycle in "
        "the same round); fresh aiolock enters and leaves `async with` on a new AsyncLock"
    )


def _chart(session: Session, outcomes: Sequence[Outcome], workloads: Sequence[Workload]) -> None:
    with session.chart(1, 2, figsize=(13, 5)) as (figure, (rate_ax, wait_ax)):
        # Each workload's bars are centred on it; W1 has more subjects than the others.
        present = {
            w.name: [s for s in W1 if _find(outcomes, w.name, s) is not None] for w in workloads
        }
        width = 0.8 / max((len(names) for names in present.values()), default=1)
        for subject in W1:
            xs: list[float] = []
            rates: list[float] = []
            p99s: list[float] = []
            fails: list[int] = []
            for position, workload in enumerate(workloads):
                found = _find(outcomes, workload.name, subject)
                if found is None:
                    continue
                names = present[workload.name]
                xs.append(position + (names.index(subject) - (len(names) - 1) / 2) * width)
                rates.append(max(found.acq_per_s, 0.1))
                p99s.append(max(found.wait_ms[99] if found.acquired else 0.0, 0.01))
                fails.append(found.failures)
            if not xs:
                continue
            rate_ax.bar(xs, rates, width, label=subject.label)
            wait_ax.bar(xs, p99s, width, label=subject.label)
            for x, rate, failed in zip(xs, rates, fails, strict=True):
                if failed:
                    rate_ax.annotate(
                        f"{failed} fail",
                        (x, rate),
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        color="red",
                        rotation=90,
                    )
        labels = [w.label.replace(", ", "\n") for w in workloads]
        for ax in (rate_ax, wait_ax):
            ax.set_xticks(range(len(workloads)), labels, fontsize=8)
            ax.set_yscale("log")
            ax.grid(axis="y", alpha=0.3)
        rate_ax.set_ylabel("acquisitions/s (log)")
        rate_ax.set_title("Throughput (higher is better)")
        wait_ax.set_ylabel("p99 wait, ms (log)")
        wait_ax.set_title("p99 wait to acquire (lower is better)")
        low, high = rate_ax.get_ylim()
        rate_ax.set_ylim(low, high * 12)  # room for the legend above the bars (log scale)
        rate_ax.legend(fontsize=8, ncols=3, loc="upper center")
        figure.suptitle("aiolock contention benchmark (embedded Valkey, loopback)")


# -- main ----------------------------------------------------------------------------------


def _workloads(args: argparse.Namespace) -> tuple[Workload, ...]:
    """The workloads chosen, W1's rounds as ``--w1-rounds`` says."""
    workloads: tuple[Workload, ...] = QUICK_WORKLOADS if args.quick else FULL_WORKLOADS
    if args.w1_rounds is not None:
        per_round = W1_ROUND_CYCLES_QUICK if args.quick else W1_ROUND_CYCLES
        workloads = tuple(
            Workload(w.name, w.processes, w.coroutines, args.w1_rounds * per_round, args.w1_rounds)
            if w.name == "W1"
            else w
            for w in workloads
        )
    if args.only_workload:
        workloads = tuple(w for w in workloads if w.name in args.only_workload)
    return workloads


async def _main(args: argparse.Namespace, workloads: Sequence[Workload]) -> dict[str, Any]:
    chosen = by_label(W1, args.subject) if args.subject else W1
    time_limit = args.time_limit if args.time_limit is not None else (2.0 if args.quick else 15.0)
    outcomes: list[Outcome] = []
    ran: list[str] = []
    with embedded_server() as server:
        admin = Redis.from_url(server.url)
        try:
            for workload in workloads:
                subjects = [s for s in (W1 if workload.name == "W1" else CONTENTION) if s in chosen]
                ran.extend(s.label for s in subjects if s.label not in ran)
                rounds = await run_rounds(
                    server.url, admin, workload, subjects, time_limit, args.loop
                )
                for subject in subjects:
                    outcome = summarize(workload, subject, rounds[subject])
                    outcomes.append(outcome)
                    print(
                        f"  {workload.name} {subject.label:<16} {outcome.wall:6.2f} s "
                        f"{outcome.acq_per_s:9,.0f} acq/s  failures {outcome.failures}  "
                        f"overlaps {outcome.overlaps}",
                        flush=True,
                    )
        finally:
            await admin.aclose()
    return {
        "workloads": [asdict(w) for w in workloads],
        "subjects": ran,
        "time_limit_s": time_limit,
        "acquire_timeout_s": ACQUIRE_TIMEOUT,
        "lease_s": LEASE,
        "outcomes": outcomes,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the contention benchmark with the options ``argv`` (``sys.argv[1:]`` when None).

    Returns:
        1 if any run saw an overlap, else 3 if a target was missed, else 0.
    """
    parser = BENCHMARK.parser()
    parser.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds each (workload, subject) run may take (default 15, 2 with --quick)",
    )
    parser.add_argument(
        "--workload",
        dest="only_workload",
        action="append",
        choices=("W1", "W2", "W3", "W4"),
        help="run only this workload (repeatable); W1 runs both ways (reused and fresh)",
    )
    parser.add_argument(
        "--subject",
        action="append",
        choices=[subject.label for subject in W1],
        help="run only this subject (repeatable; 'aiolock fresh' and 'redis-py reused' "
        "are W1's only)",
    )
    parser.add_argument(
        "--w1-rounds",
        type=int,
        default=None,
        help=f"W1's rounds, of {W1_ROUND_CYCLES} cycles each ({W1_ROUND_CYCLES_QUICK} with "
        "--quick); default 30 (10 with --quick)",
    )
    args = parser.parse_args(argv)
    if args.w1_rounds is not None and args.w1_rounds < 1:
        parser.error("--w1-rounds must be at least 1")
    session = BENCHMARK.session(args, argv)
    session.banner("contention benchmark")
    workloads = _workloads(args)
    result = session.run(lambda: _main(args, workloads))
    outcomes: list[Outcome] = result["outcomes"]
    _print(outcomes, workloads)
    ratios, targets = _targets(outcomes)
    for target in targets:
        session.judge(target.passed, f"{target.name}: {target.detail}")
    overlaps = sum(o.overlaps for o in outcomes)
    _chart(session, outcomes, workloads)
    session.write_json(
        {
            **session.header(),
            **{k: v for k, v in result.items() if k != "outcomes"},
            "outcomes": [asdict(o) for o in outcomes],
            "ratios": ratios,
            "w1": [asdict(r) for r in _w1_rows(outcomes)],
            "targets": [asdict(t) for t in targets],
            "overlaps": overlaps,
        }
    )
    return session.finish(broken=overlapping(overlaps))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())

"""The Python API: the same claim, heartbeat and fenced finish as `once run`, for jobs written
in Python.

    import once

    with once.claim("nightly-invoices", every="day", tz="Europe/Berlin",
                    db="postgresql://app@db/ops") as run:
        if run.won:
            bill(run.period.start, run.period.end, fence=run.fence)

Leaving the block records `done`, an exception `failed`; a lost claim makes `run.check()` and
the finish raise `FencedOut`, and `run.finish_in(connection)` writes the done marker inside
the caller's own transaction: docs/how-to/python.md says the rest.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from once import limits, secrets
from once.deadlines import statement_timeout
from once.ledger import (
    Claim,
    Job,
    Ledger,
    LedgerError,
    Target,
    open_ledger,
    parse_url,
    unnamed_url,
)
from once.outcomes import Status
from once.periods import Period
from once.run import attempt, flow
from once.run.lease import Lease
from once.schedules import schedule

# How the API names a ledger: the command line's ONCE_DATABASE_URL is not read here.
NAME_IT = "pass db= the shared ledger's URL (a SQLite file on a volume, if that is meant)"


class FencedOut(Exception):
    """The claim was lost: another attempt owns the period now. Roll back your writes."""


@dataclass
class Run:
    """One period as the API hands it out."""

    job: str
    period: Period
    won: bool
    attempt: int
    fence: int
    skip_reason: str = ""
    finished: bool = False  # recorded, or marked by finish_in
    _ledger: Ledger | None = field(default=None, repr=False)
    _lease: Lease | None = field(default=None, repr=False)
    _claim: Claim | None = field(default=None, repr=False)
    # The connection finish_in marked on: the caller's, of the ledger's driver (Any: its class).
    _marked_on: Any = field(default=None, repr=False)

    @property
    def lost(self) -> bool:
        """The claim was taken over, or its deadline passed without a renewal (another
        attempt may take it over from then on)."""
        return self._lease is not None and (self._lease.lost or self._lease.expired)

    def check(self) -> None:
        """Raise FencedOut when the claim has been lost: call it before each side effect."""
        if self.lost:
            raise FencedOut(f"{self.job} {self.period.key}: the claim was lost")

    def finish_in(self, connection: Any) -> None:
        """Mark the period done inside the caller's open transaction on the ledger's database.

        Raises FencedOut when another attempt took the period over (then roll back; at
        REPEATABLE READ or SERIALIZABLE, PostgreSQL may raise its serialization failure
        instead). Leaving the block records the period done once the transaction committed.
        """
        assert self._ledger is not None and self._lease is not None and self.won
        # Not under the lease's lock: the marker goes through the caller's connection, and on
        # SQLite a renewal holding that lock may be waiting for this very transaction.
        assert self._claim is not None
        if not self._ledger.finish_on(connection, self.job, self.period.key, self._claim):
            raise FencedOut(f"{self.job} {self.period.key}: the claim was lost")
        self._marked_on = connection
        self.finished = True


@contextmanager
def claim(job: str, *, every: str | None = None, cron: str | None = None, tz: str = "UTC",
          db: str | None = None, lag: int = 0, stale_after: float = 300.0,
          max_attempts: int = 3, namespace: str | None = None,
          max_clock_skew: float = flow.DEFAULT_MAX_CLOCK_SKEW,
          now: datetime | None = None) -> Iterator[Run]:
    """Claim the current period of job (as `once run` would) for the duration of the block.

    The claim, its heartbeat (once.run.lease.Lease: the same deadline rule as `once run`) and its
    finish (once.run.attempt.record_result: retried, fenced, recognising a write whose answer was
    lost) are the command line's own. A process forked inside the block never finishes, renews or
    closes the parent's claim: only the process that claimed does.

    Raises ValueError (once.limits.InputError, once.periods.SpecError) for what `once run`
    refuses with exit 2: a bad job name or namespace, schedule or zone, stale_after <= 0,
    lag, max_attempts or max_clock_skew out of range, a bad ONCE_OWNER, an unusable db URL,
    no db in a container (where the default SQLite file would be the container's own); also
    a parameter of the wrong type, and a `now` whose period lies outside the years 1 to
    9999.
    """
    the_job, period, owner = _checked(job, every, cron, tz, db, lag, stale_after, max_attempts,
                                      namespace, max_clock_skew, now)
    name = the_job.name
    ledger = open_ledger(_target(db), timeout=statement_timeout(stale_after))
    claimer = os.getpid()
    try:
        sent = Lease.now()
        won = ledger.claim(the_job, period.key, period.start, period.end, owner,
                           max_clock_skew=max_clock_skew)
        run = Run(name, period, won.won, won.attempt, won.fence,
                  "" if won.won else won.skip_reason, _ledger=ledger, _claim=won)
        if not won.won:
            yield run
            return
        # Renewed until the block ends, finish_in or not: the marker's transaction may still
        # be open, and its row is not the one renewals write.
        run._lease = Lease(attempt.renewal(ledger, name, period.key, won), stale_after,
                           max(sent, ledger.claim_sent))
        with _heartbeat(run._lease):
            try:
                yield run
            except BaseException:
                if os.getpid() == claimer:
                    _end(run, ledger, the_job, won, failed=True)
                raise
        if os.getpid() == claimer:
            _end(run, ledger, the_job, won, failed=False)
    finally:
        if os.getpid() == claimer:
            ledger.__exit__(None, None, None)
        else:
            ledger.abandon()  # the parent's connection: closing it here would end it there

def _target(db: str | None) -> Target:
    """The ledger db names (the default's, outside a container); its password remembered
    first, so that every message after (a LedgerError's) is scrubbed of it (once.secrets)."""
    if db:
        secrets.remember_url(db)
    return parse_url(db or unnamed_url(NAME_IT))


def _checked(job: str, every: str | None, cron: str | None, tz: str, db: str | None, lag: int,
             stale_after: float, max_attempts: int, namespace: str | None,
             max_clock_skew: float, now: datetime | None) -> tuple[Job, Period, str]:
    """The job, its current period and the owner, every parameter checked as the command
    line checks it (InputError, a ValueError; SpecError for the schedule) before anything is
    sent."""
    limits.stored_name(job, namespace)  # the name first, as the command line checks it
    for label, value in (("every", every), ("cron", cron), ("db", db)):
        limits.text(label, value, optional=True)
    limits.text("tz", tz)
    if now is not None and not isinstance(now, datetime):
        raise limits.InputError(f"bad now {now!r}: give an aware datetime")
    sched = schedule(every, cron, tz)
    limits.seconds("max_clock_skew", max_clock_skew, zero_ok=True)
    the_job = flow.claiming_job(job, namespace, sched, lag, max_attempts, stale_after)
    owner = flow.default_owner()
    try:
        period = flow.current_period(sched, lag, now or datetime.now(UTC))
    except OverflowError as exc:  # `once` says it with exit 2
        raise limits.InputError(f"out of range: {exc} (periods exist from year 1 to "
                                f"9999)") from None
    return the_job, period, owner


@contextmanager
def _heartbeat(lease: Lease) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=lease.keep_alive, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        with suppress(RuntimeError):  # a forked child has no such thread
            thread.join()


def _end(run: Run, ledger: Ledger, job: Job, won: Claim, failed: bool) -> None:
    if run._marked_on is not None:
        _finish_marked(run, ledger, job, won)
    else:
        _finish(run, ledger, job, won, "failed" if failed else "done", 1 if failed else 0)


def _finish_marked(run: Run, ledger: Ledger, job: Job, won: Claim) -> None:
    """After finish_in, whatever the block did next: done if the caller's transaction
    committed the marker (the work with it), failed if it rolled back. While it is still
    open nothing is recorded: the row goes stale, and the claim that finds it then records
    done if the marker committed, or takes it over if it did not."""
    lease = run._lease
    assert lease is not None
    still_open = ledger.in_transaction(run._marked_on)
    if still_open and ledger.ONE_WRITER:  # our write would wait for a commit that waits for us
        return
    recorded = attempt.record_marked(ledger, job, run.period.key, won, lease)
    if recorded is None:
        raise LedgerError(f"{run.job} {run.period.key}: the result (done) could not be "
                          f"recorded ({lease.last_error}); the period will be settled once "
                          f"its claim goes stale")
    if not recorded and not still_open:  # rolled back: the work was not done
        _finish(run, ledger, job, won, "failed", 1)


def _finish(run: Run, ledger: Ledger, job: Job, won: Claim, status: Status,
            exit_code: int) -> None:
    lease = run._lease
    assert lease is not None
    # Past the deadline the block has already run: the fenced write below still records it
    # if nobody took the row over meanwhile, and matches no row if somebody did.
    if lease.lost:
        ledger.release(run.job, run.period.key)
        raise FencedOut(f"{run.job} {run.period.key}: the claim was lost; nothing recorded")
    recorded = attempt.record_result(ledger, job, run.period.key, won, status, exit_code,
                                     status, lease)
    run.finished = True
    if recorded is None:
        raise LedgerError(f"{run.job} {run.period.key}: {attempt.trouble(lease, 'the write')}"
                          f", the result ({status}) was not recorded ({lease.last_error}); "
                          f"the period will be retried once its claim goes stale")
    if not recorded:
        raise FencedOut(f"{run.job} {run.period.key}: the final write matched no row")


# -- once.lead: one leader per name, for a scheduler inside a Python process ---------------------


@dataclass
class Leader:
    """This process's term as the leader of `name` (once.lead)."""

    name: str
    term: int  # the fencing token: larger than every term of this name before it
    lost: threading.Event = field(repr=False)  # set by the deadline: stop scheduling now
    _lease: Lease | None = field(default=None, repr=False)

    def check(self) -> None:
        """Raise FencedOut when the lease has been lost: call it before each side effect (and
        pass `term` to what you write, so that a paused leader's late writes are refused)."""
        if self.lost.is_set() or (self._lease is not None
                                  and (self._lease.lost or self._lease.expired)):
            self.lost.set()
            raise FencedOut(f"{self.name}: term {self.term} lost its lease")


@contextmanager
def lead(name: str, *, db: str | None = None, lease: float = 15.0,
         stop_within: float | None = None, namespace: str | None = None) -> Iterator[Leader]:
    """Block until this process leads `name` on the ledger (as `once lead` would), then hold
    the lease for the duration of the block; leaving it releases the lease.

    The lease is renewed every third of `lease` from a thread of its own; `leader.lost` is set
    `stop_within` seconds (default: a third of the lease, at most 10) before the deadline of
    the last renewal sent, when renewals fail or another holder took the lease: by then every
    job the block scheduled must have stopped. A thread cannot be killed: where that cannot be
    promised, run the scheduler under `once lead` instead (docs: One leader for an in-process
    scheduler). Raises ValueError for what `once lead` refuses with exit 2.
    """
    from once.run import lead as leading

    stored = limits.stored_name(name, namespace, "lead")
    limits.text("db", db, optional=True)
    try:
        lease = limits.seconds("lease", lease)  # a number, finite, more than 0
    except limits.InputError:  # its range, not any duration's
        raise limits.InputError(f"bad lease {lease!r}: use {leading.LEASE_MIN:g} to "
                                f"{leading.LEASE_MAX} seconds (1 year)") from None
    if stop_within is not None:
        stop_within = limits.seconds("stop_within", stop_within)
    problem = leading.lease_problem(lease, stop_within)
    if problem:
        raise limits.InputError(problem.replace("--kill-after", "stop_within")
                                .replace("--lease", "lease"))
    if (db, stored) in _LEADING:  # it would wait for itself for ever
        raise limits.InputError(f"once.lead({stored!r}) inside a once.lead of the same name "
                                f"and ledger in this process")
    owner = flow.default_owner()
    ledger = open_ledger(_target(db), timeout=statement_timeout(lease))
    elector = leading.Elector(ledger, stored, lease, owner, leading.Voice(stored, owner, -1))
    leading_process = os.getpid()
    try:
        won = elector.campaign()
        assert won is not None  # nothing sets its stop: it waits until it leads
        term, sent = won
        held = elector.lease_for(term, sent)
        leader = Leader(stored, term, threading.Event(), held)
        _LEADING.add((db, stored))
        try:
            with _heartbeat(held), _watch(held, leader.lost,
                                          leading.kill_after_for(lease, stop_within)):
                yield leader
        finally:  # an exception leaves the block too: the lease goes with it
            _LEADING.discard((db, stored))
            if os.getpid() == leading_process:  # never a child forked in the block
                if held.stranded:  # a renewal stuck in the driver holds the connection
                    ledger.abandon()
                elector.release(term, "lost" if leader.lost.is_set() else "released")
    finally:
        if os.getpid() == leading_process:
            ledger.close()
        else:
            ledger.abandon()  # the parent's connection: closing it here would end it there


# The names this process leads, by ledger (once.lead refuses to nest one in itself).
_LEADING: set[tuple[str | None, str]] = set()


@contextmanager
def _watch(held: Lease, lost: threading.Event, stop_within: float) -> Iterator[None]:
    """Set `lost` when the lease is lost, or `stop_within` before its deadline: a thread of
    its own, as a renewal may be stuck in the driver."""
    done = threading.Event()

    def watch() -> None:
        while not (held.lost or Lease.now() >= held.deadline - stop_within):
            if done.wait(min(0.1, max(0.0, held.deadline - stop_within - Lease.now()))):
                return
        lost.set()

    thread = threading.Thread(target=watch, daemon=True, name="once-lead-watch")
    thread.start()
    try:
        yield
    finally:
        done.set()
        with suppress(RuntimeError):
            thread.join()

"""The Python API: the same claim, heartbeat and fenced finish as `once run`, for jobs written
in Python.

    import once

    with once.claim("nightly-invoices", every="day", tz="Europe/Berlin",
                    db="postgresql://app@db/ops") as run:
        if run.won:
            bill(run.period.start, run.period.end, fence=run.fence)

Leaving the block normally records `done`; an exception records `failed` (and propagates).
While the block runs, a background thread renews the heartbeat every stale_after/3; when the
claim is lost (another attempt took it over, or the ledger stayed unreachable past the
deadline), `run.lost` turns true, `run.check()` raises `FencedOut`, and the finish writes
nothing and raises `FencedOut`.

When the ledger lives in the job's own database, `run.finish_in(connection)` writes the done
marker inside the caller's transaction (psycopg 3, sqlite3 or PyMySQL connection): the work and
the marker commit together or not at all, and it raises `FencedOut` when the claim is no longer
ours, so that the caller rolls its transaction back.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from once import attempt, core, limits
from once.deadlines import statement_timeout
from once.lease import Lease
from once.ledger import Job, Ledger, LedgerError, default_url, open_ledger, parse_url
from once.outcomes import Status
from once.periods import Period, schedule


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
    finished: bool = False
    _ledger: Ledger | None = field(default=None, repr=False)
    _lease: Lease | None = field(default=None, repr=False)

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

        Raises FencedOut when the row is no longer ours (then roll back).
        """
        assert self._ledger is not None and self._lease is not None and self.won
        with self._lease.lock:  # no renewal on our connection meanwhile
            if not self._ledger.finish_on(connection, self.job, self.period.key, self.attempt):
                raise FencedOut(f"{self.job} {self.period.key}: the claim was lost")
            self.finished = True


@contextmanager
def claim(job: str, *, every: str | None = None, cron: str | None = None, tz: str = "UTC",
          db: str | None = None, lag: int = 0, stale_after: float = 300.0,
          max_attempts: int = 3, namespace: str | None = None,
          max_clock_skew: float = core.DEFAULT_MAX_CLOCK_SKEW,
          now: datetime | None = None) -> Iterator[Run]:
    """Claim the current period of job (as `once run` would) for the duration of the block.

    The claim, its heartbeat (once.lease.Lease: the same deadline rule as `once run`) and its
    finish (once.attempt.record_result: retried, fenced, recognising a write whose answer was
    lost) are the command line's own. A process forked inside the block never finishes, renews or
    closes the parent's claim: only the process that claimed does.

    Raises ValueError (once.limits.InputError, once.periods.SpecError) for what `once run`
    refuses with exit 2: a bad job name or namespace, schedule or zone, stale_after <= 0,
    lag, max_attempts or max_clock_skew out of range, a bad ONCE_OWNER, an unusable db URL;
    also a parameter of the wrong type, and a `now` whose period lies outside the years 1 to
    9999.
    """
    the_job, period, owner = _checked(job, every, cron, tz, db, lag, stale_after, max_attempts,
                                      namespace, max_clock_skew, now)
    name = the_job.name
    ledger = open_ledger(parse_url(db or default_url()),
                         timeout=statement_timeout(stale_after))
    claimer = os.getpid()
    try:
        sent = Lease.now()
        won = ledger.claim(the_job, period.key, period.start, period.end, owner,
                           max_clock_skew=max_clock_skew)
        run = Run(name, period, won.won, won.attempt, won.fence,
                  "" if won.won else won.skip_reason, _ledger=ledger)
        if not won.won:
            yield run
            return
        # Once finish_in has marked it, nothing is left to keep alive.
        run._lease = Lease(attempt.renewal(ledger, name, period.key, won.attempt,
                                           lambda: run.finished), stale_after, sent)
        with _heartbeat(run._lease):
            try:
                yield run
            except BaseException:
                if os.getpid() == claimer:
                    _finish(run, ledger, the_job, won, "failed", 1)
                raise
        if os.getpid() == claimer and not run.finished:
            _finish(run, ledger, the_job, won, "done", 0)
    finally:
        if os.getpid() == claimer:
            ledger.__exit__(None, None, None)
        else:
            ledger.abandon()  # the parent's connection: closing it here would end it there

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
    the_job = core.claiming_job(job, namespace, sched, lag, max_attempts, stale_after)
    owner = core.default_owner()
    try:
        period = core.current_period(sched, lag, now or datetime.now(UTC))
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


def _finish(run: Run, ledger: Ledger, job: Job, won: Any, status: Status,
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
        raise LedgerError(f"{run.job} {run.period.key}: the result ({status}) could not be "
                          f"recorded ({lease.last_error}); the period will be retried once "
                          f"its claim goes stale")
    if not recorded:
        raise FencedOut(f"{run.job} {run.period.key}: the final write matched no row")

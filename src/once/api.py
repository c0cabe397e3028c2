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

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from once import core
from once.ledger import Claim, Job, Ledger, LedgerError, default_url, open_ledger, parse_url
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
    lost: bool = False
    finished: bool = False
    _ledger: Ledger | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check(self) -> None:
        """Raise FencedOut when the claim has been lost: call it before each side effect."""
        if self.lost:
            raise FencedOut(f"{self.job} {self.period.key}: the claim was lost")

    def finish_in(self, connection: Any) -> None:
        """Mark the period done inside the caller's open transaction on the ledger's database.

        Raises FencedOut when the row is no longer ours (then roll back).
        """
        assert self._ledger is not None and self.won
        with self._lock:
            if not self._ledger.finish_on(connection, self.job, self.period.key, self.attempt):
                raise FencedOut(f"{self.job} {self.period.key}: the claim was lost")
            self.finished = True


@contextmanager
def claim(job: str, *, every: str | None = None, cron: str | None = None, tz: str = "UTC",
          db: str | None = None, lag: int = 0, stale_after: float = 300.0,
          max_attempts: int = 3, namespace: str | None = None,
          now: datetime | None = None) -> Iterator[Run]:
    """Claim the current period of job (as `once run` would) for the duration of the block."""
    sched = schedule(every, cron, tz)
    name = f"{namespace}:{job}" if namespace else job
    the_job = Job(name, sched.kind, sched.spec, sched.tz_name, lag, max_attempts, stale_after)
    period = core.current_period(sched, lag, now or datetime.now(UTC))
    with open_ledger(parse_url(db or default_url()),
                     timeout=max(1.0, min(10.0, stale_after / 3))) as ledger:
        sent = time.monotonic()
        won = ledger.claim(the_job, period.key, period.start, period.end, core.default_owner())
        run = Run(name, period, won.won, won.attempt, won.fence,
                  "" if won.won else won.skip_reason, _ledger=ledger)
        if not won.won:
            yield run
            return
        with _heartbeat(run, ledger, the_job, won, sent):
            try:
                yield run
            except BaseException:
                _finish(run, ledger, "failed", 1)
                raise
        if not run.finished:
            _finish(run, ledger, "done", 0)


@contextmanager
def _heartbeat(run: Run, ledger: Ledger, job: Job, won: Claim, sent: float) -> Iterator[None]:
    stop = threading.Event()
    deadline = [sent + job.stale_after]

    def beat() -> None:
        while not stop.wait(job.stale_after / 3):
            began = time.monotonic()
            try:
                with run._lock:
                    if run.finished:
                        return
                    ours = ledger.renew(run.job, run.period.key, run.attempt)
            except LedgerError:
                ledger.close()
                ours = None
            if ours:
                deadline[0] = began + job.stale_after
            elif ours is False or time.monotonic() >= deadline[0]:
                run.lost = True
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _finish(run: Run, ledger: Ledger, status: str, exit_code: int) -> None:
    if run.lost:
        raise FencedOut(f"{run.job} {run.period.key}: the claim was lost; nothing recorded")
    with run._lock:
        ours = ledger.finish(run.job, run.period.key, run.attempt,
                             "done" if status == "done" else "failed", exit_code, status)
        run.finished = True
    if not ours:
        raise FencedOut(f"{run.job} {run.period.key}: the final write matched no row")

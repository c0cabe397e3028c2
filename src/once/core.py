"""Run and catch-up, composed from the period engine, the ledger and the runner.

This is what `once run` does and what a Python job imports; the CLI is a thin layer over it.
Nothing here imports SQLAlchemy or rich: it is the hot path of every cron fire.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from once.ledger import Claim, Job, Ledger, LedgerError
from once.periods import Period, Schedule, iso

if TYPE_CHECKING:
    from once.runner import Lease

# Exit statuses of `once run` that are not the child's own (CONTRACT.md).
EXIT_USAGE = 2
EXIT_FENCED_OUT = 70
EXIT_LEDGER = 75
EXIT_TIMEOUT = 124

QUIET, NORMAL, VERBOSE = 0, 1, 2


@dataclass
class Settings:
    """How `once run` runs a claimed period."""

    kill_after: float = 10.0
    timeout: float | None = None
    skipped_exit_code: int = 0
    owner: str = ""
    verbosity: int = NORMAL

    def __post_init__(self) -> None:
        if not self.owner:
            self.owner = default_owner()


def default_owner() -> str:
    """ONCE_OWNER (a pod name, say), else host name and process id."""
    return os.environ.get("ONCE_OWNER") or f"{os.uname().nodename}:{os.getpid()}"


def say(message: str, settings: Settings | None = None, level: int = NORMAL) -> None:
    """One `once:` line on stderr, unless the verbosity is below its level."""
    verbosity = settings.verbosity if settings else NORMAL
    if verbosity >= level:
        print(f"once: {message}", file=sys.stderr, flush=True)


def current_period(schedule: Schedule, lag: int = 0, now: datetime | None = None) -> Period:
    """The period `once run` claims now: the one containing now, `lag` periods back."""
    period = schedule.containing(now or datetime.now(UTC))
    return schedule.shifted(period, -lag) if lag else period


def child_env(job: Job, period: Period, claim: Claim) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "ONCE_JOB": job.name,
        "ONCE_PERIOD": period.key,
        "ONCE_PERIOD_START": iso(period.start),
        "ONCE_PERIOD_END": iso(period.end),
        "ONCE_ATTEMPT": str(claim.attempt),
        "ONCE_FENCE": str(claim.fence),
        "ONCE_TZ": job.tz,
    })
    return env


@dataclass(frozen=True)
class Result:
    """What became of one period: its outcome (ONCE_OUTCOME's words) and once's exit status."""

    outcome: str  # done, failed, timed-out, fenced-out, skipped-*, unreachable
    status: int

    @property
    def ran(self) -> bool:
        return not self.outcome.startswith("skipped")

    @property
    def ok(self) -> bool:
        return self.outcome in ("done", "skipped-done", "skipped-held", "skipped-failed")


def run_period(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
               settings: Settings, rerun_reason: str | None = None) -> Result:
    """Claim one period and, if won, run command for it."""
    what = f"{job.name} {period.key}"
    sent = time.monotonic()
    try:
        claim = ledger.claim(job, period.key, period.start, period.end, settings.owner,
                             rerun=rerun_reason is not None, reason=rerun_reason)
    except LedgerError as exc:
        say(f"{exc}; nothing was run")
        return Result("unreachable", EXIT_LEDGER)
    if not claim.won:
        return _skipped(what, claim, job, settings)
    verb = "took over" if claim.attempt > 1 else "claimed"
    say(f"{what}: {verb} as attempt {claim.attempt}, fence {claim.fence}, owner "
        f"{settings.owner}", settings, level=VERBOSE if claim.attempt == 1 else NORMAL)
    return _run_claimed(ledger, job, period, claim, command, settings, sent)


def _skipped(what: str, claim: Claim, job: Job, settings: Settings) -> Result:
    if claim.skip_reason == "skipped-failed":
        say(f"{what}: skipped: failed {claim.attempt} times, no attempts left of "
            f"--max-attempts {job.max_attempts} (once rerun runs it again)", settings)
    elif claim.skip_reason == "skipped-done":
        say(f"{what}: skipped: done by attempt {claim.attempt}", settings, VERBOSE)
    else:
        age = f", heartbeat {claim.heartbeat_age:.1f}s ago" if claim.heartbeat_age else ""
        say(f"{what}: skipped: held by {claim.owner} (attempt {claim.attempt}{age})",
            settings, VERBOSE)
    return Result(claim.skip_reason, settings.skipped_exit_code)


def _run_claimed(ledger: Ledger, job: Job, period: Period, claim: Claim,
                 command: Sequence[str], settings: Settings, sent: float) -> Result:
    from once import runner  # not needed for a skip

    what = f"{job.name} {period.key} attempt {claim.attempt}"

    def renew() -> bool:
        try:
            return ledger.renew(job.name, period.key, claim.attempt)
        except LedgerError:
            ledger.close()  # the next renewal opens a fresh connection
            raise

    lease = runner.Lease(renew, job.stale_after, sent)
    outcome = runner.run(command, child_env(job, period, claim), lease,
                         settings.kill_after, settings.timeout)
    if outcome.kind == "fenced-out":
        why = "another attempt took it over" if lease.lost else (
            f"the ledger stayed unreachable past the deadline ({lease.last_error})")
        say(f"{what}: fenced out: {why}; the command was stopped and nothing was recorded")
        return Result("fenced-out", EXIT_FENCED_OUT)
    if outcome.kind == "exec-failed":
        say(f"cannot run {command[0]!r}: {outcome.message}")
    status = "done" if outcome.succeeded else "failed"
    result = outcome.kind if outcome.interrupted_by is None else "interrupted"
    recorded = _finish(ledger, job, period, claim, status, outcome.status, result, lease)
    if recorded is None:
        say(f"{what}: the ledger stayed unreachable, the result ({status}) was not recorded "
            f"({lease.last_error}); the period will be retried once its claim goes stale")
        return Result("unreachable", EXIT_LEDGER)
    if not recorded:
        say(f"{what}: fenced out: the final write matched no row (another attempt took it "
            f"over); nothing was recorded")
        return Result("fenced-out", EXIT_FENCED_OUT)
    if outcome.kind == "timed-out":
        say(f"{what}: timed out after --timeout {settings.timeout:g}s; recorded failed")
        return Result("timed-out", EXIT_TIMEOUT)
    say(f"{what}: {status} (exit {outcome.status})", settings, VERBOSE)
    return Result(status, outcome.status)


def _finish(ledger: Ledger, job: Job, period: Period, claim: Claim, status: str,
            exit_code: int, outcome: str, lease: Lease) -> bool | None:
    """Write the result, retrying on fresh connections until the lease's deadline.

    True: recorded. False: the row is no longer ours. None: the ledger stayed unreachable.
    """
    while True:
        # A renewal stuck in a hung server still holds the connection: wait for it, but no
        # longer than the deadline.
        if not lease.lock.acquire(timeout=max(0.0, lease.deadline - time.monotonic())):
            lease.last_error = lease.last_error or "a renewal did not return"
            return None
        try:
            return ledger.finish(job.name, period.key, claim.attempt,
                                 "done" if status == "done" else "failed", exit_code, outcome)
        except LedgerError as exc:
            lease.last_error = str(exc)
            ledger.close()
            if lease.expired:
                return None
        finally:
            lease.lock.release()
        time.sleep(min(1.0, max(0.0, lease.deadline - time.monotonic())))


# -- catch-up and rerun ----------------------------------------------------------------------


class NothingToResume(ValueError):
    """Catch-up without --since for a job that has no done period yet (a usage error)."""


def missing_periods(ledger: Ledger, job: Job, schedule: Schedule, since: Period | None,
                    until: Period) -> list[Period]:
    """The periods in [since, until] without a done row, oldest first.

    since defaults to the period after the job's latest done one.
    """
    if since is None:
        last = ledger.latest_done(job.name)
        if last is None:
            raise NothingToResume(f"job {job.name} has no done period yet: give --since")
        since = schedule.next(schedule.containing(last))
    if since.start > until.start:
        return []
    known = ledger.statuses(job.name, since.start, until.end)
    return [p for p in schedule.between(since, until) if known.get(p.key) != "done"]


class Progress:
    """How catch-up reports each period: one plain line per period (a terminal may do more)."""

    def start(self, total: int) -> None:
        pass

    def period(self, period: Period) -> None:
        pass

    def result(self, period: Period, result: Result, seconds: float) -> None:
        verb = {"done": "done", "failed": "failed", "timed-out": "timed out",
                "fenced-out": "fenced out"}.get(result.outcome, result.outcome)
        print(f"once: {period.key}: {verb} (exit {result.status}, {seconds:.1f}s)"
              if result.ran else f"once: {period.key}: {verb}", file=sys.stderr, flush=True)

    def stop(self) -> None:
        pass


def catch_up(ledger: Ledger, job: Job, periods: Sequence[Period], command: Sequence[str],
             settings: Settings, keep_going: bool = False,
             progress: Progress | None = None) -> int:
    """Run each period in order through the same claim as `once run`; return the status.

    Stops at the first failure with its status, unless keep_going: then every period is tried
    and the status is the first failure's (0 when none failed). A period held by a live owner
    is skipped and reported; the ledger unreachable ends it with 75.
    """
    progress = progress or Progress()
    first_failure = 0
    progress.start(len(periods))
    try:
        for period in periods:
            progress.period(period)
            began = time.monotonic()
            result = run_period(ledger, job, period, command, settings)
            progress.result(period, result, time.monotonic() - began)
            if result.ok:
                continue
            first_failure = first_failure or result.status or 1
            if not keep_going or result.outcome == "unreachable":
                break
    finally:
        progress.stop()
    return first_failure

"""What the reports know about a job (JobState, AttemptCounts) over its rows (once.ledger.rows'
RunRow), and the pure rules that read them: which rows are due, stale or failed out, a
timeline cell's state, an attempt's history entry, an output's last line.

No database and no output here: the standard library, once.periods and once.ledger's
from_db_time and rows only, so that the rules can be tested without a ledger.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, tzinfo
from typing import TYPE_CHECKING, Any

from once.ledger import from_db_time
from once.ledger.rows import JobRow, RunRow, TimelineRow
from once.outcomes import attempts_left
from once.periods import Period, Schedule, iso, utc_instant

if TYPE_CHECKING:
    from once.ledger.history import AttemptRow

LIST_LIMIT = 10  # findings (missing keys, failed periods) listed one by one per job and kind

NEVER = datetime.min.replace(tzinfo=UTC)

CRON_LAST = 60  # how many periods --timeline shows of a cron job by default (a unit's: its own)
MAX_LAST = 20_000


def rounded(value: float | None) -> float | None:
    """Seconds as the JSON outputs show them: to the millisecond."""
    return None if value is None else round(value, 3)


# A missing unit: a period (or, with --shards, one shard of it), as (its start, its key).
Unit = tuple[datetime, str]


@dataclass
class JobState(JobRow):
    """One job as the reports see it at `now`: its once_jobs row (shards: at least 1;
    no_overlap: its latest claim's --no-overlap) and what the survey worked out and read."""

    now: datetime
    sched: Schedule | None = None
    error: str = ""  # the stored schedule cannot be rebuilt here (an unknown zone, say)
    first: Period | None = None
    due_last: Period | None = None  # the latest due period; None: nothing is due yet
    current: Period | None = None  # the period `once run` claims now
    next: Period | None = None  # the one it claims next ...
    next_at: datetime | None = None  # ... from this instant on
    expected: int | None = 0  # due periods from the first on (None: cron, not counted)
    done_due: int = 0
    current_done: int = 0  # done rows of the current period (with --shards, of its shards)
    last_done: RunRow | None = None
    open_rows: list[RunRow] = field(default_factory=list)  # running and failed rows
    no_row: int = 0  # due periods without any row
    no_row_listed: list[Unit] = field(default_factory=list)  # the first LIST_LIMIT + 1
    no_row_last: Unit | None = None
    no_row_at_least: bool = False  # no_row is a lower bound (a cron job's huge gap)
    detailed: bool = False  # its latest done row, failures' lines, missing keys are read
    grace: float = 0.0  # once check --grace (seconds): also an attempt's leeway (overruns)
    # The last line of output of the failed rows listed (by period; None: nothing stored).
    failure_lines: dict[str, str | None] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.job

    @property
    def spec(self) -> str:
        return self.schedule

    @property
    def counted_end(self) -> datetime | None:
        """Where the count of missing periods ends: the due range's end, or with --no-overlap
        the end of a due period a live attempt holds (no claim could take a later period
        while it runs; once it ends they are missing until a catch-up makes them up)."""
        if self.due_last is None:
            return None
        end = utc_instant(self.due_last.end)
        if self.no_overlap:
            held = [r.period_end for r in self.running
                    if not self.is_stale(r) and r.period_end < end]
            end = min([end, *held])
        return end

    @property
    def schedule_text(self) -> str:
        return f"every {self.spec}" if self.kind == "every" else f"cron {self.spec}"

    @property
    def zone(self) -> tzinfo:
        return self.sched.tz if self.sched else UTC

    def due(self, row: RunRow) -> bool:
        return (self.first is not None and self.due_last is not None
                and utc_instant(self.first.start) <= row.period_start
                < utc_instant(self.due_last.end))

    def heartbeat_age(self, row: RunRow) -> float:
        return (self.now - row.heartbeat_at).total_seconds()

    def is_stale(self, row: RunRow) -> bool:
        """Judged by the row's own promise (its owner's --stale-after), as a takeover is."""
        return row.status == "running" and self.heartbeat_age(row) > row.stale_after

    def overruns(self, row: RunRow) -> bool:
        """A live attempt of a due period has run longer than the period lasts, plus --grace:
        a hung or slow run, which no heartbeat makes right. The attempt's own time decides,
        not the period's age: a rerun or a catch-up of an old period starts on time."""
        return (row.status == "running" and not self.is_stale(row) and self.due(row)
                and self.running_for(row) > self.overrun_after(row))

    def overrun_after(self, row: RunRow) -> float:
        """How long an attempt may run before it overruns: its period's length (a day of
        summer time's end, 25 hours; a cron period, to the next fire) plus --grace."""
        return (row.period_end - row.period_start).total_seconds() + self.grace

    def running_for(self, row: RunRow) -> float:
        return (self.now - row.started_at).total_seconds()

    @property
    def overrunning(self) -> list[RunRow]:
        return [r for r in self.running if self.overruns(r)]

    @property
    def running(self) -> list[RunRow]:
        return [r for r in self.open_rows if r.status == "running"]

    @property
    def failed(self) -> list[RunRow]:
        return [r for r in self.open_rows if r.status == "failed"]

    def attempts_left(self, row: RunRow) -> int:
        """The attempts a failed row has left (once.outcomes.attempts_left)."""
        return attempts_left(row.attempt, row.interrupted, self.max_attempts)

    def failed_out(self, row: RunRow) -> bool:
        return row.status == "failed" and self.attempts_left(row) == 0

    @property
    def listed_failures(self) -> list[RunRow]:
        """The failed rows a report lists: the first LIST_LIMIT and the latest failure."""
        failed = self.failed
        listed = failed[:LIST_LIMIT]
        latest = self.last_failure
        return [*listed, latest] if latest is not None and latest not in listed else listed

    @property
    def last_failure(self) -> RunRow | None:
        """The failed row that finished last."""
        return max(self.failed, key=lambda r: (r.finished_at or NEVER, r.period_start),
                   default=None)

    @property
    def current_state(self) -> str | None:
        """The period `once run` claims now: done, stale, failed, running or not-run (with
        --shards, the worst of its shards'); None without a schedule."""
        if self.current is None:
            return None
        if self.current_done >= self.shards:
            return "done"
        if not self.open_rows:  # most jobs of a fleet: nothing running, nothing failed
            return "not-run"
        start = utc_instant(self.current.start)
        rows = [r for r in self.open_rows if r.period_start == start]
        if any(self.is_stale(r) for r in rows):
            return "stale"
        for status in ("failed", "running"):
            if any(r.status == status for r in rows):
                return status
        return "not-run"

    @property
    def stale_due(self) -> list[RunRow]:
        if not self.open_rows:
            return []
        return [r for r in self.running if self.is_stale(r) and self.due(r)]

    @property
    def missing(self) -> int:
        """Due periods with no done row, no failed row and no live attempt."""
        return self.no_row + len(self.stale_due)

    def missing_keys(self, limit: int = LIST_LIMIT) -> list[str]:
        found = list(self.no_row_listed)
        found += [(r.period_start, r.period) for r in self.stale_due]
        return [key for _, key in sorted(found)[:limit]]

    @property
    def last_missing(self) -> str | None:
        """The latest missing key (a stale due row's or the last period without a row)."""
        candidates = [(r.period_start, r.period) for r in self.stale_due]
        if self.no_row_last is not None:
            candidates.append(self.no_row_last)
        return max(candidates)[1] if candidates else None


@dataclass
class AttemptCounts:
    """A job's attempts (once_attempts), as `once metrics` counts them."""

    by_status: dict[str, int] = field(default_factory=dict)
    later: int = 0  # attempts after the first without a rerun reason: retries, takeovers
    reruns: int = 0
    interrupted: int = 0  # attempts whose outcome is interrupted (a forwarded signal)

    @property
    def total(self) -> int:
        return sum(self.by_status.values())


def default_last(s: JobState) -> int:
    """How many periods `once status --timeline` shows when --last is not given: the period
    unit's record says (once.units; a spec is never parsed here again)."""
    unit = None if s.sched is None else s.sched.unit
    return CRON_LAST if unit is None else unit.last


def period_state(s: JobState, period: Period, rows: Sequence[TimelineRow]) -> str:
    """A timeline cell: the period's state from its once_runs rows (status, heartbeat_at,
    stale_after); with --shards, the worst of its shards' (a shard without a row is missing
    once the period is due)."""
    start = utc_instant(period.start)
    due = s.due_last is not None and start <= utc_instant(s.due_last.start)
    states = set()
    for row in rows:
        if row.status == "running":
            age = (s.now - from_db_time(row.heartbeat_at)).total_seconds()
            states.add("stale" if age > float(row.stale_after) else "running")
        else:
            states.add(str(row.status))
    if len(rows) < s.shards:
        states.add("missing" if due else "pending")
    if not rows and (s.first is None or start < utc_instant(s.first.start)):
        return "none"
    for state in ("stale", "failed", "missing", "running", "pending"):
        if state in states:
            return state
    return "done"


def last_line(output: str | None) -> str | None:
    """The last line the command wrote that says something: after the last newline (or
    carriage return: a progress bar's last state), trailing blank lines skipped; None when
    there is none."""
    if not output:
        return None
    for line in reversed(output.split("\n")):
        text = line.rstrip("\r").rsplit("\r", 1)[-1].strip()
        if text:
            return text
    return None


def attempt_entry(row: AttemptRow, holder: RunRow | None, now: datetime,
                  tz: tzinfo) -> dict[str, Any]:
    """An attempt (a once_attempts row with its output's end) as `once history --json` shows
    it; holder, the period's once_runs row, tells a live attempt from an abandoned one."""
    started = from_db_time(row.started_at)
    finished = from_db_time(row.finished_at) if row.finished_at is not None else None
    outcome = row.outcome
    if row.status == "running":
        if holder is not None and holder.attempt == row.attempt and holder.status == "running":
            age = (now - holder.heartbeat_at).total_seconds()
            outcome = "stale" if age > holder.stale_after else "running"
        else:
            outcome = "taken-over"  # a later attempt or a rerun took the row; never finished
    return {
        "job": row.job,
        "period": row.period,
        "attempt": row.attempt,
        "fence": row.fence,
        "owner": row.owner,
        "status": row.status,
        "outcome": outcome,
        "started_at": iso(started.astimezone(tz)),
        "finished_at": iso(finished.astimezone(tz)) if finished else None,
        "duration_s": rounded((finished - started).total_seconds()) if finished else None,
        "exit_code": row.exit_code,
        "reason": row.reason,
        # What a failed attempt said last (from the end of its stored output).
        "last_line": last_line(row.output_end) if row.status == "failed" else None,
    }

"""Catch-up's loop: each period that needs a run (once.run.flow.missing_periods), oldest first,
through the claim `once run` makes, and how it is reported as it goes; and `once run
--catchup N`, which makes up the periods before the current one first.

Progress here is the plain one (a pipe, cron, --log-format json): one `once:` line a period
that names the job, and a closing summary (`caught up 31 periods of JOB in 22s: 31 done`);
--quiet: none. A terminal's, with a bar and an ETA, is once.cli.progress's (rich), which
`once run --catchup` never loads. On the hot path only for `once run --catchup N`.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from once import outcomes
from once.ledger import Job, Ledger
from once.messages import NORMAL, say
from once.periods import Period, Schedule
from once.run.flow import Result, Settings, missing_periods, run_shards

# How a period's result is said in its line and counted in the summary.
VERBS = {"done": "done", "failed": "failed", "timed-out": "timed out",
         "fenced-out": "fenced out", "skipped-done": "done already",
         "skipped-held": "held by a live owner", "skipped-failed": "failed out",
         "skipped-overlap": "held back (--no-overlap)",
         # Result's word for a ledger that failed, reached or not: the `once:` line before
         # names which (a refusal is no outage).
         "unreachable": "ledger error"}


HELD_LISTED = 5  # keys of held periods a summary names


class Progress:
    """How catch-up reports each period: one line per period (naming the job), plain or JSON
    as the run's --log-format says, and a summary at the end (a terminal may do more)."""

    settings: Settings | None = None  # catch_up sets it: the log format, the verbosity

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet  # --quiet: no line at all
        self.job = ""
        self.total = 0
        self.counts: dict[str, int] = {}  # results so far, by verb
        self.seconds = 0.0  # spent in the periods so far
        self.began = time.monotonic()
        self.held: list[str] = []  # the keys of the periods a live owner held
        self.stopped_by = ""  # the stop signal that ended it (SIGTERM), if one did

    @property
    def tried(self) -> int:
        return sum(self.counts.values())

    def start(self, job: str, total: int) -> None:
        self.job, self.total, self.began = job, total, time.monotonic()

    def period(self, period: Period) -> None:
        pass

    def result(self, period: Period, result: Result, seconds: float) -> None:
        self.count(result, seconds, period)
        if not self.quiet:
            say(self.line(period, result, seconds), self.settings, NORMAL, "progress", "info")

    def count(self, result: Result, seconds: float, period: Period | None = None) -> None:
        verb = VERBS.get(result.outcome, result.outcome)
        self.counts[verb] = self.counts.get(verb, 0) + 1
        self.seconds += seconds
        if result.outcome == "skipped-held" and period is not None:
            self.held.append(period.key)

    def line(self, period: Period, result: Result, seconds: float) -> str:
        verb = VERBS.get(result.outcome, result.outcome)
        if result.ran:
            return f"{self.job} {period.key}: {verb} (exit {result.status}, {seconds:.1f}s)"
        return f"{self.job} {period.key}: {verb}"

    def eta(self) -> float | None:
        """Seconds the periods not yet tried should take, at the pace so far."""
        if not self.tried:
            return None
        return self.seconds / self.tried * (self.total - self.tried)

    def summary(self) -> str:
        """caught up 31 periods of JOB in 22s: 31 done; or, when one failed, it stopped or a
        live owner held one, catch-up of JOB: 9 of 31 periods in 7s: 8 done, 1 failed; 22
        not tried (; 1 held by a live owner: KEY); after a stop signal, catch-up of JOB:
        stopped by SIGTERM: 9 of 31 periods in 7s: 8 done, 1 failed; 22 left for the next
        fire."""
        held = VERBS["skipped-held"]
        counts = ", ".join(f"{n} {verb}" for verb, n in self.counts.items() if verb != held)
        spent = span(time.monotonic() - self.began)
        plural = "" if self.total == 1 else "s"
        left = self.total - self.tried
        if not left and not self.stopped_by and all(v in ("done", "done already")
                                                    for v in self.counts):
            return f"caught up {self.total} period{plural} of {self.job} in {spent}: {counts}"
        keys = ", ".join(self.held[:HELD_LISTED]) + (", ..." if len(self.held) > HELD_LISTED
                                                     else "")
        stopped = f"stopped by {self.stopped_by}: " if self.stopped_by else ""
        return (f"catch-up of {self.job}: {stopped}{self.tried} of {self.total} "
                f"period{plural} in {spent}: {counts or 'none run'}"
                + (f"; {left} {'left for the next fire' if stopped else 'not tried'}"
                   if left else "")
                + (f"; {self.counts[held]} {held}" if held in self.counts else "")
                + (f": {keys}" if keys else ""))

    def stop(self) -> None:
        if self.quiet or not self.total:
            return
        if self.settings is not None:
            self.settings.context = {"job": self.job}  # no period's: it is about them all
        say(self.summary(), self.settings, NORMAL, "summary", "info")


def span(seconds: float) -> str:
    """A duration in a catch-up's lines: 0.7s, 22s, 3m12s, 1h05m."""
    if seconds < 10:
        return f"{seconds:.1f}s"
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def catch_up_then_run(ledger: Ledger, job: Job, schedule: Schedule, period: Period,
                      command: Sequence[str], settings: Settings, catchup: int,
                      all_shards: bool = False) -> int:
    """`once run --catchup N`: make up the periods among the N before `period` that need a
    run (from the job's first on; a failure there is the status), then claim `period`; both
    with the same settings (--require-same-command refuses in either)."""
    missed = missing_periods(ledger, job, schedule, schedule.shifted(period, -catchup),
                             schedule.previous(period), from_first=True, held=True)
    status = catch_up(ledger, job, missed, command, settings)
    if status:
        return status
    return run_shards(ledger, job, period, command, settings, all_shards).status


def catch_up(ledger: Ledger, job: Job, periods: Sequence[Period], command: Sequence[str],
             settings: Settings, keep_going: bool = False,
             progress: Progress | None = None) -> int:
    """Run each period in order through the same claim as `once run`; return the status.

    Stops at the first failure with its status, unless keep_going: then every period is tried
    and the status is the first failure's (0 when none failed). A period held by a live owner
    is skipped and reported; the ledger unreachable ends it with 75. A stop signal (SIGTERM,
    SIGINT, SIGHUP) ends it after the period in hand, which it is forwarded to: the status
    is then the first failure's that it did not interrupt, else 128+N.
    """
    from once.run.keeper import Keeper
    from once.run.stops import Stop, signal_name

    progress = progress or Progress()
    progress.settings = settings
    first_failure = 0
    progress.start(job.name, len(periods))
    # One guard for the periods (once.run.keeper); a lone period forks its own, as `once run`
    # does, rather than pay for starting one (about 30 ms).
    settings.keeper = Keeper() if len(periods) > 1 else None
    settings.results_said = True  # each period's line says it (under -q, flow's failure line)
    with Stop().caught() as stop:
        settings.stop = stop
        try:
            for period in periods:
                if stop.signal is not None:
                    break  # no period is claimed after a stop signal
                progress.period(period)
                began = time.monotonic()
                result = run_shards(ledger, job, period, command, settings, all_shards=True)
                progress.result(period, result, time.monotonic() - began)
                if result.outcome == "skipped-overlap":
                    break  # in order: no later period either while that attempt lives
                if result.ok or result.interrupted:
                    continue
                first_failure = first_failure or result.status or 1
                if not keep_going or result.outcome in outcomes.UNCLAIMED:
                    break
        finally:
            if settings.keeper is not None:
                settings.keeper.close()
            settings.keeper = settings.stop = None
            progress.stopped_by = signal_name(stop.signal) if stop.signal else ""
            progress.stop()
    return first_failure or (128 + stop.signal if stop.signal else 0)

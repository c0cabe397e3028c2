"""Run and catch-up, composed from the period engine, the ledger and the runner.

This is what `once run` does and what a Python job imports; the CLI is a thin layer over it.
Nothing here imports SQLAlchemy or rich: it is the hot path of every cron fire.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from once.deadlines import lease_now
from once.ledger import Claim, CommandDrift, Job, Ledger, LedgerError
from once.limits import OUTPUT_TAIL
from once.periods import Period, Schedule, iso

if TYPE_CHECKING:
    from once.notify import Notifier
    from once.runner import Lease

# Exit statuses of `once run` that are not the child's own (README "Exit status").
EXIT_USAGE = 2
EXIT_FENCED_OUT = 70
EXIT_LEDGER = 75
EXIT_TIMEOUT = 124

QUIET, NORMAL, VERBOSE = 0, 1, 2  # -q, the default, -v
ERROR = QUIET  # a message at this level is shown even with -q: "log only errors"
_JSON_LEVELS = {ERROR: "error", NORMAL: "warning", VERBOSE: "info"}

# --max-clock-skew: the period comes from this host's clock (the one cron fired by), so a
# claim is refused when a server's clock disagrees with it by more than this (seconds).
DEFAULT_MAX_CLOCK_SKEW = 60.0


@dataclass
class Settings:
    """How `once run` runs a claimed period."""

    kill_after: float = 10.0
    timeout: float | None = None
    skipped_exit_code: int = 0
    owner: str = ""
    verbosity: int = NORMAL
    state: bool = False  # --state: hand the job's watermark to the command and take it back
    command_hash: str | None = None  # what ran, for drift reports and --require-same-command
    require_same_command: bool = False  # refuse (exit 2) when the latest attempt ran another
    max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW  # refuse (exit 75) a host clock this far off
    notifier: Notifier | None = None  # --ping and --on-* hooks
    output_tail: int = OUTPUT_TAIL  # bytes of the command's output kept in the ledger (0: off)
    log_format: str = "text"  # or "json": one object a line, for log shippers
    context: dict[str, object] = field(default_factory=dict)  # job, period, attempt: for logs

    def __post_init__(self) -> None:
        if not self.owner:
            self.owner = default_owner()


def statement_timeout(stale_after: float) -> float:
    """How long one ledger statement or connect may take: well below --stale-after, so that
    nothing hangs past a lease's deadline, and never under a second or over ten."""
    return max(1.0, min(10.0, stale_after / 3))


def default_owner() -> str:
    """ONCE_OWNER (a pod name, say), else host name and process id. A bad ONCE_OWNER is an
    InputError (once.limits.owner), never stored."""
    from once.limits import owner

    given = os.environ.get("ONCE_OWNER")
    return owner(given) if given else f"{os.uname().nodename}:{os.getpid()}"


def say(message: str, settings: Settings | None = None, level: int = NORMAL,
        event: str = "message", json_level: str | None = None) -> None:
    """One `once:` line on stderr (or one JSON object, --log-format json), unless the
    verbosity is below its level (ERROR: always). json_level overrides the record's level,
    which is otherwise error, warning or info by `level`."""
    verbosity = settings.verbosity if settings else NORMAL
    if verbosity < level:
        return
    if settings is None or settings.log_format != "json":
        from once.escape import shown  # an owner or a reason may hold control characters

        print(f"once: {shown(message)}", file=sys.stderr, flush=True)
        return
    import json

    record = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"),
              "level": json_level or _JSON_LEVELS.get(level, "info"), "event": event,
              **settings.context, "owner": settings.owner, "message": message}
    print(json.dumps(record), file=sys.stderr, flush=True)


def current_period(schedule: Schedule, lag: int = 0, now: datetime | None = None) -> Period:
    """The period `once run` claims now: the one containing now, `lag` periods back."""
    period = schedule.containing(now or datetime.now(UTC))
    return schedule.shifted(period, -lag) if lag else period


# Every name `once` gives the command or a hook (README "The command's environment"). None
# is a variable `once` reads (ONCE_TZ, read as --tz, is given as ONCE_PERIOD_TZ), and each is
# dropped from what the command inherits before this run's own are set: a `once` that the
# command or a hook starts behaves as it does when cron starts it, and never sees an outer
# run's shard, watermark file or attempt as its own.
EXPORTED = ("ONCE_JOB", "ONCE_PERIOD", "ONCE_PERIOD_START", "ONCE_PERIOD_END",
            "ONCE_PERIOD_TZ", "ONCE_ATTEMPT", "ONCE_FENCE", "ONCE_STATE", "ONCE_STATE_OUT",
            "ONCE_SHARD", "ONCE_SHARDS", "ONCE_OUTCOME", "ONCE_STATUS", "ONCE_OUTPUT_FILE")


def refuse_future(period: Period, option: str, now: datetime | None = None) -> None:
    """A usage error for a period that has not begun: run ahead of time, it would be marked
    done and the real fire in it would skip (catchup --until, rerun --period)."""
    if period.start.astimezone(UTC) > (now or datetime.now(UTC)):
        from once.limits import InputError

        raise InputError(f"{option} {period.key} has not begun (it starts "
                         f"{iso(period.start)}): its real fire would then skip; "
                         f"--allow-future runs it anyway")


def child_env(job: Job, period: Period, claim: Claim | None, shard: int | None = None,
              claimed: bool = True) -> dict[str, str]:
    """The command's environment (README "The command's environment"); a skip's hooks get
    it without the attempt."""
    env = {name: value for name, value in os.environ.items() if name not in EXPORTED}
    env.update({
        "ONCE_JOB": job.name,
        "ONCE_PERIOD": period.key,
        "ONCE_PERIOD_START": iso(period.start),
        "ONCE_PERIOD_END": iso(period.end),
        "ONCE_PERIOD_TZ": job.tz,
    })
    if claimed and claim is not None:
        env.update({"ONCE_ATTEMPT": str(claim.attempt), "ONCE_FENCE": str(claim.fence)})
    if shard is not None:
        env.update({"ONCE_SHARD": str(shard), "ONCE_SHARDS": str(job.shards)})
    return env


@dataclass(frozen=True)
class Result:
    """What became of one period: its outcome (ONCE_OUTCOME's words) and once's exit status."""

    outcome: str  # done, failed, timed-out, fenced-out, skipped-*, unreachable
    status: int
    output: bytes | None = None  # the tail of the command's output (None: not captured)

    @property
    def ran(self) -> bool:
        return not self.outcome.startswith("skipped")

    @property
    def ok(self) -> bool:
        return self.outcome in ("done", "skipped-done", "skipped-held", "skipped-failed")


def command_hash(command: Sequence[str], version_tag: str | None = None) -> str:
    """A fingerprint of the command line (and --version-tag), to notice drift between hosts.

    CRC-32, not a security measure: zlib costs a tenth of hashlib's import on every fire.
    """
    import zlib

    text = "\0".join([*command, version_tag or ""])
    return f"{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}"


def shard_key(period: Period, shard: int | None) -> str:
    """The ledger key of a period, or of one shard of it (`KEY#i`)."""
    return period.key if shard is None else f"{period.key}#{shard}"


def run_period(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
               settings: Settings, rerun_reason: str | None = None,
               shard: int | None = None, notify_skip: bool = True) -> Result:
    """Claim one period (or one shard of it) and, if won, run command for it."""
    key = shard_key(period, shard)
    what = f"{job.name} {key}"
    settings.context = {"job": job.name, "period": key}
    sent = lease_now()
    try:
        claim = ledger.claim(job, key, period.start, period.end, settings.owner,
                             rerun=rerun_reason is not None, reason=rerun_reason,
                             command_hash=settings.command_hash,
                             require_same_command=settings.require_same_command,
                             max_clock_skew=settings.max_clock_skew)
    except LedgerError as exc:
        say(f"{exc}; nothing was run", settings, ERROR, "unreachable")
        return Result("unreachable", EXIT_LEDGER)
    except CommandDrift as exc:
        say(f"{exc}; nothing was run", settings, ERROR, "command-drift")
        return Result("command-drift", EXIT_USAGE)
    if not claim.won:
        result = _skipped(what, claim, job, settings)
        if notify_skip:
            _notify(settings, result, child_env(job, period, claim, shard, claimed=False))
        return result
    verb = "took over" if claim.attempt > 1 else "claimed"
    settings.context.update(attempt=claim.attempt, fence=claim.fence)
    say(f"{what}: {verb} as attempt {claim.attempt}, fence {claim.fence}, owner "
        f"{settings.owner}", settings, level=VERBOSE if claim.attempt == 1 else NORMAL,
        event=verb.replace(" ", "-"))
    try:
        result = _run_claimed(ledger, job, period, key, shard, claim, command, settings, sent)
    finally:
        ledger.release(job.name, key)  # the command has ended: no longer a live owner
    _notify(settings, result, child_env(job, period, claim, shard))
    return result


def _notify(settings: Settings, result: Result, env: dict[str, str]) -> None:
    """Pings and hooks; not for `unreachable`, where the missing success ping is the alarm,
    nor for a refused command drift (a usage error: nothing was claimed)."""
    if settings.notifier is not None and result.outcome not in ("unreachable",
                                                                  "command-drift"):
        def log(message: str, event: str) -> None:
            say(message, settings, ERROR, event)

        settings.notifier.finished(result.outcome, result.status, env, log, result.output)


def run_shards(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
               settings: Settings, all_shards: bool = False) -> Result:
    """Claim the lowest shard of period that can be claimed, and run it.

    With all_shards, keep claiming until no shard is left; the result is the first
    failure's, else the last shard's. A shard's skip is not the run's: when no shard ran,
    one skip is told to pings and hooks (failed out before held before done).
    """
    if job.shards == 1:
        return run_period(ledger, job, period, command, settings)
    last: Result | None = None
    failure: Result | None = None
    skips: set[str] = set()
    for shard in range(job.shards):
        result = run_period(ledger, job, period, command, settings, shard=shard,
                            notify_skip=False)
        if result.outcome in ("unreachable", "command-drift"):
            return result
        if not result.ran:
            skips.add(result.outcome)
            continue
        last = result
        failure = failure or (None if result.ok else result)
        if not all_shards:
            break
    if last is None:
        outcome = next((o for o in ("skipped-failed", "skipped-held") if o in skips),
                       "skipped-done")
        last = Result(outcome, settings.skipped_exit_code)
        _notify(settings, last, child_env(job, period, None, claimed=False))
    return failure or last


def _skipped(what: str, claim: Claim, job: Job, settings: Settings) -> Result:
    if claim.skip_reason == "skipped-failed":
        say(f"{what}: skipped: failed {claim.attempt} times, no attempts left of "
            f"--max-attempts {job.max_attempts} (once rerun runs it again)", settings,
            event=claim.skip_reason)
    elif claim.skip_reason == "skipped-done":
        say(f"{what}: skipped: done by attempt {claim.attempt}", settings, VERBOSE,
            claim.skip_reason)
    else:
        age = f", heartbeat {claim.heartbeat_age:.1f}s ago" if claim.heartbeat_age else ""
        promise = (f", stale after {claim.stale_after:g}s" if claim.stale_after is not None
                   else "")
        say(f"{what}: skipped: held by {claim.owner} (attempt {claim.attempt}{age}{promise})",
            settings, VERBOSE, claim.skip_reason)
    return Result(claim.skip_reason, settings.skipped_exit_code)


def _run_claimed(ledger: Ledger, job: Job, period: Period, key: str, shard: int | None,
                 claim: Claim, command: Sequence[str], settings: Settings,
                 sent: float) -> Result:
    from once import runner  # not needed for a skip

    what = f"{job.name} {key} attempt {claim.attempt}"

    def renew() -> bool:
        try:
            return ledger.renew(job.name, key, claim.attempt)
        except LedgerError:
            ledger.close()  # the next renewal opens a fresh connection
            raise

    lease = runner.Lease(renew, job.stale_after, sent)
    env = child_env(job, period, claim, shard)
    with StateFile(settings.state) as state:
        if settings.state:
            env.update({"ONCE_STATE": claim.state or "", "ONCE_STATE_OUT": state.path})
        on_start = settings.notifier.started if settings.notifier is not None else None
        outcome = runner.run(command, env, lease, settings.kill_after, settings.timeout,
                             on_start, settings.output_tail)
        if lease.stranded:  # closing or reusing that connection can crash (SQLite: SIGSEGV)
            ledger.abandon()
        new_state, state_error = state.read() if outcome.succeeded else (None, "")
    if outcome.kind == "fenced-out":
        why = "another attempt took it over" if lease.lost else (
            f"the ledger stayed unreachable past the deadline ({lease.last_error})")
        say(f"{what}: fenced out: {why}; the command was stopped and nothing was recorded",
            settings, ERROR, "fenced-out")
        if lease.lost and not lease.stranded:  # the ledger answers: keep what it said
            keep_output(ledger, job, key, claim, outcome.output, lease)
        return Result("fenced-out", EXIT_FENCED_OUT, outcome.output)
    if outcome.kind == "exec-failed":
        say(f"cannot run {command[0]!r}: {outcome.message}", settings, ERROR, "exec-failed")
    if outcome.kind == "guard-died":  # the group is dead: the failure may be retried at once
        say(f"{what}: {outcome.message}; recorded failed", settings, ERROR, "guard-died")
    if state_error:
        say(f"{what}: {state_error}; recorded failed", settings, ERROR, "bad-state")
    status = "done" if outcome.succeeded and not state_error else "failed"
    # The history's outcome says more than the status where there is more to say.
    result: str = {"timed-out": "timed-out", "exec-failed": "exec-failed",
                   "guard-died": "guard-died"}.get(outcome.kind, status)
    if outcome.interrupted_by is not None:
        result = "interrupted"
    if state_error:
        result = "bad-state"
    recorded = record_result(ledger, job, key, claim, status, outcome.status, result, lease,
                             new_state, outcome.output)
    output = outcome.output
    if recorded is None:
        say(f"{what}: the ledger stayed unreachable, the result ({status}) was not recorded "
            f"({lease.last_error}); the period will be retried once its claim goes stale",
            settings, ERROR, "unreachable")
        return Result("unreachable", EXIT_LEDGER, output)
    if not recorded:
        why = "another attempt took it over"
        if new_state is not None and ledger.state(job.name)[1] != claim.state_version:
            why = "the job's watermark moved while the command ran"
        say(f"{what}: fenced out: the final write matched no row ({why}); nothing was "
            f"recorded", settings, ERROR, "fenced-out")
        keep_output(ledger, job, key, claim, output, lease)
        return Result("fenced-out", EXIT_FENCED_OUT, output)
    if outcome.kind == "timed-out":
        say(f"{what}: timed out after --timeout {settings.timeout:g}s; recorded failed",
            settings, ERROR, "timed-out")
        return Result("timed-out", EXIT_TIMEOUT, output)
    if outcome.interrupted_by is not None:  # a pod's SIGTERM: the log must say why it ended
        say(f"{what}: {_signal_name(outcome.interrupted_by)} received and forwarded to the "
            f"command, which ended with status {outcome.status}; recorded failed", settings,
            ERROR, "interrupted")
    say(f"{what}: {status} (exit {outcome.status})", settings, VERBOSE, status)
    if status == "failed" and outcome.status == 0:
        return Result("failed", 1, output)
    return Result(status, outcome.status, output)


def keep_output(ledger: Ledger, job: Job, key: str, claim: Claim, output: bytes | None,
                lease: Lease) -> None:
    """A fenced-out attempt's output, into its own attempt row (`once logs` shows what it
    said before it was stopped): best effort, one bounded statement, never an error."""
    if output is None:
        return
    from once.relay import text
    from once.runner import NoAnswer

    try:
        lease.call(lambda: ledger.keep_output(job.name, key, claim.attempt, text(output)),
                   until=lease.now())
    except NoAnswer:
        ledger.abandon()  # the statement still waits on the connection: never close it
    except LedgerError:
        pass


def _signal_name(number: int) -> str:
    import signal

    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


# How long a final write is retried past the lease's deadline: --stale-after, at least 30 s
# and at most 10 minutes. The write is fenced (it names our attempt and a running row), so
# trying longer is safe: until another attempt takes the row over, a write that lands records
# what really happened and the period is not run again; after a takeover it matches no row.
FINISH_GRACE_MIN, FINISH_GRACE_MAX = 30.0, 600.0


def finish_grace(stale_after: float) -> float:
    return max(FINISH_GRACE_MIN, min(FINISH_GRACE_MAX, stale_after))


def record_result(ledger: Ledger, job: Job, key: str, claim: Claim, status: str,
                  exit_code: int, outcome: str, lease: Lease,
                  new_state: str | None = None, output: bytes | None = None) -> bool | None:
    """Write the result, retrying on fresh connections until the lease's deadline plus
    finish_grace (a statement that gets no answer is left behind on its connection).
    output, the tail of the command's output, goes into the same write.

    True: recorded (now, or by an earlier try whose answer was lost). False: the row is no
    longer ours. None: the ledger stayed unreachable, or refused the statement.
    """
    from once.relay import text
    from once.runner import NoAnswer

    stored = text(output) if output is not None else None
    give_up = lease.deadline + finish_grace(job.stale_after)
    while True:
        try:
            # Waits for a renewal in flight, and gives up on a server that stopped answering.
            return lease.call(lambda: ledger.finish(
                job.name, key, claim.attempt, "done" if status == "done" else "failed",
                exit_code, outcome, new_state if status == "done" else None,
                claim.state_version, stored), until=give_up)
        except NoAnswer as exc:
            lease.last_error = str(exc)
            ledger.abandon()  # the statement still waits on the connection: never close it
        except LedgerError as exc:
            lease.last_error = str(exc)
            ledger.close()
            if not exc.transient:  # a refused statement stays refused
                return None
        left = give_up - lease.now()
        if left <= 0:
            return None
        time.sleep(min(1.0, left))


class StateFile:
    """ONCE_STATE_OUT: a path in a private directory where the command may leave a new
    watermark. No file means no change; one trailing newline is dropped; at most 64 KiB of
    UTF-8, else the run fails."""

    def __init__(self, wanted: bool) -> None:
        self.wanted = wanted  # without --state: no directory, and read() finds nothing
        self.directory = ""
        self.path = ""

    def __enter__(self) -> StateFile:
        if self.wanted:
            import tempfile

            self.directory = tempfile.mkdtemp(prefix="once-state-")
            self.path = os.path.join(self.directory, "state")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.directory:
            import shutil

            shutil.rmtree(self.directory, ignore_errors=True)

    def read(self) -> tuple[str | None, str]:
        """(the new watermark or None for no change, an error message or '')."""
        from once.limits import STATE_LIMIT

        if not self.wanted:
            return None, ""
        try:
            with open(self.path, "rb") as handle:
                data = handle.read(STATE_LIMIT + 2)
        except FileNotFoundError:
            return None, ""
        except OSError as exc:
            return None, f"cannot read ONCE_STATE_OUT: {exc.strerror}"
        if data.endswith(b"\n"):
            data = data[:-1]
        if len(data) > STATE_LIMIT:
            return None, "the new state written to ONCE_STATE_OUT is over 64 KiB"
        if b"\0" in data:  # PostgreSQL's text cannot hold it: refused on every backend
            return None, "the new state written to ONCE_STATE_OUT holds a NUL byte"
        try:
            return data.decode("utf-8"), ""
        except UnicodeDecodeError:
            return None, "the new state written to ONCE_STATE_OUT is not UTF-8"


# -- catch-up and rerun ----------------------------------------------------------------------


class NothingToResume(ValueError):
    """Catch-up without --since for a job that has never run (a usage error)."""


def missing_periods(ledger: Ledger, job: Job, schedule: Schedule, since: Period | None,
                    until: Period, limit: int | None = None,
                    from_first: bool = False) -> list[Period]:
    """The periods in [since, until] that need a run, oldest first, at most limit: a period
    with a unit (a shard) that has no row, or a running row past its owner's promise, or a
    failed row with attempts left (once.gaps.needs_run). The same gap finder as `once check`.

    since defaults to the job's first period (raises NothingToResume for a job that has never
    run); from_first: never look before it (`once run --catchup`: a first run has nothing to
    make up).
    """
    import heapq

    from once import gaps  # not on the hot path of a plain `once run`

    first, latest = ledger.job_span(job.name)
    if first is None:
        if from_first:
            return []
        if since is None:
            raise NothingToResume(f"job {job.name} has never run: give --since")
    elif since is None or from_first:
        first_period = schedule.containing(first)
        if since is None or _utc(since.start) < _utc(first_period.start):
            since = first_period
    assert since is not None
    lo, hi = _utc(since.start), _utc(until.end)
    if lo > _utc(until.start):
        return []
    rows = [gaps.OpenRow(*row) for row in ledger.open_rows(job.name, lo, hi)]
    finder = gaps.GapFinder(schedule, job.shards, ledger.rows(job.name),
                            [(r.start, r.key) for r in rows], latest)
    # Both streams are in order of period start; a period may come from both, or several times.
    made_up = ((r.start, schedule.containing(r.start)) for r in rows
               if gaps.needs_run(r, job.max_attempts))
    rowless = ((_utc(period.start), period) for period, _ in finder.units(lo, hi))
    found: list[Period] = []
    for start, period in heapq.merge(made_up, rowless, key=lambda pair: pair[0]):
        if found and _utc(found[-1].start) == start:
            continue
        if limit is not None and len(found) >= limit:
            break
        found.append(period)
    return found


def _utc(instant: datetime) -> datetime:
    return instant.astimezone(UTC)


class Progress:
    """How catch-up reports each period: one line per period, plain or JSON as the run's
    --log-format says (a terminal may do more)."""

    settings: Settings | None = None  # catch_up sets it: the log format, the verbosity

    def start(self, total: int) -> None:
        pass

    def period(self, period: Period) -> None:
        pass

    def result(self, period: Period, result: Result, seconds: float) -> None:
        verb = {"done": "done", "failed": "failed", "timed-out": "timed out",
                "fenced-out": "fenced out"}.get(result.outcome, result.outcome)
        say(f"{period.key}: {verb} (exit {result.status}, {seconds:.1f}s)" if result.ran
            else f"{period.key}: {verb}", self.settings, NORMAL, "progress", "info")

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
    progress.settings = settings
    first_failure = 0
    progress.start(len(periods))
    try:
        for period in periods:
            progress.period(period)
            began = time.monotonic()
            result = run_shards(ledger, job, period, command, settings, all_shards=True)
            progress.result(period, result, time.monotonic() - began)
            if result.ok:
                continue
            first_failure = first_failure or result.status or 1
            if not keep_going or result.outcome in ("unreachable", "command-drift"):
                break
    finally:
        progress.stop()
    return first_failure

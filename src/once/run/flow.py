"""Run and catch-up, composed from the period engine, the ledger, the lease and the wrapper
(catch-up's loop over the periods it finds, and how it reports them, is once.run.backfill's,
which builds on this module: never the reverse).

This is what `once run` does and what a Python job imports; the CLI is a thin layer over it.
What the command is handed is once.run.child's, what an attempt writes once its command has ended
once.run.attempt's, the words of every outcome once.outcomes'. Nothing here imports SQLAlchemy or
rich: it is the hot path of every cron fire (the wrapper and the lease only once a claim is won).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from once import outcomes
from once.deadlines import lease_now
from once.frozen import Frozen
from once.ledger import Claim, CommandDrift, Job, Ledger, LedgerError
from once.limits import OUTPUT_TAIL
from once.messages import ERROR, NORMAL, VERBOSE, say
from once.periods import Period, Schedule, iso, utc_instant
from once.run import skips
from once.run.child import StateFile, child_env
from once.stored import shard_key

if TYPE_CHECKING:
    from once.run.keeper import Keeper
    from once.run.lease import Lease
    from once.run.notify import Notifier
    from once.run.stops import Stop
    from once.run.wrapper import Outcome

# Exit statuses of `once run` that are not the child's own (docs/reference/exit-status.md).
EXIT_USAGE = 2
EXIT_REFUSED = 69  # once rerun: a live attempt holds the way
EXIT_FENCED_OUT = 70
EXIT_LEDGER = 75
EXIT_TIMEOUT = 124

# --max-clock-skew: the period comes from this host's clock (the one cron fired by), so a
# claim is refused when a server's clock disagrees with it by more than this (seconds).
DEFAULT_MAX_CLOCK_SKEW = 60.0


class Settings:
    """How `once run` runs a claimed period (a plain class: a dataclass costs every fire its
    import and compiled methods, see once.frozen)."""

    def __init__(self, kill_after: float = 10.0, timeout: float | None = None,
                 skipped_exit_code: int = 0, owner: str = "", verbosity: int = NORMAL,
                 state: bool = False, command_hash: str | None = None,
                 require_same_command: bool = False,
                 max_clock_skew: float = DEFAULT_MAX_CLOCK_SKEW,
                 notifier: Notifier | None = None, output_tail: int = OUTPUT_TAIL,
                 log_format: str = "text", context: dict[str, object] | None = None) -> None:
        self.kill_after = kill_after
        self.timeout = timeout
        self.skipped_exit_code = skipped_exit_code
        self.owner = owner or default_owner()
        self.verbosity = verbosity
        self.state = state  # --state: hand the job's watermark to the command and take it back
        self.command_hash = command_hash  # what ran: drift reports, --require-same-command
        self.require_same_command = require_same_command  # refuse (exit 2) another command
        self.max_clock_skew = max_clock_skew  # refuse (exit 75) a host clock this far off
        self.notifier = notifier  # --ping and --on-* hooks
        self.output_tail = output_tail  # bytes of the command's output kept (0: off)
        self.log_format = log_format  # or "json": one object a line, for log shippers
        self.context = {} if context is None else context  # job, period, attempt: for logs
        self.keeper: Keeper | None = None  # catch-up's guard for all its periods (backfill)
        # A catch-up's own lines say each period's result (backfill), but not under -q.
        self.results_said = False
        self.stop: Stop | None = None  # catch-up's and --all-shards' stop signal (run_shards)


def default_owner() -> str:
    """ONCE_OWNER (a pod name, say), else host name and process id. A bad ONCE_OWNER is an
    InputError (once.limits.owner), never stored."""
    from once.limits import owner

    given = os.environ.get("ONCE_OWNER")
    return owner(given) if given else f"{os.uname().nodename}:{os.getpid()}"


def claiming_job(name: str, namespace: str | None, schedule: Schedule, lag: int,
                 max_attempts: int, stale_after: float, shards: int = 1,
                 no_overlap: bool = False) -> Job:
    """The job a claiming command (or once.claim) works on, every limit checked (once.limits:
    an InputError) before anything is sent; ONCE_OWNER too, so that a bad one claims
    nothing."""
    from once import limits

    stored = limits.stored_name(name, namespace)
    limits.schedule(schedule.spec, schedule.tz_name)
    limits.job(lag, max_attempts, stale_after, shards)
    default_owner()
    return Job(stored, schedule.kind, schedule.spec, schedule.tz_name, lag, max_attempts,
               float(stale_after), shards, no_overlap)


def current_period(schedule: Schedule, lag: int = 0, now: datetime | None = None) -> Period:
    """The period `once run` claims now: the one containing now, `lag` periods back."""
    period = schedule.containing(now or datetime.now(UTC))
    return schedule.shifted(period, -lag) if lag else period


def refuse_future(period: Period, option: str, now: datetime | None = None) -> None:
    """A usage error for a period that has not begun: run ahead of time, it would be marked
    done and the real fire in it would skip (catchup --until, rerun --period)."""
    if period.start.astimezone(UTC) > (now or datetime.now(UTC)):
        from once.limits import InputError

        raise InputError(f"{option} {period.key} has not begun (it starts "
                         f"{iso(period.start)}): its real fire would then skip; "
                         f"--allow-future runs it anyway")


class Result(Frozen):
    """What became of one period: its outcome (ONCE_OUTCOME's words) and once's exit status."""

    outcome: outcomes.Result
    status: int
    output: bytes | None  # the tail of the command's output (None: not captured)
    interrupted: bool  # a stop signal once forwarded ended it (or kept it from starting)

    def __init__(self, outcome: outcomes.Result, status: int, output: bytes | None = None,
                 interrupted: bool = False) -> None:
        self._set(outcome=outcome, status=status, output=output, interrupted=interrupted)

    @property
    def ran(self) -> bool:
        return self.outcome not in outcomes.SKIPS

    @property
    def ok(self) -> bool:
        return self.outcome in outcomes.OK


def command_hash(command: Sequence[str], version_tag: str | None = None) -> str:
    """A fingerprint of the command line and --version-tag, to notice drift between hosts:
    CRC-32, no security measure (zlib costs a tenth of hashlib's import on every fire)."""
    import zlib

    text = "\0".join([*command, version_tag or ""])
    return f"{zlib.crc32(text.encode('utf-8', 'surrogateescape')):08x}"


def run_period(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
               settings: Settings, rerun_reason: str | None = None,
               shard: int | None = None, notify_skip: bool = True) -> Result:
    """Claim one period (or one shard of it) and, if won, run command for it."""
    from once.run.stops import held_back

    with held_back(settings):
        result, claim = _claim_and_run(ledger, job, period, command, settings, rerun_reason,
                                       shard)
    if claim is not None and (claim.won or notify_skip):
        _notify(settings, result, job, period, claim, shard, claimed=claim.won)
    return result


def _claim_and_run(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
                   settings: Settings, rerun_reason: str | None,
                   shard: int | None) -> tuple[Result, Claim | None]:
    """The claim, and if won the command's run and its record: the result, and the claim
    (None where none was made: the ledger failed, the command drifted)."""
    key = shard_key(period.key, shard)
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
        return Result("unreachable", EXIT_LEDGER), None
    except CommandDrift as exc:
        say(f"{exc}; nothing was run", settings, ERROR, "command-drift")
        return Result("command-drift", EXIT_USAGE), None
    if not claim.won:
        return _skipped(what, claim, job, settings, rerun_reason is not None), claim
    verb = "took over" if claim.attempt > 1 else "claimed"
    settings.context.update(attempt=claim.attempt, fence=claim.fence)
    say(f"{what}: {verb} as attempt {claim.attempt}, fence {claim.fence}, owner "
        f"{settings.owner}", settings, level=VERBOSE if claim.attempt == 1 else NORMAL,
        event=verb.replace(" ", "-"))
    try:
        result = _run_claimed(ledger, job, period, key, shard, claim, command, settings,
                              max(sent, ledger.claim_sent))
    finally:
        ledger.release(job.name, key)  # the command has ended: no longer a live owner
    return result, claim


def _notify(settings: Settings, result: Result, job: Job, period: Period, claim: Claim | None,
            shard: int | None = None, claimed: bool = True) -> None:
    """Pings and hooks, with the command's environment (a skip's without the attempt); not
    for `unreachable`, where the missing success ping is the alarm, nor for a refused
    command drift (a usage error: nothing was claimed)."""
    if settings.notifier is not None and result.outcome not in outcomes.UNCLAIMED:
        env = child_env(job, period, claim, shard, claimed)

        def log(message: str, event: str) -> None:
            say(message, settings, ERROR, event)

        settings.notifier.finished(result.outcome, result.status, env, log, result.output)


def run_shards(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
               settings: Settings, all_shards: bool = False) -> Result:
    """Claim the lowest shard of period that can be claimed, and run it.

    With all_shards, keep claiming until no shard is left; the result is the first
    failure's, else the last shard's. A shard's skip is not the run's: when no shard ran,
    one skip is told to pings and hooks (failed out before held before done). A stop signal
    (SIGTERM, SIGINT, SIGHUP: settings.stop, catch-up's or else its own) ends it after the
    shard in hand, which it is forwarded to; with its own, the status is then the first
    failure's that it did not interrupt, else 128+N.
    """
    if job.shards == 1:
        return run_period(ledger, job, period, command, settings)
    if not all_shards or settings.stop is not None:
        return _shards(ledger, job, period, command, settings, all_shards)
    from once.run.stops import Stop

    with Stop().caught() as stop:
        settings.stop = stop
        try:
            result = _shards(ledger, job, period, command, settings, all_shards)
        finally:
            settings.stop = None
    if stop.signal is None or (not result.ok and not result.interrupted):
        return result
    return Result(result.outcome, 128 + stop.signal, result.output, result.interrupted)


def _shards(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
            settings: Settings, all_shards: bool) -> Result:
    last: Result | None = None
    failure: Result | None = None
    skips: set[outcomes.Skip] = set()
    for shard in range(job.shards):
        result = run_period(ledger, job, period, command, settings, shard=shard,
                            notify_skip=False)
        if settings.stop is not None and settings.stop.signal is not None:
            left = job.shards - shard - 1  # not claimed: left for the next fire
            if left:
                from once.run.stops import signal_name

                say(f"{job.name} {period.key}: stopped by {signal_name(settings.stop.signal)}"
                    f": {left} shard{'' if left == 1 else 's'} not tried, left for the next "
                    f"fire", settings, ERROR, "stopped")
            return failure or result
        if result.outcome in outcomes.UNCLAIMED:
            return result
        if result.outcome in outcomes.SKIPS:
            skips.add(result.outcome)
            continue
        last = result
        failure = failure or (None if result.ok else result)
        if not all_shards:
            break
    if last is None:
        outcome: outcomes.Skip = next((o for o in ("skipped-failed", "skipped-overlap",
                                                   "skipped-held") if o in skips),
                                      "skipped-done")
        last = Result(outcome, settings.skipped_exit_code)
        _notify(settings, last, job, period, None, claimed=False)
    return failure or last


def _skipped(what: str, claim: Claim, job: Job, settings: Settings,
             rerun: bool = False) -> Result:
    skips.say(what, claim, job, settings, rerun)
    return Result(claim.skip_reason, settings.skipped_exit_code)


def _run_claimed(ledger: Ledger, job: Job, period: Period, key: str, shard: int | None,
                 claim: Claim, command: Sequence[str], settings: Settings,
                 sent: float) -> Result:
    """Run the command under the claim's lease, then record how it ended."""
    from once.run import attempt  # not needed for a skip
    from once.run.lease import Lease

    what = f"{job.name} {key} attempt {claim.attempt}"
    lease = Lease(attempt.renewal(ledger, job.name, key, claim), job.stale_after,
                  sent)
    outcome, new_state, state_error = _run_command(ledger, job, period, shard, claim,
                                                   command, settings, lease)
    if outcome.kind == "fenced-out":
        why = (attempt.lost_reason(ledger, job.name, key, claim) if lease.lost
               else lease.last_error if lease.overslept else
               f"{attempt.trouble(lease, 'the renewals')} past the deadline ({lease.last_error})")
        say(f"{what}: fenced out: {why}; the command was stopped and nothing was recorded",
            settings, ERROR, "fenced-out")
        if lease.lost and not lease.stranded:  # the ledger answers: keep what it said
            attempt.keep_output(ledger, job, key, claim, outcome.output, lease)
        return Result("fenced-out", EXIT_FENCED_OUT, outcome.output)
    if outcome.kind == "exec-failed":
        say(f"cannot run {command[0]!r}: {outcome.message}", settings, ERROR, "exec-failed")
    # A failure the command did not make, said with what became of the result (an
    # interrupted guard death is said by _recorded's line).
    died = outcome.kind == "guard-died" and outcome.interrupted_by is None
    cause = outcome.message if died else state_error
    status = outcomes.status(outcome.succeeded, bool(state_error))
    history = outcomes.history(outcome.kind, outcome.succeeded,
                               outcome.interrupted_by is not None, bool(state_error))
    recorded = attempt.record_result(ledger, job, key, claim, status, outcome.status, history,
                                     lease, new_state, outcome.output)
    if not recorded:
        head = f"{what}: {cause};" if cause else f"{what}:"
        return _not_recorded(ledger, job, key, claim, head, recorded is None, status,
                             new_state, outcome.output, lease, settings)
    if cause:  # (a guard death: the group is dead, the failure may be retried at once)
        say(f"{what}: {cause}; recorded failed", settings, ERROR,
            "guard-died" if died else "bad-state")
    later = attempt.next_step(ledger, job, key, claim) if status == "failed" else ""
    return _recorded(what, outcome, status, settings, later)


def _run_command(ledger: Ledger, job: Job, period: Period, shard: int | None, claim: Claim,
                 command: Sequence[str], settings: Settings,
                 lease: Lease) -> tuple[Outcome, str | None, str]:
    """Run the command to its end (or ours): how it ended, and the new watermark it left
    (None: no change) or why that cannot be stored ('' when it can)."""
    from once.run import wrapper

    env = child_env(job, period, claim, shard)
    with StateFile(settings.state) as state:
        if settings.state:
            env.update({"ONCE_STATE": claim.state or "", "ONCE_STATE_OUT": state.path})
        on_start = settings.notifier.started if settings.notifier is not None else None
        outcome = wrapper.run(command, env, lease, settings.kill_after, settings.timeout,
                             on_start, settings.output_tail, settings.keeper,
                             stop=settings.stop)
        if lease.stranded:  # closing or reusing that connection can crash (SQLite: SIGSEGV)
            ledger.abandon()
        new_state, state_error = state.read() if outcome.succeeded else (None, "")
    return outcome, new_state, state_error


def _not_recorded(ledger: Ledger, job: Job, key: str, claim: Claim, head: str,
                  trouble: bool, status: outcomes.Status, new_state: str | None,
                  output: bytes | None, lease: Lease, settings: Settings) -> Result:
    """The final write did not land: the ledger stayed unreachable or refused it, or the row
    is no longer ours (its output is then kept in the attempt's own row). `head` starts the
    line: the attempt, and the cause of a failure the command did not make."""
    from once.run import attempt

    if trouble:
        line, event = attempt.unrecorded(lease, status, claim.attempt, job.max_attempts)
        say(f"{head} {line}", settings, ERROR, event)
        return Result("unreachable", EXIT_LEDGER, output)
    moved = new_state is not None and ledger.state(job.name)[1] != claim.state_version
    why = ("the job's watermark moved while the command ran" if moved
           else attempt.lost_reason(ledger, job.name, key, claim))
    say(f"{head} fenced out: the final write matched no row ({why}); nothing was "
        f"recorded", settings, ERROR, "fenced-out")
    attempt.keep_output(ledger, job, key, claim, output, lease)
    return Result("fenced-out", EXIT_FENCED_OUT, output)


def _recorded(what: str, outcome: Outcome, status: outcomes.Status, settings: Settings,
              later: str = "") -> Result:
    """A recorded attempt's result and once's status: the command's own (after a stop signal
    too, 0 included), 1 for a watermark not stored, 124 for --timeout. A failure is one line,
    -q or not (cron mails it), `later` its place and what comes next (attempt.next_step)."""
    output = outcome.output
    if outcome.kind == "timed-out":
        say(f"{what}: timed out after --timeout {settings.timeout:g}s; recorded failed "
            f"({later})", settings, ERROR, "timed-out")
        return Result(outcomes.result(outcome.kind, status), EXIT_TIMEOUT, output)
    interrupted = outcome.interrupted_by is not None
    if outcome.interrupted_by is not None:  # a pod's SIGTERM: the log must say why it ended
        from once.run.stops import NOT_STARTED, signal_name

        how = ("before its command started, which was not started" if outcome.message ==
               NOT_STARTED else f"and forwarded to the command; {outcome.message}"
               if outcome.kind == "guard-died" else f"and forwarded to the command, which "
               f"ended with status {outcome.status}")
        say(f"{what}: {signal_name(outcome.interrupted_by)} received {how}; recorded failed "
            f"(interrupted: not counted against --max-attempts)", settings, ERROR,
            "interrupted")
    said = settings.results_said and settings.verbosity >= NORMAL
    if status == "failed" and not interrupted and outcome.kind in ("exited", "signaled") \
            and outcome.status and not said:  # (0: a bad watermark, said already)
        from once.run.stops import signal_name

        ended = (f"killed by {signal_name(outcome.status - 128)}"
                 if outcome.kind == "signaled" else f"exit {outcome.status}")
        say(f"{what.rpartition(' attempt ')[0]}: failed ({ended}), {later}", settings, ERROR,
            "failed")
    else:
        say(f"{what}: {status} (exit {outcome.status})", settings, VERBOSE, status)
    if status == "failed" and outcome.status == 0 and not interrupted:  # a bad watermark
        return Result(status, 1, output)
    return Result(outcomes.result(outcome.kind, status), outcome.status, output, interrupted)


# -- catch-up and rerun ----------------------------------------------------------------------


def rerun_period(ledger: Ledger, job: Job, period: Period, command: Sequence[str],
                 settings: Settings, reason: str, shard: int | None = None) -> Result:
    """`once rerun`: the period (or one shard) again, as a new attempt. Refused, with
    EXIT_REFUSED and one line naming it, while a live attempt holds the way: the period's
    own, or with --no-overlap another period's."""
    result = run_period(ledger, job, period, command, settings, rerun_reason=reason,
                        shard=shard)
    if result.outcome in ("skipped-held", "skipped-overlap"):
        return Result(result.outcome, EXIT_REFUSED)
    return result


class NothingToResume(ValueError):
    """Catch-up without --since for a job that has never run (a usage error)."""


def missing_periods(ledger: Ledger, job: Job, schedule: Schedule, since: Period | None,
                    until: Period, limit: int | None = None,
                    from_first: bool = False, held: bool = False) -> list[Period]:
    """The periods in [since, until] that need a run (once.gaps.needs_run: a unit without a
    row, a stale running row, a failed row with attempts left), oldest first, at most limit:
    `once check`'s gap finder. since defaults to the job's first period (NothingToResume for a
    job that has never run); from_first: never before it (`once run --catchup`). held: also
    the periods a live owner holds (a running row not yet stale), beyond the limit, so that
    a catch-up tries them and says so (its claim skips one whose owner lives, takes over
    one gone stale meanwhile), never passes over them in silence."""
    import heapq

    from once import gaps  # not on the hot path of a plain `once run`

    stored = ledger.rows(job.name)
    first, latest = stored.span()
    if first is None:
        if from_first:
            return []
        if since is None:
            raise NothingToResume(f"job {job.name} has never run: give --since")
    elif since is None or from_first:
        first_period = schedule.containing(first)
        if since is None or utc_instant(since.start) < utc_instant(first_period.start):
            since = first_period
    assert since is not None
    lo, hi = utc_instant(since.start), utc_instant(until.end)
    if lo > utc_instant(until.start):
        return []
    rows = [gaps.OpenRow(*row) for row in stored.open_rows(lo, hi)]
    finder = gaps.GapFinder(schedule, job.shards, stored,
                            [(r.start, r.key) for r in rows], latest)
    # Both streams are in order of period start; a period may come from both, or several times.
    made_up = ((r.start, schedule.containing(r.start), not gaps.needs_run(r, job.max_attempts))
               for r in rows if gaps.needs_run(r, job.max_attempts)
               or (held and r.status == "running"))
    rowless = ((utc_instant(period.start), period, False) for period, _ in finder.units(lo, hi))
    found: list[Period] = []
    counted = 0  # periods that need a run: the limit's (one a live owner holds is tried too)
    last_live = False
    for start, period, live in heapq.merge(made_up, rowless, key=lambda item: item[0]):
        if found and utc_instant(found[-1].start) == start:
            if last_live and not live:  # another shard of it needs a run
                counted, last_live = counted + 1, False
            continue
        if limit is not None and counted >= limit:
            break
        found.append(period)
        counted, last_live = counted + (not live), live
    return found

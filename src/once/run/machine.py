"""The wrapper's rules as a state machine: what it does next, as a pure function of its state,
the time, the lease's terms and what happened (once.run.wrapper is the shell that feeds it
events and performs its actions). No I/O here: no clock, no process, no ledger.

    RUNNING ──(a forwarded signal, --timeout, a step-down: SIGTERM)──> STOPPING
       │                                                                  │
       └──(the lease's deadline; the guard gone with its command running)─┴─> KILLED (SIGKILL)
    any of them ──(the guard's report complete: its end of file, a kept guard's `ready`)──> GONE

A turn of the wrapper's loop is one step: the guard's report lines and end of file first, then
the signals once received (each forwarded to the command's group; once the command's end is
known, from the report or the kernel, it is no longer the command's), then the timers: the first
renewal due (the heartbeat starts), the step-down's SIGTERM --kill-after before the lease's
deadline (or once the row is found taken), --timeout's SIGTERM, the SIGKILL --kill-after after
a SIGTERM or at the deadline. Once the report is complete the command's group is killed if the
command was being stopped or did not end (nothing it started may carry on) and the guard is
reaped, unless a kept guard (once.run.keeper) waits for the next period.
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from enum import Enum
from typing import Any

from once.frozen import Frozen
from once.outcomes import Kind

_KILL = int(signal.SIGKILL)
_TERM = int(signal.SIGTERM)


@dataclass(frozen=True)
class Outcome:
    """How the command ended, kept apart as runitor does: exit, signal, exec failure, ours."""

    kind: Kind
    status: int  # the command's status as a shell reports it (128+N for signal N)
    interrupted_by: int | None = None  # a signal we forwarded to it
    message: str = ""
    output: bytes | None = None  # the last --output-tail bytes it wrote (None: not captured)

    @property
    def succeeded(self) -> bool:
        return self.kind == "exited" and self.status == 0 and self.interrupted_by is None


class Phase(Enum):
    RUNNING = "running"  # nothing sent to the command's group
    STOPPING = "stopping"  # told to stop (SIGTERM or a forwarded signal): SIGKILL at kill_at
    KILLED = "killed"  # SIGKILL went to the group
    GONE = "gone"  # the guard's report is complete: the loop is over


# -- events (what the shell saw) and actions (what it is to do) -------------------------------


class Report(Frozen):
    """Bytes of the guard's report; b"": its end of file (the guard is gone)."""

    data: bytes

    def __init__(self, data: bytes) -> None:
        self._set(data=data)


class Signal(Frozen):
    """A signal once received (SIGTERM, SIGINT, SIGHUP): forwarded to the group. gone: the
    kernel said the command had exited when once came to it (its report not yet read)."""

    number: int
    gone: bool

    def __init__(self, number: int, gone: bool = False) -> None:
        self._set(number=int(number), gone=gone)


Event = Report | Signal


class Kill(Frozen):
    """Send `number` to the command's process group (the guard leads it)."""

    number: int

    def __init__(self, number: int) -> None:
        self._set(number=int(number))


class StepDown(Frozen):
    """The owner steps down: the lease keeps the reason (Lease.step_down_reason)."""

    def __init__(self) -> None:
        self._set()


class Beat(Frozen):
    """Start the heartbeat (the first renewal is due)."""

    def __init__(self) -> None:
        self._set()


class Reap(Frozen):
    """Wait for the guard's status (it is dead, or dying)."""

    def __init__(self) -> None:
        self._set()


Action = Kill | StepDown | Beat | Reap


class Terms(Frozen):
    """The lease as one turn sees it (once.run.lease.Lease, read by the shell)."""

    deadline: float  # the last successful renewal sent + --stale-after
    lost: bool  # a renewal found the row taken
    last_sent: float
    interval: float  # between renewals

    def __init__(self, deadline: float, lost: bool, last_sent: float, interval: float) -> None:
        self._set(deadline=deadline, lost=lost, last_sent=last_sent, interval=interval)


# -- the state ----------------------------------------------------------------------------------


class State(Frozen):
    phase: Phase
    grace: float  # --kill-after, cut to fit the lease
    kept_guard: bool  # a kept guard says `ready` after its last line instead of ending
    timeout_at: float | None  # --timeout's SIGTERM (None: none, or sent)
    kill_at: float | None  # the SIGKILL after a SIGTERM (set while STOPPING)
    stopped_at: float | None  # when the command was first told to stop
    why: Kind | None  # timed-out or fenced-out, once we decided to stop it
    forwarded: int | None  # the last signal forwarded to the command
    report: bytes  # the guard's report so far
    beating: bool  # the heartbeat was started
    killed_first: bool  # SIGKILL went to the group before the guard's report was complete
    kept: bool  # GONE, the kept guard waiting for the next period
    stopped_late: bool  # a stop signal went to the group after the command had ended
    end_group: bool  # nothing of the group outlives the command (once lead's terms)

    def __init__(self, phase: Phase, grace: float, kept_guard: bool, timeout_at: float | None,
                 kill_at: float | None = None, stopped_at: float | None = None,
                 why: Kind | None = None, forwarded: int | None = None, report: bytes = b"",
                 beating: bool = False, killed_first: bool = False, kept: bool = False,
                 stopped_late: bool = False, end_group: bool = False) -> None:
        self._set(phase=phase, grace=grace, kept_guard=kept_guard, timeout_at=timeout_at,
                  kill_at=kill_at, stopped_at=stopped_at, why=why, forwarded=forwarded,
                  report=report, beating=beating, killed_first=killed_first, kept=kept,
                  stopped_late=stopped_late, end_group=end_group)

    def but(self, **changes: Any) -> State:
        """A copy with `changes`."""
        return State(**{**self.__dict__, **changes})

    @property
    def killed(self) -> bool:
        return self.phase is Phase.KILLED

    @property
    def started(self) -> bool:
        """The guard reported the command on its way (its exec done)."""
        return b"started" in self.report.splitlines()

    @property
    def ended(self) -> bool:
        """The guard reported the command's end (a line other than `started`): not undone by
        a timer that fires with it."""
        return any(not line.startswith(b"started") for line in self.report.splitlines())

    @property
    def ready(self) -> bool:
        """A kept guard said `ready`: the period is over and it waits for the next."""
        return self.kept_guard and b"ready" in self.report.splitlines()


def start(now: float, grace: float, timeout: float | None, kept_guard: bool = False,
          end_group: bool = False) -> State:
    """The state when the command is on its way. end_group: the group is killed when the
    guard's report is complete, whatever the command's end (once lead: what a term left)."""
    return State(Phase.RUNNING, grace, kept_guard, now + timeout if timeout else None,
                 end_group=end_group)


# -- the rules ----------------------------------------------------------------------------------


def step(state: State, now: float, lease: Terms | None,
         *events: Event) -> tuple[State, list[Action]]:
    """One turn: the events seen since the last (report bytes before signals), then the
    timers due at `now`. lease: None when the command runs without one."""
    assert state.phase is not Phase.GONE, "the guard's report is complete"
    actions: list[Action] = []
    gone = False
    for event in events:
        if isinstance(event, Report):
            gone = gone or not event.data
            state = state.but(report=state.report + event.data, killed_first=state.killed)
    for event in events:
        if not isinstance(event, Signal):
            continue
        if state.ended or (event.gone and state.started):
            # The command's end is known (reported, or the kernel said it has exited): the
            # signal never reached it and is once's own (the shell passes it on, run()). What
            # the command left in its group gets it, and is killed with the group at the end.
            actions.append(Kill(event.number))
            state = state.but(stopped_late=True)
        else:
            state = _stop(state.but(forwarded=event.number), event.number, now, actions)
    state = _timers(state, now, lease, actions)
    if gone or state.ready:
        state = _conclude(state, actions)
    return state, actions


def beat_due(state: State, now: float, lease: Terms | None) -> tuple[State, list[Action]]:
    """Start the heartbeat when the first renewal is due (a command that ends sooner never
    needs it): also while the relay delivers what the command left."""
    if lease is not None and not state.beating and now >= lease.last_sent + lease.interval:
        return state.but(beating=True), [Beat()]
    return state, []


def next_timer(state: State, now: float, lease: Terms | None) -> float:
    """Seconds until the next timer is due (0: now; an hour when none is)."""
    times = [t for t in (state.kill_at, None if state.ended else state.timeout_at)
             if t is not None]
    if lease is not None and not state.killed:
        times.append(lease.deadline)  # SIGKILL, whatever else is going on
        if state.why is None and not state.ended:
            times.append(lease.deadline - state.grace)  # the step-down's SIGTERM
        if not state.beating:
            times.append(lease.last_sent + lease.interval)
    # Every timer that has fired is cleared (or, the deadline, no longer listed once the
    # group is killed): a past one would keep the loop from ever sleeping.
    return max(0.0, min(times, default=now + 3600) - now)


def _timers(state: State, now: float, lease: Terms | None, actions: list[Action]) -> State:
    state, beat = beat_due(state, now, lease)
    actions += beat
    if (lease is not None and state.why is None and not state.ended
            and (lease.lost or now >= lease.deadline - state.grace)):
        actions.append(StepDown())
        state = _stop(state.but(why="fenced-out"), _TERM, now, actions)
    if state.timeout_at is not None and now >= state.timeout_at and not state.ended:
        state = state.but(timeout_at=None)
        if state.why is None:
            state = _stop(state.but(why="timed-out"), _TERM, now, actions)
    dead_line = lease is not None and now >= lease.deadline
    if (state.kill_at is not None and now >= state.kill_at) or (dead_line and not state.killed):
        actions.append(Kill(_KILL))
        state = state.but(phase=Phase.KILLED, kill_at=None)
    return state


def _stop(state: State, sig: int, now: float, actions: list[Action]) -> State:
    """Send sig to the command's group now; SIGKILL follows after the grace."""
    actions.append(Kill(sig))
    state = state.but(stopped_at=now if state.stopped_at is None else state.stopped_at)
    if state.kill_at is None and not state.killed:
        state = state.but(phase=Phase.STOPPING, kill_at=now + state.grace)
    return state


def _conclude(state: State, actions: list[Action]) -> State:
    """The guard's report is complete: the guard is gone, or a kept guard waits."""
    ready = state.ready
    if (not state.ended or state.why is not None or state.forwarded is not None
            or state.stopped_late or b"lapsed " in state.report or (ready and state.killed)
            or state.end_group):
        # The guard died before the command's end (killed: the command got its parent-death
        # signal), or we were stopping the command and it has ended: nothing it started may
        # carry on (a shell's child that ignores SIGTERM, say); with end_group, whatever
        # the command's end. A SIGKILL cannot be caught:
        # once it is sent, no process of the group runs another instruction of its own. Sent
        # before the guard is reaped, while its pid (the group's id) cannot be reused.
        actions.append(Kill(_KILL))
        state = state.but(phase=Phase.KILLED)
    kept = ready and not state.killed  # else it is dead, or dying: reaped
    if not kept:
        actions.append(Reap())
    return state.but(phase=Phase.GONE, kept=kept)


# -- the outcome ----------------------------------------------------------------------------------


def outcome(state: State, guard_status: int | None) -> tuple[Outcome, list[Action]]:
    """How the command ended, from the guard's report (a kept guard's `ready` aside); a
    StepDown when the guard stepped down at the deadline on its own."""
    lines = [line for line in state.report.decode().splitlines() if line != "ready"]
    started = "started" in lines
    last = next((line for line in reversed(lines) if line != "started"), "")
    if not last:
        return _guard_death(state, started, guard_status), []
    actions: list[Action] = []
    why = state.why
    if last.startswith("lapsed ") and why is None:  # the guard stepped down at the deadline
        why = "fenced-out"
        actions.append(StepDown())
    word, _, value = last.removeprefix("lapsed ").strip().partition(" ")
    number = int(value) if value.lstrip("-").isdigit() else 1
    if word == "exec":
        code = 127 if number == errno.ENOENT else 126
        return Outcome("exec-failed", code, message=os.strerror(number)), actions
    status = 128 + number if word == "signal" else number
    kind: Kind = why or ("signaled" if word == "signal" else "exited")
    return Outcome(kind, status, state.forwarded), actions


def _guard_death(state: State, started: bool, status: int | None) -> Outcome:
    """The guard ended without its last line: it failed, or was killed. Killed before it
    said `started`, it may have started the command already (the exec came first): a guard
    death, not a command that could not run."""
    signaled = status is not None and os.WIFSIGNALED(status)
    if not started and not signaled:
        return Outcome("exec-failed", 126, message="once's guard process failed")
    killed = 128 + _KILL
    if state.why is not None or state.killed_first:
        # Ours: we were stopping the command, or our SIGKILL reached the guard with it.
        return Outcome(state.why or "signaled", killed, state.forwarded)
    if signaled:
        assert status is not None
        how = f"was killed by signal {os.WTERMSIG(status)}"
    else:
        code = os.waitstatus_to_exitcode(status) if status is not None else "unknown"
        how = f"failed (status {code})"
    if not started:
        return Outcome("guard-died", killed, state.forwarded,
                       message=f"once's guard process {how} before it said the command had "
                               f"started; the command, if it had, was killed with it")
    return Outcome("guard-died", killed, state.forwarded,
                   message=f"once's guard process {how}; the command was killed with it")

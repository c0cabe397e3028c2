"""The wrapper's rules (once.run.machine), on a fake clock: no sleeps, no processes.

What tests/integration proves once end to end (a real command, a real guard, real signals),
here rule by rule: the step-down (SIGTERM, then SIGKILL after the grace), --timeout, forwarded
signals, a second signal, the row found taken, the lease's lapse, the guard's death before and
after the command started, the command's end as the guard reports it, and a catch-up's kept
guard (once.run.keeper). Then the shell (once.run.wrapper) around them, with killpg and
waitpid replaced: it performs what the machine says, and carries the kept guard's seam.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest

from once.run import machine, wrapper
from once.run.lease import Lease
from once.run.machine import Beat, Kill, Phase, Reap, Report, Signal, StepDown, Terms

TERM, INT, HUP, KILL = (int(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP,
                                         signal.SIGKILL))
STARTED = b"started\n"


class Run:
    """One command under the machine: a fake clock, a fake lease, the actions of each turn."""

    def __init__(self, grace: float = 1.0, timeout: float | None = None,
                 stale_after: float | None = None, kept_guard: bool = False,
                 end_group: bool = False) -> None:
        self.now = 100.0
        self.lease = None if stale_after is None else {
            "deadline": self.now + stale_after, "lost": False, "last_sent": self.now,
            "interval": stale_after / 3}
        self.state = machine.start(self.now, grace, timeout, kept_guard, end_group)
        self.actions: list[list[machine.Action]] = []

    @property
    def terms(self) -> Terms | None:
        return None if self.lease is None else Terms(**self.lease)

    def turn(self, *events: machine.Event, at: float | None = None) -> list[machine.Action]:
        """One turn of the wrapper's loop at `at` (default: now); its actions."""
        self.now = self.now if at is None else at
        self.state, actions = machine.step(self.state, self.now, self.terms, *events)
        self.actions.append(actions)
        return actions

    def pause(self) -> float:
        return machine.next_timer(self.state, self.now, self.terms)

    def outcome(self, guard_status: int | None = None) -> machine.Outcome:
        return machine.outcome(self.state, guard_status)[0]


EOF = Report(b"")


# -- the command's end -------------------------------------------------------------------------


def test_a_command_that_ends_is_reaped_and_nothing_is_killed() -> None:
    run = Run()
    assert run.turn(Report(STARTED)) == []
    assert run.turn(Report(b"exit 0\n")) == []
    assert run.turn(EOF) == [Reap()]
    assert run.state.phase is Phase.GONE and not run.state.kept
    assert run.outcome() == machine.Outcome("exited", 0)
    assert run.outcome().succeeded


def test_with_end_group_the_group_is_killed_before_the_guard_is_reaped() -> None:
    # once lead: what a term left dies with it; killed while the guard, whose pid is the
    # group's number, is not reaped yet (after, the number may be a newcomer's).
    run = Run(end_group=True)
    assert run.turn(Report(STARTED)) == []
    assert run.turn(Report(b"exit 0\n")) == []
    assert run.turn(EOF) == [Kill(KILL), Reap()]
    assert run.outcome() == machine.Outcome("exited", 0)  # the command's own end, unchanged

@pytest.mark.parametrize(("lines", "outcome"), [
    (b"started\nexit 3\n", machine.Outcome("exited", 3)),
    (b"started\nsignal 11\n", machine.Outcome("signaled", 139)),
    (b"exec 2\n", machine.Outcome("exec-failed", 127, message=os.strerror(errno.ENOENT))),
    (b"exec 13\n", machine.Outcome("exec-failed", 126, message=os.strerror(errno.EACCES))),
], ids=["exit", "signal", "not-found", "not-executable"])
def test_the_command_s_end_as_the_guard_reports_it(lines: bytes,
                                                     outcome: machine.Outcome) -> None:
    run = Run()
    assert run.turn(Report(lines), EOF) == [Reap()]
    assert run.outcome() == outcome


def test_a_timer_that_fires_with_the_command_s_end_does_not_undo_it() -> None:
    run = Run(timeout=5.0, stale_after=30.0)
    assert run.turn(Report(STARTED + b"exit 0\n"), at=105.0) == []  # --timeout is due
    assert run.turn(EOF, at=105.0) == [Reap()]
    assert run.outcome() == machine.Outcome("exited", 0)


# -- forwarded signals -------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [TERM, INT, HUP])
def test_a_signal_is_forwarded_then_sigkill_follows_after_the_grace(sig: int) -> None:
    run = Run(grace=2.0)
    run.turn(Report(STARTED))
    assert run.turn(Signal(sig), at=101.0) == [Kill(sig)]
    assert run.state.phase is Phase.STOPPING and run.state.kill_at == 103.0
    assert run.pause() == 2.0
    assert run.turn(at=102.9) == []
    assert run.turn(at=103.0) == [Kill(KILL)]
    assert run.state.phase is Phase.KILLED and run.pause() == 3600  # no timer left: it sleeps
    assert run.turn(at=104.0) == []
    assert run.turn(EOF, at=104.0) == [Kill(KILL), Reap()]  # the end was not reported
    assert run.outcome() == machine.Outcome("signaled", 137, sig)  # ours, not a guard death


def test_a_command_that_dies_of_the_forwarded_signal_has_its_group_killed() -> None:
    # What a shell's child that ignores the signal left must not carry on.
    run = Run()
    run.turn(Report(STARTED))
    run.turn(Signal(TERM))
    assert run.turn(Report(b"signal 15\n"), EOF) == [Kill(KILL), Reap()]
    assert run.outcome() == machine.Outcome("signaled", 143, TERM)
    assert not run.outcome().succeeded


def test_a_second_signal_is_forwarded_and_keeps_the_first_s_sigkill() -> None:
    run = Run(grace=2.0)
    run.turn(Signal(TERM), at=101.0)
    assert run.turn(Signal(INT), at=102.0) == [Kill(INT)]
    assert (run.state.kill_at, run.state.stopped_at, run.state.forwarded) == (103.0, 101.0, INT)
    assert run.turn(at=103.0) == [Kill(KILL)]
    assert run.turn(Signal(HUP), at=104.0) == [Kill(HUP)]  # forwarded, nothing more to follow
    assert run.state.kill_at is None and run.state.phase is Phase.KILLED


def test_signals_of_one_turn_are_forwarded_in_order_after_the_report() -> None:
    run = Run()
    assert run.turn(Signal(TERM), Report(STARTED), Signal(HUP)) == [Kill(TERM), Kill(HUP)]
    assert run.state.killed_first is False


@pytest.mark.parametrize("same_turn", [True, False], ids=["with-the-end", "after-the-end"])
def test_a_signal_after_the_command_s_end_is_not_the_command_s(same_turn: bool) -> None:
    # It reached no command (the end was reported: it is sent now, if at all): a command that
    # exited 0 on its own succeeded, and its period is done, not interrupted and run again
    # (an outside attacker's finding: 9 in 250 signals at a command's end).
    # What it left in its group gets the signal, and is killed with the group at the end.
    run = Run()
    run.turn(Report(STARTED))
    if same_turn:
        assert run.turn(Signal(TERM), Report(b"exit 0\n")) == [Kill(TERM)]
    else:
        assert run.turn(Report(b"exit 0\n")) == []
        assert run.turn(Signal(TERM)) == [Kill(TERM)]
    assert run.turn(EOF) == [Kill(KILL), Reap()]
    assert run.state.forwarded is None and run.outcome().succeeded


def test_a_signal_before_the_command_s_end_was_reported_is_the_command_s() -> None:
    # The guard reports the end a moment after it: the signal may have come in between, or
    # reached the command. Counted as forwarded (recorded interrupted, run again): never a
    # period recorded done by a command stopped on its way.
    run = Run()
    run.turn(Report(STARTED))
    assert run.turn(Signal(TERM)) == [Kill(TERM)]
    run.turn(Report(b"exit 0\n"), EOF)
    assert run.outcome() == machine.Outcome("exited", 0, TERM)
    assert not run.outcome().succeeded


def test_a_signal_that_finds_the_command_gone_is_not_the_command_s() -> None:
    # The kernel says the command has exited (the shell asked), its report not yet here.
    run = Run()
    run.turn(Report(STARTED))
    assert run.turn(Signal(TERM, gone=True)) == [Kill(TERM)]  # for what it left in its group
    assert run.turn(Report(b"exit 0\n"), EOF) == [Kill(KILL), Reap()]
    assert run.outcome() == machine.Outcome("exited", 0) and run.outcome().succeeded


def test_a_signal_before_the_command_started_is_forwarded_whatever_the_kernel_says() -> None:
    # No command yet (the guard has not started it): its absence is no end.
    run = Run()
    assert run.turn(Signal(TERM, gone=True)) == [Kill(TERM)]


# -- --timeout ---------------------------------------------------------------------------------


def test_timeout_sends_sigterm_then_sigkill_after_the_grace() -> None:
    run = Run(grace=1.0, timeout=5.0)
    run.turn(Report(STARTED))
    assert run.pause() == 5.0
    assert run.turn(at=104.9) == []
    assert run.turn(at=105.0) == [Kill(TERM)]
    assert run.state.why == "timed-out" and run.state.timeout_at is None
    assert run.turn(at=106.0) == [Kill(KILL)]
    assert run.turn(Report(b"signal 9\n"), EOF, at=106.0) == [Kill(KILL), Reap()]
    assert run.outcome() == machine.Outcome("timed-out", 137)


def test_timeout_after_a_forwarded_signal_still_counts_as_timed_out() -> None:
    run = Run(grace=10.0, timeout=5.0)
    run.turn(Signal(TERM), at=101.0)
    assert run.turn(at=105.0) == [Kill(TERM)]  # the kill stays the first signal's
    assert run.state.kill_at == 111.0
    run.turn(Report(STARTED + b"signal 15\n"), EOF, at=105.0)
    assert run.outcome() == machine.Outcome("timed-out", 143, TERM)


# -- the lease: step-down, lapse, row taken, heartbeat -----------------------------------------


def test_the_first_renewal_due_starts_the_heartbeat_once() -> None:
    run = Run(stale_after=30.0)
    assert run.pause() == 10.0
    assert run.turn(at=109.0) == []
    assert run.turn(at=110.0) == [Beat()]
    assert run.turn(at=111.0) == []  # the heartbeat renews from now on
    assert run.state.beating


def test_a_lapsing_lease_steps_down_the_grace_before_its_deadline_and_kills_at_it() -> None:
    run = Run(grace=1.0, stale_after=6.0)  # the deadline is at 106
    run.turn(Report(STARTED))
    run.turn(at=102.0)  # the heartbeat starts; its renewals fail
    assert run.turn(at=104.9) == []
    assert run.turn(at=105.0) == [StepDown(), Kill(TERM)]
    assert run.state.why == "fenced-out"
    assert run.turn(at=105.5) == []  # the step-down, once begun, is not repeated
    assert run.turn(at=106.0) == [Kill(KILL)]
    run.turn(Report(b"signal 9\n"), EOF, at=106.0)
    assert run.outcome() == machine.Outcome("fenced-out", 137)


def test_a_renewal_moves_the_step_down() -> None:
    run = Run(grace=1.0, stale_after=6.0)
    assert run.lease is not None
    run.lease.update(deadline=108.0, last_sent=102.0)
    assert run.turn(at=105.0) == [Beat()]
    assert run.turn(at=106.5) == []
    assert run.turn(at=107.0) == [StepDown(), Kill(TERM)]


def test_the_deadline_kills_even_when_the_grace_of_a_signal_runs_past_it() -> None:
    run = Run(grace=2.0, stale_after=6.0)  # the deadline is at 106, its SIGTERM at 104
    assert run.turn(Signal(TERM), at=103.5) == [Kill(TERM), Beat()]
    assert run.state.kill_at == 105.5
    assert run.turn(at=104.0) == [StepDown(), Kill(TERM)]  # no signal undoes a step-down
    assert run.turn(at=105.5) == [Kill(KILL)]


def test_a_renewal_that_finds_the_row_taken_steps_down_at_once() -> None:
    run = Run(grace=1.0, stale_after=30.0)
    run.turn(Report(STARTED), at=110.0)
    assert run.lease is not None
    run.lease["lost"] = True
    assert run.turn(at=111.0) == [StepDown(), Kill(TERM)]
    assert run.turn(at=112.0) == [Kill(KILL)]
    run.turn(Report(b"signal 15\n"), EOF)
    assert run.outcome() == machine.Outcome("fenced-out", 143)


def test_a_lapse_the_guard_reported_is_a_step_down() -> None:
    # The guard stepped down on its own (the wrapper was stopped): SIGKILL at the deadline.
    run = Run(stale_after=6.0)
    run.turn(Report(STARTED))
    assert run.turn(Report(b"lapsed signal 9\n"), EOF, at=101.0) == [Kill(KILL), Reap()]
    outcome, actions = machine.outcome(run.state, None)
    assert outcome == machine.Outcome("fenced-out", 137) and actions == [StepDown()]


def test_no_lease_no_lease_timers() -> None:
    run = Run()
    assert run.pause() == 3600
    assert run.turn(at=10_000.0) == []


# -- the guard's death -------------------------------------------------------------------------


def test_a_guard_that_dies_before_the_command_started() -> None:
    run = Run()
    assert run.turn(EOF) == [Kill(KILL), Reap()]
    assert run.outcome() == machine.Outcome("exec-failed", 126,
                                            message="once's guard process failed")


def test_a_guard_killed_as_it_started_the_command_is_a_guard_death() -> None:
    """Killed after its exec of the command, before its `started` line (CI, a kept guard
    killed mid-catch-up on a loaded machine): the command may have run."""
    run = Run()
    assert run.turn(EOF) == [Kill(KILL), Reap()]
    assert run.outcome(KILL) == machine.Outcome(
        "guard-died", 137, message="once's guard process was killed by signal 9 before it said "
                                   "the command had started; the command, if it had, was "
                                   "killed with it")


@pytest.mark.parametrize(("status", "how"), [
    (KILL, "was killed by signal 9"), (70 << 8, "failed (status 70)"),
    (None, "failed (status unknown)")], ids=["killed", "failed", "unknown"])
def test_a_guard_that_dies_with_the_command_running(status: int | None, how: str) -> None:
    run = Run()
    run.turn(Report(STARTED))
    assert run.turn(EOF) == [Kill(KILL), Reap()]  # before the guard is reaped
    assert run.outcome(status) == machine.Outcome(
        "guard-died", 137, message=f"once's guard process {how}; the command was killed with it")


def test_a_guard_killed_by_our_sigkill_is_no_guard_death() -> None:
    run = Run(grace=1.0)
    run.turn(Report(STARTED))
    run.turn(Signal(INT), at=101.0)
    run.turn(at=102.0)
    assert run.turn(EOF, at=102.0) == [Kill(KILL), Reap()]
    assert run.state.killed_first
    assert run.outcome(KILL) == machine.Outcome("signaled", 137, INT)


def test_a_guard_that_dies_while_the_command_is_stopped_is_ours() -> None:
    run = Run(timeout=1.0)
    run.turn(Report(STARTED))
    run.turn(at=101.0)
    assert run.turn(EOF, at=101.5) == [Kill(KILL), Reap()]
    assert run.outcome(KILL) == machine.Outcome("timed-out", 137)


# -- a catch-up's kept guard (once.run.keeper) -------------------------------------------------


def test_a_kept_guard_that_says_ready_is_kept_and_not_reaped() -> None:
    run = Run(kept_guard=True)
    run.turn(Report(STARTED))
    assert run.turn(Report(b"exit 0\nready\n")) == []
    assert run.state.phase is Phase.GONE and run.state.kept
    assert run.outcome() == machine.Outcome("exited", 0)  # `ready` is no end of its own


def test_ready_from_a_guard_that_is_not_kept_is_no_end_of_the_report() -> None:
    run = Run()
    assert run.turn(Report(STARTED + b"exit 0\nready\n")) == []
    assert run.state.phase is Phase.RUNNING


@pytest.mark.parametrize("stop", ["signal", "deadline", "lapse"])
def test_a_kept_guard_of_a_stopped_period_is_killed_and_reaped(stop: str) -> None:
    run = Run(kept_guard=True, grace=1.0, stale_after=6.0)
    run.turn(Report(STARTED), at=102.0)
    line = b"exit 0\n"
    if stop == "signal":
        run.turn(Signal(TERM), at=103.0)
    elif stop == "deadline":
        run.turn(at=106.0)
        assert run.state.killed
    else:
        line = b"lapsed signal 9\n"
    assert run.turn(Report(line + b"ready\n"), at=106.0)[-2:] == [Kill(KILL), Reap()]
    assert run.state.phase is Phase.GONE and not run.state.kept


def test_a_kept_guard_that_dies_between_its_lines_is_a_guard_death() -> None:
    run = Run(kept_guard=True)
    run.turn(Report(STARTED))
    assert run.turn(EOF) == [Kill(KILL), Reap()]
    assert not run.state.kept and run.outcome(KILL).kind == "guard-died"


# -- the shell: it performs the machine's actions ----------------------------------------------


@pytest.fixture
def shell(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, list[Any]]]:
    """killpg, waitid and waitpid recorded, not performed; the guard's pid a fake one, whose
    command the kernel cannot be asked about (it ends with exit status 0)."""
    calls: dict[str, list[Any]] = {"killpg": [], "waitid": [], "waitpid": []}
    monkeypatch.setattr(wrapper._guard, "command_gone", lambda guard: False)
    # No guard's watcher of an earlier test in this process to reap (once.run.launch).
    monkeypatch.setattr(wrapper.launch, "_watchers", [])
    monkeypatch.setattr(os, "killpg", lambda pid, sig: calls["killpg"].append((pid, sig)))

    def waitpid(pid: int, options: int) -> tuple[int, int]:
        calls["waitpid"].append(pid)
        return pid, 0

    def waitid(_idtype: int, pid: int, _options: int) -> os.waitid_result:
        calls["waitid"].append(pid)
        return os.waitid_result((pid, 0, signal.SIGCHLD, 0, os.CLD_EXITED))

    monkeypatch.setattr(os, "waitpid", waitpid)
    monkeypatch.setattr(os, "waitid", waitid)
    yield calls


def _report(text: bytes) -> int:
    read, write = os.pipe()
    os.write(write, text)
    os.close(write)
    return read


def test_the_shell_forwards_a_pending_signal_and_kills_the_group_at_the_end(
        shell: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    supervisor = wrapper._Supervisor(None, 1.0, None)
    supervisor.pending.append(TERM)
    supervisor.received.append(TERM)
    report, guard = os.pipe()
    os.write(guard, b"started\n")

    def killpg(pid: int, sig: int) -> None:  # the command dies of what it is sent
        shell["killpg"].append((pid, sig))
        if sig == TERM:
            os.write(guard, b"signal 15\n")
            os.close(guard)

    monkeypatch.setattr(os, "killpg", killpg)
    with supervisor.signals():
        outcome = supervisor.wait(4242, report)
    os.close(report)
    assert shell["killpg"] == [(4242, TERM), (4242, KILL)]
    assert shell["waitpid"] == [4242]
    assert outcome == machine.Outcome("signaled", 143, TERM)


def test_the_shell_looks_for_the_command_s_end_before_it_forwards_a_signal(
        shell: dict[str, list[Any]], monkeypatch: pytest.MonkeyPatch) -> None:
    # Its wait woke with nothing to read (it was stopped, or busy, as the guard reported the
    # command's end) and a signal pending: the end, read first, makes the signal once's own.
    real_ready = wrapper._guard.ready
    looks: list[float] = []

    def ready(fds: list[int], timeout: float) -> set[int]:
        looks.append(timeout)
        return set() if len(looks) == 1 else real_ready(fds, timeout)

    monkeypatch.setattr(wrapper._guard, "ready", ready)
    supervisor = wrapper._Supervisor(None, 1.0, None)
    supervisor.pending.append(TERM)
    supervisor.received.append(TERM)
    report = _report(b"started\nexit 0\n")
    outcome = supervisor.wait(4242, report)
    os.close(report)
    assert looks[1] == 0  # the look before the signal is forwarded
    assert shell["killpg"] == [(4242, TERM), (4242, KILL)]  # for what the command left
    assert outcome == machine.Outcome("exited", 0) and outcome.succeeded


def test_the_shell_handles_only_the_signals_not_ignored_when_once_started(
        shell: dict[str, list[Any]]) -> None:
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    passed_on: list[int] = []
    old_int = signal.signal(signal.SIGINT, lambda number, _frame: passed_on.append(number))
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        supervisor = wrapper._Supervisor(None, 1.0, None)
        assert supervisor.ignored == {signal.SIGHUP}
        with supervisor.signals():
            assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == supervisor._on_signal
            assert signal.getsignal(signal.SIGINT) == supervisor._on_signal
            supervisor._on_signal(signal.SIGCHLD, None)  # PID 1's reaping: not forwarded
            supervisor._on_signal(signal.SIGINT, None)
        assert supervisor.pending == [INT]
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
        assert {sig: signal.getsignal(sig) for sig in before} == before  # put back
        # No command had it (none ran): passed on to the handler before the wrapper's.
        assert passed_on == [INT]
    finally:
        signal.signal(signal.SIGHUP, old)
        signal.signal(signal.SIGINT, old_int)
    assert set(wrapper.FORWARDED) == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


class FakeKeeper:
    """once.run.keeper.Keeper's seam as the wrapper uses it."""

    def __init__(self, report: bytes) -> None:
        self.calls: list[Any] = []
        self.deadline = os.pipe()
        self.report = _report(report)

    def session(self, beat: Any = None) -> FakeKeeper:
        self.calls.append("session")
        return self

    def spawn(self, command: list[str], *_args: Any) -> tuple[int, int]:
        self.calls.append(("spawn", command))
        return 4343, self.report

    def ended(self, kept: bool, stranded: bool) -> None:
        self.calls.append(("ended", kept, stranded))


@pytest.mark.parametrize(("report", "kept"), [(b"started\nexit 0\nready\n", True),
                                              (b"started\nexit 0\n", False)],
                         ids=["ready", "gone"])
def test_run_with_a_kept_guard(shell: dict[str, list[Any]], report: bytes, kept: bool) -> None:
    keeper = FakeKeeper(report)
    lease = Lease(lambda: True, 30.0, wrapper.lease_now())
    try:
        outcome = wrapper.run(["true"], {}, lease, keeper=keeper)  # type: ignore[arg-type]
        assert outcome == machine.Outcome("exited", 0)
        assert keeper.calls == ["session", ("spawn", ["true"]), ("ended", kept, False)]
        assert shell["killpg"] == [] and shell["waitpid"] == ([] if kept else [4343])
        for fd in (keeper.report, *keeper.deadline):  # the keeper's, left open
            os.fstat(fd)
    finally:
        for fd in (keeper.report, *keeper.deadline):
            os.close(fd)


def test_a_command_the_lease_would_stop_at_once_is_not_started(
        shell: dict[str, list[Any]]) -> None:
    keeper = FakeKeeper(b"")
    # --stale-after 3s, the claim sent 2.5 s ago and not renewable: the SIGTERM is past due.
    lease = Lease(lambda: False, 3.0, wrapper.lease_now() - 2.5)
    try:
        outcome = wrapper.run(["true"], {}, lease, keeper=keeper)  # type: ignore[arg-type]
    finally:
        for fd in (keeper.report, *keeper.deadline):
            os.close(fd)
    assert outcome == machine.Outcome("fenced-out", 0, message="the command was not started")
    assert keeper.calls == ["session"]  # taken before the check: it may start a guard
    assert lease.stepping_down

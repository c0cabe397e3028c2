"""The child: start it, keep its claim (once.run.lease) alive, stop it when the claim is lost.
No SQL here. The rules of what to do when are once.run.machine's; this is their I/O shell.

The command runs under a guard process (once.run.guard): the guard dies with the wrapper and
takes the command's whole process group with it; the command dies with the guard.

The wrapper forwards SIGTERM, SIGINT and SIGHUP to the group, escalates to SIGKILL after
--kill-after, and steps down (kills the group, reports FENCED_OUT) when a renewal finds the row
taken or when renewals keep failing towards the lease's deadline: the moment the last
successful renewal was *sent* plus --stale-after, on the lease clock (once.deadlines, which
counts suspended time). The command is dead by that deadline: SIGTERM goes out --kill-after
before it (capped at a third of --stale-after), SIGKILL at it. The guard watches the same
deadline on its own, for a wrapper that is stopped or wedged.

When the guard dies on its own (SIGKILL, the OOM killer), the wrapper notices at once (its
report pipe closes), kills the group and reports GUARD_DIED: the command was killed with its
guard, which core records as failed (outcome `guard-died`, status 137). Nothing of the group
can run by then, so the retry that the failure allows never starts beside it.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import replace
from typing import TYPE_CHECKING

from once.deadlines import lease_now, max_grace
from once.run import guard as _guard
from once.run import launch, machine
from once.run.lease import STALLED, Lease
from once.run.machine import Outcome as Outcome  # once.run.flow's, from here
from once.run.stops import FORWARDED, NOT_STARTED, Stop

if TYPE_CHECKING:
    from once.run.keeper import Keeper
    from once.run.relay import Relay



def run(
    command: Sequence[str],
    env: dict[str, str],
    lease: Lease | None,
    kill_after: float = 10.0,
    timeout: float | None = None,
    on_start: Callable[[], None] | None = None,
    output_tail: int = 0,
    keeper: Keeper | None = None,
    end_group: bool = False,
    stop: Stop | None = None,
) -> Outcome:
    """Run command to its end (or ours) under lease; return how it ended.

    kill_after is cut to fit the lease (once.deadlines.max_grace): the command must be dead
    by the lease's deadline. on_start is called once the command is on its way (after the
    fork: it may start threads). output_tail: keep the last bytes of the command's stdout and
    stderr where they are not a terminal (once.run.relay); 0: leave them alone. keeper: a
    catch-up's guard, kept from one period to the next (once.run.keeper); None: a guard forked
    for this command alone. end_group: once the command has ended, kill what it left in its
    process group and wait for the group to be gone (once lead: nothing of a term outlives it).
    stop: a run of several commands' (Stop): a stop signal it noted before the command could
    start keeps it from starting (NOT_STARTED); one that comes while it runs is forwarded and
    noted there too. One that comes once the command has ended is not the command's: it goes,
    on the way out, to the handler the caller had (once's own stop: Stop, held_back).
    """
    tty = _foreground_tty()
    grace = kill_after if lease is None else min(kill_after, max_grace(lease.stale_after))
    # Before _fresh: it may start a guard, and the lease must outlive the wait for it.
    kept = keeper.session(_beat(lease)) if keeper is not None else None
    if lease is not None and not _fresh(lease, grace):
        lease.step_down_reason()
        return Outcome("fenced-out", 0, message="the command was not started")
    supervisor = _Supervisor(lease, grace, timeout, kept, end_group)
    relay = _relay(output_tail)
    spawn = kept.spawn if kept is not None else _guard.spawn
    # Handlers go in before the fork: a signal that arrives while the guard starts is
    # forwarded, not lost (nor fatal to a wrapper whose guard would then kill the command).
    supervisor.stop = stop
    with supervisor.signals():
        if stop is not None and stop.signal is not None:  # our handlers are in: none is lost
            if relay is not None:
                relay.close_unforked()
            return Outcome("signaled", 128 + stop.signal, stop.signal, message=NOT_STARTED)
        try:
            guard, report = spawn(
                list(command), env, tty, _title(env), supervisor.ignored, supervisor.watch(),
                supervisor.own_fds() + (relay.own_fds() if relay else ()),
                relay.child_fds() if relay else None, end_group)
        except BaseException:
            if relay is not None:
                relay.close_unforked()
            raise
        if relay is not None:
            relay.forked()
            supervisor.relay, supervisor.tty = relay, tty
        if on_start is not None:
            on_start()
        try:
            outcome = supervisor.wait(guard, report)
            if stop is not None and tty is not None and outcome.kind == "signaled" and (
                    outcome.status == 128 + signal.SIGINT):
                stop.note(signal.SIGINT, forwarded=True)  # Ctrl-C: to the command alone
            if end_group:
                _guard.await_group_end(guard, supervisor.reap_all)
            return outcome
        finally:
            if kept is None:
                os.close(report)
            else:
                kept.ended(supervisor.kept, lease is not None and lease.stranded)
            if tty is not None:
                _guard.take_terminal(tty, os.getpgrp())
            if relay is not None:
                relay.end(0.0)  # on the way out of an error: no waiting for the rest


def _relay(output_tail: int) -> Relay | None:
    """A once.run.relay.Relay when a stream is to be relayed, else None (imported only then)."""
    if output_tail <= 0:
        return None
    from once.run.relay import Relay

    relay = Relay(output_tail)
    return relay if relay.active else None


def _beat(lease: Lease | None) -> Callable[[], float] | None:
    """What keeps the claim alive while a catch-up's new guard starts (once.run.keeper): the
    heartbeat starts with the command, and a guard slow to say hello (a loaded machine, a
    stop) would let a short --stale-after lapse. Renews when due, as _fresh does; the time
    to the next renewal (a lease lost or past its deadline is left to _fresh)."""
    if lease is None:
        return None

    def beat() -> float:
        if lease.lost or lease.expired or lease.stepping_down:
            return float("inf")  # nothing to renew
        if lease_now() >= lease.next_renewal(not lease.last_error):
            lease.renew_once()
        return max(0.0, lease.next_renewal(not lease.last_error) - lease_now())

    return beat


def _fresh(lease: Lease, grace: float) -> bool:
    """Whether the lease leaves the command's first renewal its chance; renewed if need be.

    The claim may have taken longer than a renewal interval (a loaded machine, a first use
    that created the tables): the SIGTERM before the deadline could then be due before the
    first renewal was even sent. Renewed here, once, before the command starts; a command
    that would be stopped at once is not started at all.
    """
    if lease_now() >= lease.next_renewal(True):
        lease.renew_once()
    return not lease.lost and lease_now() < lease.deadline - grace


def _title(env: dict[str, str]) -> str:
    """The guard's name in ps: once-guard JOB PERIOD[#SHARD]."""
    shard = env.get("ONCE_SHARD")
    period = env.get("ONCE_PERIOD", "") + (f"#{shard}" if shard else "")
    return " ".join(["once-guard", env.get("ONCE_JOB", ""), period]).strip()


# -- the wrapper's side ------------------------------------------------------------------------


class _Supervisor:
    """The I/O shell around once.run.machine: it feeds the machine what happened (the guard's
    report, signals, the clock, the lease) and performs what it says (killpg, the lease's
    step-down, the heartbeat, the guard's reaping)."""

    def __init__(self, lease: Lease | None, grace: float, timeout: float | None,
                 keeper: Keeper | None = None, end_group: bool = False) -> None:
        self.guard, self.report = 0, -1
        self.guard_status: int | None = None
        self.lease, self.grace, self.timeout = lease, grace, timeout
        self.kept_guard = keeper is not None  # its deadline pipe is its keeper's
        self.end_group = end_group
        self.state = self._start()
        self.pending: list[int] = []
        self.received: list[int] = []  # every stop signal, in order
        self.interrupted = False  # one of them reached the command
        # As PID 1 (a container's init) we inherit every orphan of the command's tree and
        # must reap them as they die; otherwise we wait for the guard alone, so that a
        # program importing once keeps the statuses of its own children.
        self.reap_all = os.getpid() == 1
        # A signal ignored when once started (nohup, a shell's background job) stays
        # ignored by the command and is not forwarded.
        self.ignored = frozenset(sig for sig in FORWARDED
                                 if signal.getsignal(sig) == signal.SIG_IGN)
        self.relay: Relay | None = None  # its idle pipes are watched here (once.run.relay)
        self.stop: Stop | None = None  # a run of several commands': told of every stop signal
        self.tty: int | None = None  # the terminal to take back before the relay's last bytes
        self.stop_heartbeat = threading.Event()
        # Started when the first renewal is due: a command that ends sooner (most of a
        # catch-up's) never needs it, nor the cost of creating it.
        self.beat: threading.Thread | None = None
        # The longest overrun of the loop's waits since the lease's last renewal went out
        # (`stall_since`: that renewal's time): a wait overrun by seconds means this process
        # was stopped (SIGSTOP, a suspend) or starved meanwhile (Lease.step_down_reason).
        self.longest_overrun = 0.0
        self.stall_since = 0.0
        # The heartbeat thread's overrun when it woke past the step-down's moment after a stall
        # and sent nothing (_heartbeat): the renewal it would have sent resets the loop's.
        self.beat_overrun = 0.0
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        # The guard keeps its own copy of the lease's deadline, renewed through this pipe,
        # and stops the command itself when it passes: a stopped or wedged wrapper cannot.
        self.deadline_r, self.deadline_w = (-1, -1) if lease is None else (
            keeper.deadline if keeper is not None and keeper.deadline else _deadline_pipe())

    @property
    def kept(self) -> bool:
        """A kept guard (once.run.keeper) said `ready` and waits for the next period."""
        return self.state.kept

    def watch(self) -> _guard.Watch | None:
        """What the guard needs to step down on its own: (pipe, deadline, grace)."""
        if self.lease is None:
            return None
        return self.deadline_r, self.lease.deadline, self.grace

    def own_fds(self) -> tuple[int, ...]:
        """The wrapper's pipe ends, which the guard closes (it keeps deadline_r)."""
        return tuple(fd for fd in (self.wake_r, self.wake_w, self.deadline_w) if fd >= 0)

    @contextmanager
    def signals(self) -> Iterator[None]:
        handled = [sig for sig in FORWARDED if sig not in self.ignored]
        if self.reap_all:
            handled.append(signal.SIGCHLD)
        previous = {sig: signal.signal(sig, self._on_signal) for sig in handled}
        old_wakeup = signal.set_wakeup_fd(self.wake_w)
        try:
            yield
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            os.close(self.wake_r)
            os.close(self.wake_w)
            for fd in (self.deadline_r, self.deadline_w):
                if fd >= 0 and not self.kept_guard:  # a kept guard's pipe is its keeper's
                    os.close(fd)
            if self.received and not self.interrupted:
                # None reached the command (it had ended): once's own, for the caller's
                # handler, as if it came just now (held_back: once dies of it once the result
                # is written). After one the command had, the rest change nothing (held_back
                # would take a second signal for an order to end at once).
                signal.raise_signal(self.received[0])

    def wait(self, guard: int, report: int) -> Outcome:
        self.guard, self.report = guard, report
        self.state = self._start()
        try:
            self._loop()
            output = self._deliver() if self.relay is not None else None
            if self.pending:
                self._stop_leftovers(self.pending[0])
        finally:
            self.stop_heartbeat.set()
            self._release()
        beat = self.beat
        if beat is not None and beat.is_alive():
            # A renewal in flight normally returns at once; one stuck in a hung server is
            # left behind (the final write waits for the lease's lock, up to the deadline).
            assert self.lease is not None
            beat.join(max(1.0, self.lease.deadline - lease_now()))
            self.lease.stranded = beat.is_alive()
        outcome, actions = machine.outcome(self.state, self.guard_status)
        self._perform(actions)
        self.interrupted = outcome.interrupted_by is not None
        if self.interrupted and self.stop is not None:  # the command had it: once ends as it did
            self.stop.note(self.received[0], forwarded=True)
        return replace(outcome, output=output)

    def _start(self) -> machine.State:
        return machine.start(lease_now(), self.grace, self.timeout, self.kept_guard,
                             self.end_group)

    def _terms(self) -> machine.Terms | None:
        lease = self.lease
        if lease is None:
            return None
        return machine.Terms(lease.deadline, lease.lost, lease.last_sent, lease.interval)

    def _loop(self) -> None:
        """Wait for the guard's report while acting on signals, timers and the lease."""
        while self.state.phase is not machine.Phase.GONE:
            idle = self.relay.idle() if self.relay is not None else []
            pause = min(_guard.MAX_SLEEP, machine.next_timer(self.state, lease_now(),
                                                              self._terms()))
            wake_by = lease_now() + pause
            readable = _guard.ready([self.report, self.wake_r, *idle], pause)
            self._overran(lease_now() - wake_by)
            for fd in set(readable).intersection(idle):
                self.relay.stirred(fd)  # type: ignore[union-attr]  # the command spoke
            if self.wake_r in readable:
                os.read(self.wake_r, 512)
            events: list[machine.Event] = []
            if self.report in readable:  # b"": the guard is gone, its report complete
                events.append(machine.Report(os.read(self.report, 512)))
            if self.reap_all:
                self._reap(block=False)
            signals = self.pending[:]
            del self.pending[:len(signals)]  # one bytecode: a signal handled meanwhile stays
            # Before a signal goes to the command: has it exited? Asked of the kernel, then
            # of the report (which the guard writes before it goes: a guard gone since the
            # kernel was asked has left it there). Then it is once's own (machine.step).
            gone = bool(signals) and _guard.command_gone(self.guard)
            if signals and _guard.ready([self.report], 0):
                events.append(machine.Report(os.read(self.report, 512)))
            events += (machine.Signal(number, gone) for number in signals)
            self.state, actions = machine.step(self.state, lease_now(), self._terms(), *events)
            self._perform(actions)

    def _overran(self, seconds: float) -> None:
        """Keep the longest overrun since the last renewal went out: the guard's own step-down
        at the deadline comes to the wrapper with its report, a few waits after the stop."""
        if self.lease is not None and self.stall_since != self.lease.last_sent:
            self.longest_overrun, self.stall_since = 0.0, self.lease.last_sent
        self.longest_overrun = max(self.longest_overrun, seconds)

    def _perform(self, actions: list[machine.Action]) -> None:
        for action in actions:
            if isinstance(action, machine.Kill):
                # Sent before the guard is reaped (_release): the group's number, the
                # guard's pid, is no stranger's.
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.guard, action.number)
            elif isinstance(action, machine.StepDown):
                assert self.lease is not None
                self.lease.step_down_reason(max(self.longest_overrun, self.beat_overrun))
            elif isinstance(action, machine.Beat):
                self.beat = threading.Thread(target=self._heartbeat, daemon=True)
                self.beat.start()
            else:
                self._reap(block=True)

    def _deliver(self) -> bytes:
        """The command has ended: the relay delivers what it left in the pipes (once.run.relay),
        at the reader's pace, while the claim is renewed as it was while the command ran: a
        slow reader of once's output holds the period as it would have held the command.
        Cut short by a signal to once, or by the lease's loss: the result comes first. A
        command that once was stopping (a forwarded signal, --timeout, a step-down) had the
        grace to end; its output gets as long (at least DRAIN), so that a reader that never
        reads cannot keep `systemctl stop` or --timeout from being recorded."""
        from once.run.relay import DRAIN

        relay = self.relay
        assert relay is not None
        if self.tty is not None:  # `once run ... | less`: less reads the keyboard meanwhile
            _guard.take_terminal(self.tty, os.getpgrp())
        relay.end()
        lease = self.lease
        stopped_at = self.state.stopped_at
        until = (None if stopped_at is None
                 else max(stopped_at + self.grace, lease_now() + DRAIN))
        while relay.running() and not self.pending:
            now = lease_now()
            if until is not None and now >= until:
                break
            if lease is not None:
                if lease.lost or lease.expired:
                    break
                self.state, actions = machine.beat_due(self.state, now, self._terms())
                self._perform(actions)
            relay.join(0.2 if until is None else min(0.2, until - now))
        return relay.output()

    def _stop_leftovers(self, number: int) -> None:
        """A stop signal while the output was delivered (the command had ended, and what it
        left holds its pipe): once's own, as one the loop takes after the command's end
        (machine.step), and what the command left in its group gets it, then SIGKILL, as
        there. (It ran on after once had died of the signal: an outside attacker's finding.)
        A kept guard waiting for the next period has nothing of the command's in its group
        (it is kept only then): it is left alone. The guard is not reaped yet (_release): the
        group's number is no stranger's."""
        if self.state.kept:
            return
        for sig in (number, signal.SIGKILL):
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.guard, sig)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGCHLD:
            self.pending.append(signum)
            self.received.append(signum)

    def _heartbeat(self) -> None:
        assert self.lease is not None
        # Signals are the main thread's business: keep them from interrupting a statement.
        signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD})
        lease = self.lease
        ok = True
        while True:
            # Every --stale-after/3 counted from when the last renewal was sent; after a
            # failure, sooner (Lease.pause).
            due = lease.next_renewal(ok)
            if self.stop_heartbeat.wait(max(0.0, due - lease_now())):
                return
            if self._stalled_past_step_down(lease_now() - due):
                return
            ok = lease.renew_once()
            if ok:
                with suppress(OSError):  # the guard is gone (or its pipe full: it is awake)
                    os.write(self.deadline_w, f"{lease.deadline!r}\n".encode())
            if lease.lost or lease.expired:
                self._wake(b"h")
                return

    def _stalled_past_step_down(self, overrun: float) -> bool:
        """Whether this thread woke STALLED late (stopped, suspended, starved) and past the
        step-down's moment, a grace before the deadline: the guard's own step-down began
        then and is never undone, so a renewal would only hold the period for a command
        being stopped, and reset the loop's overrun that names the stop. The loop is woken
        to step down, with this overrun."""
        assert self.lease is not None
        if overrun <= STALLED or lease_now() < self.lease.deadline - self.grace:
            return False
        self.beat_overrun = overrun
        self._wake(b"h")
        return True

    def _wake(self, byte: bytes) -> None:
        with suppress(OSError):  # the pipe is full: the loop is awake anyway
            os.write(self.wake_w, byte)

    def _reap(self, block: bool) -> None:
        """Take the guard's status without reaping it (block: wait for it), and as PID 1 reap
        every other child that has ended. Unreaped, the guard keeps its pid, the number of
        its group, from any newcomer until _release, after the group's last signal (an outside
        attacker's finding: a signal sent after its reap, the group emptied, hit a newcomer)."""
        while self.guard_status is None:
            flags = os.WEXITED | os.WNOWAIT | (0 if block else os.WNOHANG)
            try:
                ended = (os.waitid(os.P_ALL, 0, flags) if self.reap_all
                         else os.waitid(os.P_PID, self.guard, flags))
            except ChildProcessError:
                return
            if ended is None:
                return
            if ended.si_pid == self.guard:
                self.guard_status = _guard.wait_status(ended)
            else:  # an orphan (PID 1); the first ended child is looked at first
                os.waitpid(ended.si_pid, 0)
                launch.watcher_reaped(ended.si_pid)

    def _release(self) -> None:
        """Reap the guard, whose status _reap took (and, as PID 1, what ended meanwhile): once,
        at the end of wait()."""
        if self.guard_status is not None:
            launch.end_watchers()  # before the group's number is free
            with suppress(ChildProcessError):
                os.waitpid(self.guard, 0)
            if self.reap_all:
                _guard.reap_ended()


def _deadline_pipe() -> tuple[int, int]:
    pipe = os.pipe()
    os.set_blocking(pipe[1], False)
    return pipe


def _foreground_tty() -> int | None:
    """fd 0 when we run in the foreground of a terminal (the command should, too)."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None

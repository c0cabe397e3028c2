"""The child: start it, keep its claim (once.lease) alive, stop it when the claim is lost.
No SQL here.

The command runs under a guard process (once.guard): the guard dies with the wrapper and
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

import errno
import os
import signal
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from once import guard as _guard
from once.deadlines import lease_now, max_grace
from once.lease import Lease
from once.outcomes import Kind

if TYPE_CHECKING:
    from once.relay import Relay

FORWARDED = _guard.FORWARDED


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


def run(
    command: Sequence[str],
    env: dict[str, str],
    lease: Lease | None,
    kill_after: float = 10.0,
    timeout: float | None = None,
    on_start: Callable[[], None] | None = None,
    output_tail: int = 0,
) -> Outcome:
    """Run command to its end (or ours) under lease; return how it ended.

    kill_after is cut to fit the lease (once.deadlines.max_grace): the command must be dead
    by the lease's deadline. on_start is called once the command is on its way (after the
    fork: it may start threads). output_tail: keep the last bytes of the command's stdout and
    stderr where they are not a terminal (once.relay); 0: leave them alone.
    """
    tty = _foreground_tty()
    grace = kill_after if lease is None else min(kill_after, max_grace(lease.stale_after))
    if lease is not None and not _fresh(lease, grace):
        lease.step_down_reason()
        return Outcome("fenced-out", 0, message="the command was not started")
    supervisor = _Supervisor(lease, grace, timeout)
    relay = _relay(output_tail)
    # Handlers go in before the fork: a signal that arrives while the guard starts is
    # forwarded, not lost (nor fatal to a wrapper whose guard would then kill the command).
    with supervisor.signals():
        try:
            guard, report = _guard.spawn(
                list(command), env, tty, _title(env), supervisor.ignored, supervisor.watch(),
                supervisor.own_fds() + (relay.own_fds() if relay else ()),
                relay.child_fds() if relay else None)
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
            return supervisor.wait(guard, report)
        finally:
            os.close(report)
            if tty is not None:
                _guard.take_terminal(tty, os.getpgrp())
            if relay is not None:
                relay.end(0.0)  # on the way out of an error: no waiting for the rest


def _relay(output_tail: int) -> Relay | None:
    """A once.relay.Relay when a stream is to be relayed, else None (imported only then)."""
    if output_tail <= 0:
        return None
    from once.relay import Relay

    relay = Relay(output_tail)
    return relay if relay.active else None


def _fresh(lease: Lease, grace: float) -> bool:
    """Whether the lease leaves the command's first renewal its chance; renewed if need be.

    The claim may have taken longer than a renewal interval (a loaded machine, a first use
    that created the tables): the SIGTERM before the deadline could then be due before the
    first renewal was even sent. Renewed here, once, before the command starts; a command
    that would be stopped at once is not started at all.
    """
    if lease_now() >= lease.last_sent + lease.interval:
        lease.renew_once()
    return not lease.lost and lease_now() < lease.deadline - grace


def _title(env: dict[str, str]) -> str:
    """The guard's name in ps: once-guard JOB PERIOD[#SHARD]."""
    shard = env.get("ONCE_SHARD")
    period = env.get("ONCE_PERIOD", "") + (f"#{shard}" if shard else "")
    return " ".join(["once-guard", env.get("ONCE_JOB", ""), period]).strip()


# -- the wrapper's side ------------------------------------------------------------------------


class _Supervisor:
    def __init__(self, lease: Lease | None, grace: float, timeout: float | None) -> None:
        self.guard, self.report = 0, -1
        self.guard_status: int | None = None
        self.lease, self.grace, self.timeout = lease, grace, timeout
        self.timeout_at: float | None = None
        self.kill_at: float | None = None
        self.killed = False  # SIGKILL went to the group
        self.killed_first = False  # ... before the guard ended: its death is ours
        self.ended = False  # the guard reported the command's end
        self.why: Kind | None = None  # timed-out or fenced-out, once we decided to stop it
        self.forwarded: int | None = None
        self.stopped_at: float | None = None  # when the command was first told to stop
        self.pending: list[int] = []
        # As PID 1 (a container's init) we inherit every orphan of the command's tree and
        # must reap them as they die; otherwise we wait for the guard alone, so that a
        # program importing once keeps the statuses of its own children.
        self.reap_all = os.getpid() == 1
        # A signal ignored when once started (nohup, a shell's background job) stays
        # ignored by the command and is not forwarded.
        self.ignored = frozenset(sig for sig in FORWARDED
                                 if signal.getsignal(sig) == signal.SIG_IGN)
        self.relay: Relay | None = None  # its idle pipes are watched here (once.relay)
        self.tty: int | None = None  # the terminal to take back before the relay's last bytes
        self.stop_heartbeat = threading.Event()
        # Started when the first renewal is due: a command that ends sooner (most of a
        # catch-up's) never needs it, nor the cost of creating it.
        self.beat: threading.Thread | None = None
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        # The guard keeps its own copy of the lease's deadline, renewed through this pipe,
        # and stops the command itself when it passes: a stopped or wedged wrapper cannot.
        self.deadline_r, self.deadline_w = os.pipe() if lease is not None else (-1, -1)
        if lease is not None:
            os.set_blocking(self.deadline_w, False)

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
                if fd >= 0:
                    os.close(fd)

    def wait(self, guard: int, report: int) -> Outcome:
        self.guard, self.report = guard, report
        self.timeout_at = lease_now() + self.timeout if self.timeout else None
        try:
            text = self._loop()
            output = self._deliver() if self.relay is not None else None
        finally:
            self.stop_heartbeat.set()
        beat = self.beat
        if beat is not None and beat.is_alive():
            # A renewal in flight normally returns at once; one stuck in a hung server is
            # left behind (the final write waits for the lease's lock, up to the deadline).
            assert self.lease is not None
            beat.join(max(1.0, self.lease.deadline - lease_now()))
            self.lease.stranded = beat.is_alive()
        return replace(self._outcome(text), output=output)

    def _deliver(self) -> bytes:
        """The command has ended: the relay delivers what it left in the pipes (once.relay),
        at the reader's pace, while the claim is renewed as it was while the command ran: a
        slow reader of once's output holds the period as it would have held the command.
        Cut short by a signal to once, or by the lease's loss: the result comes first. A
        command that once was stopping (a forwarded signal, --timeout, a step-down) had the
        grace to end; its output gets as long (at least DRAIN), so that a reader that never
        reads cannot keep `systemctl stop` or --timeout from being recorded."""
        from once.relay import DRAIN

        relay = self.relay
        assert relay is not None
        if self.tty is not None:  # `once run ... | less`: less reads the keyboard meanwhile
            _guard.take_terminal(self.tty, os.getpgrp())
        relay.end()
        lease = self.lease
        until = (None if self.stopped_at is None
                 else max(self.stopped_at + self.grace, lease_now() + DRAIN))
        while relay.running() and not self.pending:
            now = lease_now()
            if until is not None and now >= until:
                break
            if lease is not None:
                if lease.lost or lease.expired:
                    break
                self._beat_if_due(now)
            relay.join(0.2 if until is None else min(0.2, until - now))
        return relay.output()

    def _on_signal(self, signum: int, _frame: object) -> None:
        if signum != signal.SIGCHLD:
            self.pending.append(signum)

    def _heartbeat(self) -> None:
        assert self.lease is not None
        # Signals are the main thread's business: keep them from interrupting a statement.
        signal.pthread_sigmask(signal.SIG_BLOCK, {*FORWARDED, signal.SIGCHLD})
        lease = self.lease
        ok = True
        while True:
            # Every --stale-after/3 counted from when the last renewal was sent; after a
            # failure, sooner (Lease.pause).
            if self.stop_heartbeat.wait(max(0.0, lease.last_sent + lease.pause(ok) - lease_now())):
                return
            ok = lease.renew_once()
            if ok:
                with suppress(OSError):  # the guard is gone (or its pipe full: it is awake)
                    os.write(self.deadline_w, f"{lease.deadline!r}\n".encode())
            if lease.lost or lease.expired:
                self._wake(b"h")
                return

    def _wake(self, byte: bytes) -> None:
        with suppress(OSError):  # the pipe is full: the loop is awake anyway
            os.write(self.wake_w, byte)

    def _loop(self) -> str:
        """Wait for the guard's report while acting on signals, timers and the lease."""
        chunks = b""
        while True:
            idle = self.relay.idle() if self.relay is not None else []
            readable = _guard.ready([self.report, self.wake_r, *idle], self._next_timer())
            for fd in set(readable).intersection(idle):
                self.relay.stirred(fd)  # type: ignore[union-attr]  # the command spoke
            if self.wake_r in readable:
                os.read(self.wake_r, 512)
            data = os.read(self.report, 512) if self.report in readable else None
            chunks += data or b""
            gone = data == b""  # the guard is gone: its report, if any, is complete
            self.killed_first = self.killed
            # The command's end, once reported, is not undone by a timer that fires with it.
            self.ended = any(not line.startswith(b"started") for line in chunks.splitlines())
            self._act()
            if gone:
                if (not self.ended or self.why is not None or self.forwarded is not None
                        or b"lapsed " in chunks):
                    # The guard died before the command's end (killed: the command got its
                    # parent-death signal), or we were stopping the command and it has
                    # ended: nothing it started may carry on (a shell's child that ignores
                    # SIGTERM, say). A SIGKILL cannot be caught: once it is sent, no process
                    # of the group runs another instruction of its own. Sent before the
                    # guard is reaped, while its pid (the group's id) cannot be reused.
                    self._killpg(signal.SIGKILL)
                self._reap(block=True)
                return chunks.decode()

    def _next_timer(self) -> float:
        now = lease_now()
        times = [t for t in (self.kill_at, None if self.ended else self.timeout_at)
                 if t is not None]
        lease = self.lease
        if lease is not None and not self.killed:
            times.append(lease.deadline)  # SIGKILL, whatever else is going on
            if self.why is None and not self.ended:
                times.append(lease.deadline - self.grace)  # the step-down's SIGTERM
            if self.beat is None:
                times.append(lease.last_sent + lease.interval)
        # Every timer that has fired is cleared (or, the deadline, no longer listed once the
        # group is killed): a past one would keep this loop from ever sleeping.
        return min(_guard.MAX_SLEEP, max(0.0, min(times, default=now + 3600) - now))

    def _act(self) -> None:
        if self.reap_all:
            self._reap(block=False)
        now = lease_now()
        while self.pending:
            sig = self.pending.pop(0)
            self.forwarded = sig
            self._stop(sig, now)
        self._beat_if_due(now)
        lease = self.lease
        if (lease is not None and self.why is None and not self.ended
                and (lease.lost or now >= lease.deadline - self.grace)):
            self.why = "fenced-out"
            lease.step_down_reason()
            self._stop(signal.SIGTERM, now)
        if self.timeout_at is not None and now >= self.timeout_at and not self.ended:
            self.timeout_at = None
            if self.why is None:
                self.why = "timed-out"
                self._stop(signal.SIGTERM, now)
        dead_line = lease is not None and now >= lease.deadline
        if (self.kill_at is not None and now >= self.kill_at) or (dead_line and not self.killed):
            self._killpg(signal.SIGKILL)
            self.kill_at = None

    def _beat_if_due(self, now: float) -> None:
        """Start the heartbeat thread when the first renewal is due."""
        lease = self.lease
        if (lease is not None and self.beat is None
                and now >= lease.last_sent + lease.interval):
            self.beat = threading.Thread(target=self._heartbeat, daemon=True)
            self.beat.start()

    def _stop(self, sig: int, now: float) -> None:
        """Send sig to the command's group now; SIGKILL follows after the grace."""
        self._killpg(sig)
        if self.stopped_at is None:
            self.stopped_at = now
        if self.kill_at is None and not self.killed:
            self.kill_at = now + self.grace

    def _killpg(self, sig: int) -> None:
        # The group keeps the guard's pid as its id while any member lives, even after the
        # guard is reaped, so this never reaches a stranger.
        if sig == signal.SIGKILL:
            self.killed = True
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.guard, sig)

    def _reap(self, block: bool) -> None:
        """Collect the guard's status (and, as PID 1, every orphan's)."""
        while self.guard_status is None or self.reap_all:
            target = -1 if self.reap_all else self.guard
            waiting = block and self.guard_status is None
            try:
                pid, status = os.waitpid(target, 0 if waiting else os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.guard:
                self.guard_status = status

    def _outcome(self, report: str) -> Outcome:
        lines = report.splitlines()
        started = "started" in lines
        last = next((line for line in reversed(lines) if line != "started"), "")
        if not last:
            return self._guard_death(started)
        lapsed = last.startswith("lapsed ")  # the guard stepped down at the deadline
        if lapsed and self.why is None:
            self.why = "fenced-out"
            if self.lease is not None:
                self.lease.step_down_reason()
        word, _, value = last.removeprefix("lapsed ").strip().partition(" ")
        number = int(value) if value.lstrip("-").isdigit() else 1
        if word == "exec":
            code = 127 if number == errno.ENOENT else 126
            return Outcome("exec-failed", code, message=os.strerror(number))
        status = 128 + number if word == "signal" else number
        kind: Kind = self.why or ("signaled" if word == "signal" else "exited")
        return Outcome(kind, status, self.forwarded)

    def _guard_death(self, started: bool) -> Outcome:
        """The guard ended without its last line: it failed, or was killed."""
        status = self.guard_status
        if not started:
            return Outcome("exec-failed", 126, message="once's guard process failed")
        killed = 128 + signal.SIGKILL
        if self.why is not None or self.killed_first:
            # Ours: we were stopping the command, or our SIGKILL reached the guard with it.
            return Outcome(self.why or "signaled", killed, self.forwarded)
        if status is not None and os.WIFSIGNALED(status):
            how = f"was killed by signal {os.WTERMSIG(status)}"
        else:
            code = os.waitstatus_to_exitcode(status) if status is not None else "unknown"
            how = f"failed (status {code})"
        return Outcome("guard-died", killed, self.forwarded,
                       message=f"once's guard process {how}; the command was killed with it")


def _foreground_tty() -> int | None:
    """fd 0 when we run in the foreground of a terminal (the command should, too)."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None

"""The child: start it, keep its claim alive, stop it when the claim is lost. No SQL here.

Process tree while a command runs:

    once (wrapper)            heartbeats, signals, timeout, deadline
     └─ guard                 process-group leader; dies with the wrapper and takes the
         └─ COMMAND ...       whole group with it (a shell's own children included)

The guard exists because Linux delivers a parent-death signal only to the process that asked
for it: set on COMMAND itself, a shell's grandchildren would outlive a wrapper killed by
SIGKILL. The guard asks for SIGUSR1 when the wrapper dies and answers it by killing its own
process group, which COMMAND and everything it starts share (unless they leave it with setsid).
On systems without prctl (not Linux) there is no guard-side protection: COMMAND survives a
wrapper killed by SIGKILL, and only the ledger's staleness protects the period.

The wrapper forwards SIGTERM, SIGINT and SIGHUP to the group, escalates to SIGKILL after
--kill-after, and steps down (kills the group, reports FENCED_OUT) when a renewal finds the row
taken or when renewals keep failing past the local deadline: the moment the last successful
renewal was *sent* plus --stale-after, on the monotonic clock.
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Literal, TypeVar

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1

Kind = Literal["exited", "signaled", "exec-failed", "timed-out", "fenced-out"]


@dataclass(frozen=True)
class Outcome:
    """How the command ended, kept apart as runitor does: exit, signal, exec failure, ours."""

    kind: Kind
    status: int  # the command's status as a shell reports it (128+N for signal N)
    interrupted_by: int | None = None  # a signal we forwarded to it
    message: str = ""

    @property
    def succeeded(self) -> bool:
        return self.kind == "exited" and self.status == 0 and self.interrupted_by is None


T = TypeVar("T")


class NoAnswer(Exception):
    """The ledger did not answer a statement before the lease's deadline."""


class Lease:
    """The claim as its owner sees it: renewed by a callback, lost on 'no row' or deadline."""

    def __init__(self, renew: Callable[[], bool], stale_after: float, sent_at: float) -> None:
        self._renew = renew
        self.stale_after = stale_after
        self.deadline = sent_at + stale_after
        self.last_sent = sent_at
        self.lost = False
        self.last_error: str = ""
        # Held while a statement is in the ledger: the heartbeat thread and the final write
        # share one connection, and a renewal stuck in a hung server must not be joined by
        # another statement on it.
        self.lock = threading.Lock()

    @property
    def interval(self) -> float:
        return self.stale_after / 3

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.deadline

    def renew_once(self) -> bool:
        """One renewal; True when it succeeded. Sets `lost` when the row is no longer ours."""
        with self.lock:
            sent = self.last_sent = time.monotonic()
            try:
                ours = self._renew()
            except Exception as exc:  # unreachable ledger: keep trying until the deadline
                self.last_error = str(exc)
                return False
        if ours:
            if not self.expired:  # an answer that came too late does not undo a step-down
                self.last_error = ""
            self.deadline = max(self.deadline, sent + self.stale_after)
        else:
            self.lost = True
        return ours

    @staticmethod
    def now() -> float:
        """The clock of every lease deadline."""
        return time.monotonic()

    def call(self, action: Callable[[], T], until: float | None = None) -> T:
        """Run one ledger statement under the lock; raise NoAnswer at `until` (default: the
        deadline).

        A driver may wait for ever on a server that stopped answering (psycopg has no
        client-side statement timeout): the statement then runs on a helper thread, which is
        left behind. Past `until` it still gets a short wait of its own.
        """
        floor = max(1.0, min(10.0, self.interval))  # as once.core.statement_timeout
        limit = self.deadline if until is None else until
        if not self.lock.acquire(timeout=max(floor, limit - time.monotonic())):
            raise NoAnswer("a renewal got no answer from the ledger")
        box: list[T] = []
        error: list[BaseException] = []

        def work() -> None:
            try:
                box.append(action())
            except BaseException as exc:  # handed to the caller
                error.append(exc)
            finally:
                self.lock.release()

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(max(floor, limit - time.monotonic()))
        if worker.is_alive():
            raise NoAnswer("the final write got no answer from the ledger")
        if error:
            raise error[0]
        return box[0]

    def keep_alive(self, stop: threading.Event) -> None:
        """Renew every stale_after/3, counted from when the last renewal was sent (sooner
        after a failure, but never hammering a dead server), until stop is set, the row is
        lost or the deadline passes. For a thread of its own (the Python API's)."""
        ok = True
        while not (self.lost or self.expired):
            pause = self.interval if ok else min(self.interval, 1.0)
            if stop.wait(max(0.0, self.last_sent + pause - self.now())):
                return
            ok = self.renew_once()

    def step_down_reason(self) -> None:
        """Past the deadline with no error seen: a renewal is still waiting for an answer."""
        if not self.lost and not self.last_error:
            self.last_error = "a renewal got no answer from the ledger"


def run(
    command: Sequence[str],
    env: dict[str, str],
    lease: Lease | None,
    kill_after: float = 10.0,
    timeout: float | None = None,
    on_start: Callable[[], None] | None = None,
) -> Outcome:
    """Run command to its end (or ours) under lease; return how it ended.

    on_start is called once the command is on its way (after the fork: it may start threads).
    """
    tty = _foreground_tty()
    supervisor = _Supervisor(lease, kill_after, timeout)
    # Handlers go in before the fork: a signal that arrives while the guard starts is
    # forwarded, not lost (nor fatal to a wrapper whose guard would then kill the command).
    with supervisor.signals():
        guard, report = _spawn_guard(list(command), env, tty, supervisor.ignored,
                                     supervisor.watch())
        if on_start is not None:
            on_start()
        try:
            return supervisor.wait(guard, report)
        finally:
            os.close(report)
            if tty is not None:
                _take_terminal(tty, os.getpgrp())


# -- the wrapper's side ------------------------------------------------------------------------


class _Supervisor:
    def __init__(self, lease: Lease | None, kill_after: float, timeout: float | None) -> None:
        self.guard, self.report = 0, -1
        self.guard_status: int | None = None
        self.lease, self.kill_after, self.timeout = lease, kill_after, timeout
        self.timeout_at: float | None = None
        self.kill_at: float | None = None
        self.why: Kind | None = None  # timed-out or fenced-out, once we decided to stop it
        self.forwarded: int | None = None
        self.pending: list[int] = []
        # As PID 1 (a container's init) we inherit every orphan of the command's tree and
        # must reap them as they die; otherwise we wait for the guard alone, so that a
        # program importing once keeps the statuses of its own children.
        self.reap_all = os.getpid() == 1
        # A signal ignored when once started (nohup, a shell's background job) stays
        # ignored by the command and is not forwarded.
        self.ignored = frozenset(sig for sig in FORWARDED
                                 if signal.getsignal(sig) == signal.SIG_IGN)
        self.stop_heartbeat = threading.Event()
        self.beat = threading.Thread()  # replaced in wait()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        # The guard keeps its own copy of the lease's deadline, renewed through this pipe,
        # and stops the command itself when it passes: a stopped or wedged wrapper cannot.
        self.deadline_r, self.deadline_w = os.pipe() if lease is not None else (-1, -1)
        if lease is not None:
            os.set_blocking(self.deadline_w, False)

    def watch(self) -> tuple[int, float, float] | None:
        """What the guard needs to step down on its own: (pipe, deadline, --kill-after)."""
        if self.lease is None:
            return None
        return self.deadline_r, self.lease.deadline, self.kill_after

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
        self.timeout_at = time.monotonic() + self.timeout if self.timeout else None
        # The heartbeat thread starts when the first renewal is due: a command that ends
        # sooner (most of a catch-up's) never needs it.
        self.beat = threading.Thread(target=self._heartbeat, daemon=True)
        try:
            text = self._loop()
        finally:
            self.stop_heartbeat.set()
        beat = self.beat
        if beat.is_alive():
            # A renewal in flight normally returns at once; one stuck in a hung server is
            # left behind (the final write waits for the lease's lock, up to the deadline).
            assert self.lease is not None
            beat.join(max(1.0, self.lease.deadline - time.monotonic()))
        return self._outcome(text)

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
            # failure, retry sooner, but never hammer a dead server.
            pause = lease.interval if ok else min(lease.interval, 1.0)
            if self.stop_heartbeat.wait(max(0.0, lease.last_sent + pause - time.monotonic())):
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
            readable, _, _ = select.select([self.report, self.wake_r], [], [], self._next_timer())
            if self.wake_r in readable:
                os.read(self.wake_r, 512)
            self._act()
            if self.report in readable:
                data = os.read(self.report, 512)
                chunks += data
                if not data:  # the guard is gone: its report, if any, is complete
                    self._reap(block=True)
                    if (self.why is not None or self.forwarded is not None
                            or chunks.startswith(b"lapsed ")):
                        # We were stopping the command and it has ended: nothing it started
                        # may carry on (a shell's child that ignores SIGTERM, say).
                        self._killpg(signal.SIGKILL)
                    return chunks.decode() or self._guard_death()

    def _next_timer(self) -> float:
        now = time.monotonic()
        times = [t for t in (self.timeout_at, self.kill_at) if t is not None]
        if self.lease is not None and self.why is None:
            times.append(self.lease.deadline)
            if self.beat.ident is None:
                times.append(self.lease.last_sent + self.lease.interval)
        return max(0.0, min(times) - now) if times else 3600.0

    def _act(self) -> None:
        if self.reap_all:
            self._reap(block=False)
        now = time.monotonic()
        while self.pending:
            sig = self.pending.pop(0)
            self.forwarded = sig
            self._stop(sig)
        lease = self.lease
        if (lease is not None and self.beat.ident is None
                and now >= lease.last_sent + lease.interval):
            self.beat.start()
        if lease is not None and self.why is None and (lease.lost or lease.expired):
            self.why = "fenced-out"
            lease.step_down_reason()
            self._stop(signal.SIGTERM)
        if self.timeout_at is not None and now >= self.timeout_at and self.why is None:
            self.why = "timed-out"
            self._stop(signal.SIGTERM)
        if self.kill_at is not None and now >= self.kill_at:
            self._killpg(signal.SIGKILL)
            self.kill_at = None

    def _stop(self, sig: int) -> None:
        """Send sig to the command's group now; SIGKILL follows after --kill-after."""
        self._killpg(sig)
        if self.kill_at is None:
            self.kill_at = time.monotonic() + self.kill_after

    def _killpg(self, sig: int) -> None:
        # The group keeps the guard's pid as its id while any member lives, even after the
        # guard is reaped, so this never reaches a stranger.
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

    def _guard_death(self) -> str:
        """The guard ended without a report: it was killed, with the whole group."""
        status = self.guard_status
        if status is not None and os.WIFEXITED(status):
            return "guard"  # it failed before it could start the command
        if status is not None and os.WIFSIGNALED(status):
            return f"signal {os.WTERMSIG(status)}"
        return "signal 9"

    def _outcome(self, report: str) -> Outcome:
        lapsed = report.startswith("lapsed ")  # the guard stepped down at the deadline
        if lapsed and self.why is None:
            self.why = "fenced-out"
            if self.lease is not None:
                self.lease.step_down_reason()
        word, _, value = report.removeprefix("lapsed ").strip().partition(" ")
        number = int(value) if value.lstrip("-").isdigit() else 1
        if word == "guard":
            return Outcome("exec-failed", 126, message="once's guard process failed")
        if word == "exec":
            code = 127 if number == errno.ENOENT else 126
            return Outcome("exec-failed", code, message=os.strerror(number))
        status = 128 + number if word == "signal" else number
        kind: Kind = self.why or ("signaled" if word == "signal" else "exited")
        return Outcome(kind, status, self.forwarded)


def _foreground_tty() -> int | None:
    """fd 0 when we run in the foreground of a terminal (the command should, too)."""
    try:
        if os.isatty(0) and os.tcgetpgrp(0) == os.getpgrp():
            return 0
    except OSError:
        pass
    return None


def _take_terminal(tty: int, pgrp: int) -> None:
    # A background group that calls tcsetpgrp gets SIGTTOU unless it blocks it.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(tty, pgrp)
    except OSError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# -- the guard's side --------------------------------------------------------------------------


def _spawn_guard(command: list[str], env: dict[str, str], tty: int | None,
                 ignored: frozenset[int] = frozenset(),
                 watch: tuple[int, float, float] | None = None) -> tuple[int, int]:
    """Fork the guard (before any thread starts); return its pid and its report pipe."""
    report_r, report_w = os.pipe()
    wrapper = os.getpid()
    pid = os.fork()
    if pid == 0:
        code = 70
        try:
            os.close(report_r)
            code = _guard(command, env, tty, wrapper, report_w, ignored, watch)
        finally:
            os._exit(code)
    os.close(report_w)
    # Set the group from both sides, so that killpg(pid) works whoever runs first.
    with suppress(OSError):
        os.setpgid(pid, pid)
    return pid, report_r


def _guard(command: list[str], env: dict[str, str], tty: int | None, wrapper: int,
           report: int, ignored: frozenset[int] = frozenset(),
           watch: tuple[int, float, float] | None = None) -> int:
    signal.set_wakeup_fd(-1)  # the wrapper's, inherited across the fork
    os.setpgid(0, 0)
    signal.signal(signal.SIGUSR1, _wrapper_died)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for sig in FORWARDED:  # the command gets these itself: it shares our group
        signal.signal(sig, signal.SIG_IGN if sig in ignored else _ignore)
    _set_parent_death_signal(signal.SIGUSR1)
    if os.getppid() != wrapper:  # the wrapper died before the signal was armed
        _wrapper_died(signal.SIGUSR1, None)
    if tty is not None:
        _take_terminal(tty, os.getpgrp())
    try:
        # Handlers set above reset to default in the command on exec; nothing is blocked,
        # and only what was ignored when once started stays ignored.
        child = subprocess.Popen(command, env=env)
    except OSError as exc:
        os.write(report, f"exec {exc.errno or errno.ENOEXEC}\n".encode())
        return 0
    status, lapsed = _wait(child.pid, watch, report)
    prefix = "lapsed " if lapsed else ""
    if os.WIFSIGNALED(status):
        os.write(report, f"{prefix}signal {os.WTERMSIG(status)}\n".encode())
    else:
        os.write(report, f"{prefix}exit {os.waitstatus_to_exitcode(status)}\n".encode())
    if lapsed:  # stepped down: nothing the command started may carry on
        os.killpg(0, signal.SIGKILL)
    return 0


def _wait(pid: int, watch: tuple[int, float, float] | None, report: int) -> tuple[int, bool]:
    """The command's wait status, and whether the lease's deadline passed while it ran.

    With a watch (the deadline pipe, the deadline, --kill-after) the guard steps down on its
    own when the deadline passes unrenewed, as the wrapper does: SIGTERM to the group (the
    guard ignores it), SIGKILL after --kill-after. A wrapper that is stopped (SIGSTOP, a
    debugger) or wedged cannot, and its command must not finish after a takeover.
    """
    try:
        pidfd = os.pidfd_open(pid) if watch is not None else -1
    except OSError:  # no pidfd (Linux before 5.3): the wrapper alone watches the deadline
        pidfd = -1
    if watch is None or pidfd < 0:
        return os.waitpid(pid, 0)[1], False
    fd, deadline, kill_after = watch
    kill_at: float | None = None
    pending = b""
    while True:
        wake = deadline if kill_at is None else kill_at
        watched = [pidfd, fd] if fd >= 0 else [pidfd]
        readable, _, _ = select.select(watched, [], [], max(0.0, wake - time.monotonic()))
        if pidfd in readable:
            return os.waitpid(pid, 0)[1], kill_at is not None
        if fd in readable:
            data = os.read(fd, 4096)
            if not data:
                fd = -1  # the wrapper is gone: its death signal takes care of us
            pending += data
            *lines, pending = pending.split(b"\n")
            if lines and kill_at is None:
                deadline = max(deadline, float(lines[-1]))
        now = time.monotonic()
        if kill_at is None and now >= deadline:
            os.killpg(0, signal.SIGTERM)
            kill_at = now + kill_after
        elif kill_at is not None and now >= kill_at:
            os.write(report, b"lapsed signal 9\n")
            os.killpg(0, signal.SIGKILL)  # the command, its children, and this guard


def _ignore(_signum: int, _frame: object) -> None:
    pass


def _wrapper_died(_signum: int, _frame: object) -> None:
    os.killpg(0, signal.SIGKILL)  # the command, its children, and this guard


def _load_prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


# Loaded here, in the wrapper, once: every guard is a fork of it and needs them at once, and a
# catch-up forks a guard per period (importing them in each guard cost milliseconds each).
_PRCTL = _load_prctl()


def _set_parent_death_signal(sig: int) -> None:
    if _PRCTL is not None:  # None: not Linux, no parent-death signal
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

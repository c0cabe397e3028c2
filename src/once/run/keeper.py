"""One guard for a whole catch-up (once.run.backfill). No SQL here.

A guard forked from the wrapper for every period cost more than the rest of the period: the
fork of 30 MiB of Python, click and the driver, and the copy-on-write faults it leaves on both
sides. The kept guard is a fresh, small interpreter, started once, that forks each period's
command; it is the same guard (once.run.guard's run_one, the same report lines): it leads the
period's process group, kills that group when the wrapper dies, starts the command with its
parent-death SIGKILL and watches the lease's deadline.

It is kept for the next period only after a period that ended cleanly and left nothing behind.
A stop (a forwarded signal, --timeout, a step-down), a lapse, its own death, or a command that
left a process behind (the guard is a child subreaper: what the command leaves becomes its
child) ends it, and the next period gets a new one: whatever reaches a guard's group reaches
the one period it runs, as with a guard per period (docs/concepts/liveness.md).

Protocol, beside the guard's report lines: `hello` once it is up, `ready` after a period's
last line when it is kept; requests come on a socket (a length, then a marshal of the
command, its environment and the period's settings, the command's stdout and stderr as
descriptors); renewed deadlines on a pipe of the keeper's, as a forked guard's.
"""

from __future__ import annotations

import gc
import marshal
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any

from once.deadlines import lease_now
from once.run import guard as _guard
from once.run import launch
from once.run.stops import FORWARDED

# A new guard's time to say hello before its period falls back to a forked guard (a loaded
# machine starts an interpreter in tens of milliseconds).
HELLO_WAIT = 5.0
# The longest a period's request waits for the guard to take it (Keeper.spawn).
SEND_WAIT = 5.0
_PR_SET_CHILD_SUBREAPER = 36
_MAX_FDS = 2  # the command's stdout and stderr

BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from once.run.keeper import serve; serve()"


class Keeper:
    """The wrapper's side: the kept guard, started on first use, replaced when a period does
    not keep it. usable is False where there are no parent-death signals (not Linux) or no
    interpreter to start (a frozen application): every period then forks its own guard."""

    def __init__(self) -> None:
        self.usable = (launch.PRCTL is not None and bool(sys.executable)
                       and not getattr(sys, "frozen", False))
        self.pid = 0
        self.said_hello = False
        self.channel: socket.socket | None = None
        self.report = -1
        self.deadline: tuple[int, int] | None = None  # (read, write): outlives its guards

    def session(self, beat: Callable[[], float] | None = None) -> Keeper | None:
        """Self with a live guard up and waiting for a period, else None. beat, called while a
        new guard is awaited, keeps the period's claim alive and says how long to wait before
        it is called again (no heartbeat runs before the command starts)."""
        if self.pid and self.said_hello and not self._idle():
            self._stop()  # it died between periods (or said what it should not have)
        if self.usable and not self.pid:
            self._start()
        if self.pid and not self.said_hello:
            self.said_hello = self._hello(beat)
            if not self.said_hello:  # it cannot start here: forked guards from now on
                self.usable = False
                self._stop()
        return self if self.pid else None

    def _hello(self, beat: Callable[[], float] | None) -> bool:
        """Whether the new guard says hello within HELLO_WAIT, beat called between looks."""
        give_up = time.monotonic() + HELLO_WAIT
        while (left := give_up - time.monotonic()) > 0:
            if _guard.ready([self.report], left if beat is None else min(left, beat())):
                return os.read(self.report, 64) == b"hello\n"
        return False

    def spawn(self, command: list[str], env: dict[str, str], tty: int | None, title: str,
              ignored: frozenset[int], watch: _guard.Watch | None,
              _inherited: tuple[int, ...], stdio: dict[int, int] | None,
              _end_group: bool = False) -> tuple[int, int]:
        """once.run.guard.spawn's part for a kept guard: hand it the period; its pid and
        report pipe. A guard that died meanwhile shows as one that died before the command
        started."""
        fds = sorted(set((stdio or {}).values()))
        targets = [(target, fds.index(fd)) for target, fd in (stdio or {}).items()]
        deadline, grace = (watch[1], watch[2]) if watch is not None else (None, 0.0)
        payload = marshal.dumps((command, env, title, sorted(map(int, ignored)), tty is not None,
                                 deadline, grace, targets))
        channel = self.channel
        assert channel is not None
        # One message, the length first: the guard, woken once, reads it whole (two sends
        # woke it twice a period, each a thread switch on a loaded machine). A guard that
        # does not read (stopped, wedged) holds a message larger than the socket's buffer:
        # the send waits SEND_WAIT at most, and half the time left before the step-down's
        # moment (the heartbeat starts after it); then the guard is killed, and the period
        # ends as one whose guard died before its command started (not one whose command
        # could not be run), and a signal to once is acted on (it waited as long as the
        # guard was stopped: outside attackers' findings).
        message = len(payload).to_bytes(4, "big") + payload
        left = SEND_WAIT if deadline is None else (deadline - grace - lease_now()) / 2
        channel.settimeout(max(0.0, min(SEND_WAIT, left)))
        try:
            sent = socket.send_fds(channel, [message], fds)
            if sent < len(message):  # more than the socket's buffer takes at once
                channel.sendall(message[sent:])
        except OSError:  # gone (its report's end says so), or not reading: made gone
            channel.close()
            self.channel = None
            with suppress(OSError):  # the period's outcome: its guard died (guard-died)
                os.killpg(self.pid, signal.SIGKILL)
        return self.pid, self.report

    def ended(self, kept: bool, stranded: bool) -> None:
        """The period is over: the guard waits for the next, or it is gone (reaped by the
        wrapper). A renewal stranded in a hung server may still write its deadline: that pipe
        is left open to it, and the next guard gets another."""
        if stranded:
            self.deadline = None
            kept = False
        if not kept:
            self._drop()

    def close(self) -> None:
        """The catch-up is over: the guard ends when its requests end (killed if it does not)."""
        self._stop()
        for fd in self.deadline or ():
            os.close(fd)
        self.deadline = None

    def _idle(self) -> bool:
        # Nothing to read while it waits: an end of file is its death, anything else a fault.
        return not _guard.ready([self.report], 0.0)

    def _start(self) -> None:
        if self.deadline is None:
            self.deadline = os.pipe()
            os.set_blocking(self.deadline[1], False)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        report, report_w = os.pipe()
        said = launch.start_watcher()
        given = (theirs.fileno(), report_w, self.deadline[0], said)
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        # Blocked until its handlers are in: a signal forwarded meanwhile must not kill it.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, []) | set(FORWARDED)
        try:
            for fd in given:
                if fd >= 0:
                    os.set_inheritable(fd, True)
            self.pid = os.posix_spawn(
                sys.executable, [sys.executable, "-I", "-S", "-c", BOOT, root, str(os.getpid()),
                                 *map(str, given)], os.environ, setpgroup=0, setsigmask=mask)
        except OSError:
            self.usable = False
            ours.close()
            os.close(report)
            return
        finally:
            os.set_inheritable(self.deadline[0], False)
            theirs.close()
            os.close(report_w)
            if said >= 0:
                os.close(said)  # the guard's alone now (or nobody's: the watcher ends)
        self.channel, self.report, self.said_hello = ours, report, False

    def _drop(self) -> None:
        """Forget a guard that is gone (or going: its requests end here)."""
        if self.channel is not None:
            self.channel.close()
        if self.report >= 0:
            os.close(self.report)
        self.pid, self.channel, self.report = 0, None, -1

    def _stop(self) -> None:
        pid, report = self.pid, self.report
        if self.channel is not None:
            self.channel.close()
            self.channel = None
        if pid:
            if not _ends(report, 1.0):
                with suppress(OSError):
                    os.killpg(pid, signal.SIGKILL)
            launch.end_watchers()  # before the group's number is free
            with suppress(ChildProcessError):
                os.waitpid(pid, 0)
        self._drop()


def _ends(report: int, within: float) -> bool:
    """Whether the guard's report reaches its end of file within `within` seconds."""
    until = time.monotonic() + within
    while (left := until - time.monotonic()) > 0 and _guard.ready([report], left):
        if not os.read(report, 512):
            return True
    return False


# -- the guard's side ---------------------------------------------------------------------------


def serve() -> None:
    """The kept guard's life: BOOT's arguments are once's path, the wrapper's pid, then the
    request socket, the report pipe, the deadline pipe and its watcher's pipe (-1: none)."""
    said = int(sys.argv[6])
    launch.watch_group(said)
    _serve()
    launch.watch_done(said)  # ended on its own (else its watcher kills the group)


def _serve() -> None:
    wrapper, requests, report, deadline = map(int, sys.argv[2:6])
    gc.disable()
    signal.signal(signal.SIGUSR1, _guard._wrapper_died)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    ignored = {int(sig) for sig in FORWARDED if signal.getsignal(sig) == signal.SIG_IGN}
    launch.hold_stop_signals(ignored)
    launch.set_parent_death_signal(signal.SIGUSR1)
    if os.getppid() != wrapper:  # the wrapper died before the signal was armed
        _guard._wrapper_died(signal.SIGUSR1, None)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    assert launch.PRCTL is not None
    if launch.PRCTL(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        return  # no way to see what a command leaves behind: no hello, no kept guard
    os.set_blocking(deadline, False)
    prepare()
    channel = socket.socket(fileno=requests)
    os.write(report, b"hello\n")
    while (request := _receive(channel)) is not None:
        (command, env, title, ignored_now, tty, lease_deadline, grace, targets), fds = request
        # What a period before this one renewed, and what the wrapper renewed of this one
        # while we were slow to read its request (stopped, a loaded machine): the latest
        # counts, as in a forked guard's pipe (the earlier periods' are all earlier).
        renewals = _drain(deadline)
        if lease_deadline is not None:
            lease_deadline = _guard.renewed(lease_deadline, False, renewals)
            if _guard.due(lease_deadline, grace, False, lease_now()) is not None:
                # Read past the step-down's moment (this guard was stopped or starved): the
                # period may be another's by now, and its command must not start. Our death
                # before `started` tells the wrapper so.
                os.killpg(0, signal.SIGKILL)
        _guard._retitle(title)
        launch.hold_stop_signals(ignored_now)
        if tty:
            _guard.take_terminal(0, os.getpgrp())
        stdio = {target: fds[index] for target, index in targets}
        watch = None if lease_deadline is None else (deadline, lease_deadline, grace)
        _guard.run_one(command, env, stdio, report, watch, prepared=True,
                       held=launch.stop_held)
        launch.forget_held()  # the command's own from its start (they reach its group)
        if _left_behind():
            return  # its end of file tells the wrapper: the next period gets a new guard
        os.write(report, b"ready\n")


def prepare() -> None:
    """Once, what the forked guard's command does between fork and exec: every descriptor
    but 0, 1 and 2 closed by the exec (ours, and any once inherited), and SIGPIPE and
    SIGXFSZ, which Python ignores, caught instead (exec resets a caught signal to its
    default; an ignored one stays ignored). The guard itself sees EPIPE either way."""
    for fd in launch.open_fds():
        if fd > 2:
            with suppress(OSError):  # the listing's own descriptor, already closed
                os.set_inheritable(fd, False)
    for sig in launch.RESTORED:
        signal.signal(sig, launch.ignore)


def _receive(channel: socket.socket) -> tuple[Any, list[int]] | None:
    """The next request (marshal's: Keeper.spawn's tuple) and its descriptors (moved above
    0, 1 and 2); None at the end."""
    try:
        header, fds, _flags, _address = socket.recv_fds(channel, 4, _MAX_FDS,
                                                        socket.MSG_CMSG_CLOEXEC)
        data = b""
        size = int.from_bytes(header, "big") if len(header) == 4 else -1
        while 0 <= len(data) < size:
            chunk = channel.recv(size - len(data))
            if not chunk:
                return None
            data += chunk
    except OSError:
        return None
    if size < 0:
        return None
    return marshal.loads(data), [_above_stdio(fd) for fd in fds]


def _above_stdio(fd: int) -> int:
    if fd > 2:
        return fd
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved


def _drain(fd: int) -> list[bytes]:
    """The deadlines waiting in the pipe, one a line (each written whole)."""
    data = b""
    with suppress(BlockingIOError):
        while chunk := os.read(fd, 4096):
            data += chunk
    return [line for line in data.split(b"\n") if line]


def _left_behind() -> bool:
    """Whether a process the command started still lives (it is our child now); the dead
    are reaped on the way."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True

"""Processes as the kernel sees them, for tests that kill, stop and signal real ones."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import termios
import time
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path

from helpers import ONCE


def start_once(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    """Start the real `once` command without waiting for it (its pid is the wrapper's)."""
    return subprocess.Popen([ONCE, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def reaped(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float) -> None:
    """Wait for proc to end; SIGKILL it if it has not within timeout."""
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def stopped(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 30) -> None:
    """SIGTERM to proc, then SIGKILL if it has not ended within timeout; reaped either way."""
    proc.terminate()
    reaped(proc, timeout)


def pid_namespace(*options: str) -> list[str]:
    """`unshare --pid --fork OPTIONS`: what runs behind it is PID 1 of a namespace of its own
    (the test is skipped where this user cannot make one). Root needs no user namespace (one
    would lose the right to the embedded server's socket, which another user owns)."""
    import pytest

    unshare = ["unshare", "--pid", "--fork", *options] + (
        [] if os.geteuid() == 0 else ["--user", "--map-root-user"])
    try:
        subprocess.run([*unshare, "true"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"no PID namespace for this user here: {exc}")
    return unshare


def stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name; None when there is no such pid."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rpartition(")")[2].split()


def alive(pid: int) -> bool:
    """The process exists and has not ended (a zombie has ended: it only waits to be reaped)."""
    fields = stat(pid)
    return fields is not None and fields[0] not in ("Z", "X", "x")


def parent(pid: int) -> int:
    fields = stat(pid)
    assert fields is not None, f"no process {pid}"
    return int(fields[1])


def process_group(pid: int) -> int:
    fields = stat(pid)
    assert fields is not None, f"no process {pid}"
    return int(fields[2])


def group_leaders(pid: int) -> list[int]:
    """Children of pid that lead a process group of their own (a child may end meanwhile)."""
    found = []
    for child in children(pid):
        fields = stat(child)
        if fields is not None and int(fields[2]) == child:
            found.append(child)
    return found


def zombie_children(pid: int) -> list[int]:
    """Children of pid that have ended and were not reaped."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat(int(entry))
            if fields is not None and fields[0] == "Z" and int(fields[1]) == pid:
                found.append(int(entry))
    return found


def children(pid: int, watchers: bool = False) -> list[int]:
    """The children of pid; a guard's watcher (once.run.launch.start_watcher, a child of
    `once` beside the guard) only with `watchers`."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = stat(int(entry))
            if fields is not None and int(fields[1]) == pid and (
                    watchers or not is_watcher(int(entry))):
                found.append(int(entry))
    return found


def guard_of(pid: int) -> int | None:
    """The guard among pid's children, by its name (`once-guard`): a watcher caught between
    its spawn and its exec is a copy of `once`, not yet a `sh` (CI, under load)."""
    for child in children(pid):
        with suppress(OSError):
            if Path(f"/proc/{child}/comm").read_text().strip() == "once-guard":
                return child
    return None


def is_watcher(pid: int) -> bool:
    """A guard's watcher, alive or a zombie (whose command line is gone): a `sh` that leads
    a process group of its own in its parent's session (a hook's shell leads a session)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    comm = text[text.find("(") + 1:text.rfind(")")]
    fields = text.rpartition(")")[2].split()
    return comm == "sh" and int(fields[2]) == pid and int(fields[3]) != pid


def pids(path: Path, count: int) -> list[int] | None:
    """The first `count` pids a child wrote to path, one a line, once they are all there."""
    try:
        lines = path.read_text().split()
    except FileNotFoundError:
        return None
    return [int(p) for p in lines[:count]] if len(lines) >= count else None


class Terminal:
    """A command run as the foreground job of a pseudo-terminal of its own."""

    def __init__(self, argv: Sequence[str], env: dict[str, str],
                 columns: int | None = None, lines: int = 40) -> None:
        self.pid, self.fd = pty.fork()
        if self.pid == 0:  # the child: session leader, the pty its controlling terminal
            try:
                if columns is not None:  # the window's size, set before the command reads it
                    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", lines, columns, 0, 0))
                os.execve(argv[0], list(argv), env)
            finally:
                os._exit(127)
        self.output = b""
        self.status: int | None = None

    def expect(self, text: str, timeout: float = 30.0) -> None:
        """Read the terminal until text has appeared."""
        deadline = time.monotonic() + timeout
        while text.encode() not in self.output:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"{text!r} never appeared on the terminal; got "
                                     f"{self.output!r}")

    def write(self, data: bytes) -> None:
        os.write(self.fd, data)

    def wait(self, timeout: float = 30.0) -> int:
        """Drain the terminal until the command ends; its exit status."""
        deadline = time.monotonic() + timeout
        while True:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self._read(0.1)
                os.close(self.fd)
                self.status = os.waitstatus_to_exitcode(status)
                return self.status
            if time.monotonic() > deadline:
                os.kill(self.pid, 9)
                raise AssertionError(f"the command never ended; terminal: {self.output!r}")
            if not self._read(0.1):
                time.sleep(0.02)  # the terminal is closed; the command is about to be reaped

    def _read(self, timeout: float) -> bool:
        readable, _, _ = select.select([self.fd], [], [], timeout)
        if not readable:
            return True
        try:
            data = os.read(self.fd, 4096)
        except OSError:  # EIO: the other side is closed
            return False
        self.output += data
        return bool(data)

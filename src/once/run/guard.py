"""The guard: the process between `once` and the command. No SQL here.

    once (wrapper)                 heartbeats, signals, timeout, deadline
     └─ once-guard JOB PERIOD      process-group leader; parent-death signal on the wrapper
         └─ COMMAND ...            parent-death signal (SIGKILL) on the guard

The guard is a fork of the wrapper, not a fresh interpreter: starting one costs 15 to 30 ms.
A catch-up starts one such interpreter for all its periods instead (once.run.keeper), as a
fork of the wrapper cost it 3 to 6 ms of CPU a period. It renames itself at once (its
comm and its command line, which `ps`, `top` and `pkill -f` read) to `once-guard JOB PERIOD`,
so that a `pkill -f 'once run'` aimed at the wrappers leaves the guards to kill their
commands' groups.

Linux delivers a parent-death signal only to the process that asked for it: set on COMMAND
alone, a shell's children would outlive a wrapper killed by SIGKILL. So the guard asks for
SIGUSR1 when the wrapper dies and answers it by killing its own process group, which COMMAND
and everything it starts share (unless they leave it with setsid); and COMMAND asks for
SIGKILL when the guard dies, so that it dies even when wrapper and guard are killed together
(what COMMAND started survives that double kill: nobody of ours is left to kill the group).
Without prctl (not Linux) there are no parent-death signals at all.

The guard reports to the wrapper through a pipe: `started` once COMMAND runs, then one line
for how it ended (`exit N`, `signal N`, `exec ERRNO`; `lapsed ...` when the guard stepped
down at the lease's deadline). A guard that dies without its last line was killed.
"""

from __future__ import annotations

import errno
import gc
import os
import select
import signal
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import NoReturn

from once.deadlines import lease_now
from once.run.stops import FORWARDED

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15

# The longest a wait sleeps: select's timeout runs on the monotonic clock, which stops while
# the machine is suspended, and a deadline that passed during a suspend must be noticed soon
# after the resume. A wake-up a second costs nothing.
MAX_SLEEP = 1.0

# (the deadline pipe's read end, the lease's deadline, the grace before it for SIGTERM)
Watch = tuple[int, float, float]


def spawn(command: list[str], env: dict[str, str], tty: int | None, title: str,
          ignored: frozenset[int] = frozenset(), watch: Watch | None = None,
          inherited: tuple[int, ...] = (), stdio: dict[int, int] | None = None
          ) -> tuple[int, int]:
    """Fork the guard; return its pid and its report pipe.

    The guard has one thread, the forking one. The wrapper's threads that exist at the fork
    (the relay's, once.run.relay) wait in poll() and hold no lock the guard could need.

    inherited: the wrapper's own descriptors, which the guard closes. stdio: the command's
    stdout (1) and stderr (2) where once relays them (once.run.relay), else they are inherited.
    """
    report_r, report_w = os.pipe()
    wrapper = os.getpid()
    # The wrapper's collections from now on leave what the guard shares with it alone: a
    # collection touches, and so copies, every page of the objects it looks at.
    gc.freeze()
    # Blocked across the fork: one that reaches the new guard before its handlers are in
    # waits for them (hold_stop_signals) instead of meeting the wrapper's, and is lost.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    try:
        pid = os.fork()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise
    if pid == 0:
        code = 70
        try:
            for fd in (report_r, *inherited):
                os.close(fd)
            code = _guard(command, env, tty, title, wrapper, report_w, ignored, watch,
                          stdio or {}, mask)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(report_w)
    # Set the group from both sides, so that killpg(pid) works whoever runs first.
    with suppress(OSError):
        os.setpgid(pid, pid)
    return pid, report_r


def _guard(command: list[str], env: dict[str, str], tty: int | None, title: str,
           wrapper: int, report: int, ignored: frozenset[int],
           watch: Watch | None, stdio: dict[int, int], mask: set[int | signal.Signals]) -> int:
    gc.disable()  # a collection would touch, and so copy, every page shared with the wrapper
    signal.set_wakeup_fd(-1)  # the wrapper's, inherited across the fork
    os.setpgid(0, 0)
    hold_stop_signals(ignored)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # blocked by spawn across the fork
    _retitle(title)
    signal.signal(signal.SIGUSR1, _wrapper_died)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _set_parent_death_signal(signal.SIGUSR1)
    if os.getppid() != wrapper:  # the wrapper died before the signal was armed
        _wrapper_died(signal.SIGUSR1, None)
    if tty is not None:
        take_terminal(tty, os.getpgrp())
    run_one(command, env, stdio, report, watch, held=stop_held)
    return 0


# The stop signals that reached this guard before its command's fork: the wrapper sent
# them to the group before the command was there (the guard starting, slow to wake, stopped,
# starved), and that command must not start deaf to them: it does not start (an outside
# attacker's finding: it ran to its end, the signal swallowed here, and its period ran again).
_held: list[int] = []


def hold_stop_signals(ignored: Iterable[int]) -> None:
    """The command gets the stop signals itself (it shares our group): the guard notes them
    (_held), but for those ignored when once started."""
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN if sig in ignored else _hold)


def _hold(signum: int, _frame: object) -> None:
    _held.append(signum)


def forget_held() -> None:
    """A command has started: what comes from now on is its own (it reaches its group)."""
    del _held[:]


def stop_held() -> int:
    """The first stop signal held, handled or pending (blocked: _start looks with them
    blocked, so none comes between the look and the fork); 0 for none."""
    if _held:
        return _held[0]
    return min(_pending_stops(), default=0)


def _pending_stops() -> set[int]:
    """The stop signals pending while blocked, but for ignored ones (Linux keeps a blocked
    signal pending even where it is ignored)."""
    return {int(sig) for sig in signal.sigpending() & set(FORWARDED)
            if signal.getsignal(sig) != signal.SIG_IGN}


def run_one(command: list[str], env: dict[str, str], stdio: dict[int, int], report: int,
            watch: Watch | None, prepared: bool = False,
            held: Callable[[], int] | None = None) -> None:
    """Start the command, report `started`, wait for it (stepping down at the deadline),
    report how it ended; the guard's part for one command (once.run.keeper runs many).
    prepared: the guard's descriptors and signals are already what exec should find
    (once.run.keeper.prepare), so the command's fork does not set them. held: the kept
    guard's, the stop signal that reached it before this command's fork (0: none), reported
    as a forked guard's command that died of it before its exec."""
    try:
        child = _start(command, env, stdio, os.getpid(), prepared, held)
    except _StoppedBeforeStart as stop:
        os.write(report, f"started\nsignal {stop.number}\n".encode())
        return
    except OSError as exc:
        os.write(report, f"exec {exc.errno or errno.ENOEXEC}\n".encode())
        return
    finally:
        for fd in set(stdio.values()):  # the command's alone: its end is the relay's EOF
            os.close(fd)
    os.write(report, b"started\n")
    status, lapsed = _wait(child, watch, report)
    prefix = "lapsed " if lapsed else ""
    if os.WIFSIGNALED(status):
        os.write(report, f"{prefix}signal {os.WTERMSIG(status)}\n".encode())
    else:
        os.write(report, f"{prefix}exit {os.waitstatus_to_exitcode(status)}\n".encode())
    if lapsed:  # stepped down: nothing the command started may carry on
        os.killpg(0, signal.SIGKILL)


# Ignored by Python itself, not by whoever started once: the command gets them at default,
# as subprocess's restore_signals gives them.
_RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
                  if hasattr(signal, name))


class _StoppedBeforeStart(Exception):
    def __init__(self, number: int) -> None:
        self.number = number


def _start(command: list[str], env: dict[str, str], stdio: dict[int, int], guard: int,
           prepared: bool = False, held: Callable[[], int] | None = None) -> int:
    """Fork and exec the command; its pid. OSError (the exec's errno) when it cannot start.

    What subprocess.Popen(close_fds=True, restore_signals=True, preexec_fn=...) does, without
    its cost (a millisecond a command, paid per period by a catch-up): stdout and stderr
    redirected, every other descriptor of ours closed, SIGKILL when the guard dies (the
    guard may already have), PATH searched in the command's environment (os.execvpe, as
    subprocess does). Only what was ignored when once started stays ignored, and nothing is
    blocked. The guard has no threads (it is a fork of one), so the child may run Python
    until its exec (and Python's at-fork handlers do, harmlessly).

    A signal the wrapper forwards while the child is on its way (the guard's own handler
    would swallow it there) is held back by the mask until the child's handlers are the
    command's, then delivered: the command does not start deaf to it.

    The PATH search is made here, before the fork (found_on_path): in the child it cost half a
    millisecond of CPU a command, each directory's failed exec copying pages of ours.
    """
    found = found_on_path(command[0], env)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    if held is not None and (number := held()):  # looked at blocked: none comes in between
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise _StoppedBeforeStart(number)
    errors_r, errors_w = _pipe_above_stdio()
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(errors_r)
        os.close(errors_w)
        raise
    if pid == 0:
        _exec(command, env, stdio, guard, prepared, found, mask, errors_w)
    # Pending here: came before the fork (ours alone: the child lacks it, and would start
    # deaf to it) or after (the child has it too, blocked until its exec: sent again, it is
    # still one signal). Only a guard slower than the child's whole way to its exec could
    # send one the command has had: twice a stop signal rather than none.
    for number in _pending_stops():
        with suppress(ProcessLookupError):
            os.kill(pid, number)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(errors_w)
    try:
        failed = os.read(errors_r, 32)  # nothing: the exec closed the pipe
    finally:
        os.close(errors_r)
    if failed:
        os.waitpid(pid, 0)
        number = int(failed) if failed.isdigit() else errno.ENOEXEC
        raise OSError(number, os.strerror(number))
    return pid


def _exec(command: list[str], env: dict[str, str], stdio: dict[int, int], guard: int,
          prepared: bool, found: str | None, mask: set[int | signal.Signals],
          errors: int) -> NoReturn:
    """The child's part of _start: its descriptors and signals set, the exec; what fails is
    written to `errors` as an errno."""
    try:
        for target, fd in stdio.items():
            if fd == target:  # dup2 would keep it close-on-exec
                os.set_inheritable(fd, True)
            else:
                os.dup2(fd, target)
        if not prepared:
            _close_inherited(keep=errors)
        # A kept guard's handlers too: a stop signal from here to the exec must end the
        # child as it would the command, not be swallowed (it would start deaf to it).
        for sig in (*(() if prepared else _RESTORED), *FORWARDED):
            if sig in _RESTORED or signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        _set_parent_death_signal(signal.SIGKILL)
        if _PRCTL is not None and os.getppid() != guard:
            os.kill(os.getpid(), signal.SIGKILL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        if found is not None:
            with suppress(OSError):  # execvpe's own search meets it too, and says so
                os.execve(found, command, env)
        os.execvpe(command[0], command, env)
    except BaseException as exc:  # a bad name or value in the environment: ENOEXEC
        number = exc.errno if isinstance(exc, OSError) and exc.errno else errno.ENOEXEC
        os.write(errors, str(number).encode())
    finally:
        os._exit(127)


def found_on_path(name: str, env: dict[str, str]) -> str | None:
    """The file os.execvpe(name, ..., env) tries first: the first path called name in the
    environment's PATH (os.get_exec_path) that exists, whatever it is; None for a name with a
    slash (run as it is) or when none exists. A shortcut only: where its exec fails (not
    executable, a directory, no format exec knows), execvpe searches again, and runs what it
    would have run. Whether a file may be run is exec's to say, never ours: os.access asks
    for the real uid, and a setuid once or a capability (systemd's AmbientCapabilities=)
    lets exec run what access refuses, so a search that judged would run a file further down
    PATH than execvpe (an outside attacker's finding)."""
    if not name or os.path.dirname(name):
        return None
    for directory in os.get_exec_path(env):
        path = os.path.join(directory, name)
        if os.path.exists(path):  # stat: exec's own view of the path (effective ids)
            return path
    return None


def _close_inherited(keep: int) -> None:
    """Close every descriptor but 0, 1, 2 and keep: the ones /proc lists (a loop up to the
    descriptor limit could take minutes where that limit is a billion), else all up to
    the limit."""
    try:
        fds: Iterable[int] = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        fds = range(3, _MAXFD)
    for fd in fds:
        if fd > 2 and fd != keep:
            with suppress(OSError):  # the listing's own descriptor, already closed
                os.close(fd)


def _pipe_above_stdio() -> tuple[int, int]:
    """A close-on-exec pipe whose ends are not 0, 1 or 2 (which are free when once was
    started with them closed): the command's stdout and stderr go there."""
    ends = os.pipe()  # close-on-exec, as every descriptor Python makes
    if min(ends) > 2:
        return ends
    import fcntl

    moved = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3) for fd in ends)
    for fd in ends:
        os.close(fd)
    return moved[0], moved[1]


def _wait(pid: int, watch: Watch | None, report: int) -> tuple[int, bool]:
    """The command's wait status, and whether the lease's deadline passed while it ran.

    With a watch the guard steps down on its own, as the wrapper does: SIGTERM to the group
    (the guard ignores it) the grace before the deadline, SIGKILL at the deadline. A wrapper
    that is stopped (SIGSTOP, a debugger) or wedged cannot, and its command must be dead
    before a takeover can start.
    """
    try:
        pidfd = os.pidfd_open(pid) if watch is not None else -1
    except OSError:  # no pidfd (Linux before 5.3): the wrapper alone watches the deadline
        pidfd = -1
    if watch is None or pidfd < 0:
        return os.waitpid(pid, 0)[1], False
    try:
        return _watch(pid, pidfd, watch, report)
    finally:
        os.close(pidfd)  # a kept guard waits for thousands of commands


def _watch(pid: int, pidfd: int, watch: Watch, report: int) -> tuple[int, bool]:
    """_wait's loop: the command's end, the renewed deadlines, the step-down."""
    fd, deadline, grace = watch
    stopping = False
    pending = b""
    while True:
        watched = [pidfd, fd] if fd >= 0 else [pidfd]
        pause = min(MAX_SLEEP, max(0.0, wake_at(deadline, grace, stopping) - lease_now()))
        readable = ready(watched, pause)
        if pidfd in readable:
            return os.waitpid(pid, 0)[1], stopping
        if fd in readable:
            # A whole pipe's worth (Linux's 64 KiB): a guard that was stopped judges the
            # deadline by every renewal made meanwhile, not by the first 4 KiB of them.
            data = os.read(fd, 1 << 16)
            if not data:
                fd = -1  # the wrapper is gone: its death signal takes care of us
            pending += data
            *lines, pending = pending.split(b"\n")
            deadline = renewed(deadline, stopping, lines)
        sig = due(deadline, grace, stopping, lease_now())
        if sig == signal.SIGKILL:
            os.write(report, b"lapsed signal 9\n")
            os.killpg(0, signal.SIGKILL)  # the command, its children, and this guard
        elif sig == signal.SIGTERM:
            os.killpg(0, signal.SIGTERM)
            stopping = True


# The watch's rules, pure (tests/unit/test_guard_rules.py).


def renewed(deadline: float, stopping: bool, lines: list[bytes]) -> float:
    """The deadline once the wrapper's renewed deadlines (one a line) are read: the latest
    one, never earlier; a step-down, once begun, is not undone."""
    if not lines or stopping:
        return deadline
    return max(deadline, float(lines[-1]))


def due(deadline: float, grace: float, stopping: bool, now: float) -> int | None:
    """The signal the watch sends the group at `now`: SIGKILL at the deadline, SIGTERM the
    grace before it (once), else None."""
    if now >= deadline:
        return signal.SIGKILL
    if not stopping and now >= deadline - grace:
        return signal.SIGTERM
    return None


def wake_at(deadline: float, grace: float, stopping: bool) -> float:
    """When the watch's next signal is due."""
    return deadline if stopping else deadline - grace


def ready(fds: list[int], timeout: float) -> set[int]:
    """Which of fds can be read (data, its end, an exited pidfd) within timeout seconds.

    poll, not select: select cannot watch a descriptor numbered 1024 or more, which ours are
    when once is started by a process that leaks its own."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    found = poller.poll(timeout * 1000)
    if not found and timeout > 0:
        # A signal handled in the wait (a forwarded one, after a stop) that ran past the
        # timeout ends it with nothing, without looking (PEP 475): look, without waiting.
        found = poller.poll(0)
    return {fd for fd, _ in found}


def take_terminal(tty: int, pgrp: int) -> None:
    # A background group that calls tcsetpgrp gets SIGTTOU unless it blocks it.
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTTOU})
    try:
        os.tcsetpgrp(tty, pgrp)
    except OSError:
        pass
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _ignore(_signum: int, _frame: object) -> None:
    pass


def _wrapper_died(_signum: int, _frame: object) -> None:
    os.killpg(0, signal.SIGKILL)  # the command, its children, and this guard


def _retitle(title: str) -> None:
    """Show as `title` in ps and top: the thread's name (comm) and the argv area (cmdline).

    The argv area is the fork's own copy of the wrapper's; Python keeps copies of its
    arguments elsewhere, so overwriting it changes nothing but what /proc shows. Its bounds
    come from /proc/self/stat (fields 48 and 49, Linux 3.5 on).
    """
    if _PRCTL is None:
        return
    import ctypes

    _PRCTL(_PR_SET_NAME, title.split()[0].encode()[:15], 0, 0, 0)
    start, size = _argv_area()
    if size < 2 or not start:
        return
    text = title.encode("utf-8", "replace")[:size - 1]
    # A NUL after the title and a non-NUL last byte: the kernel reads the area as a title
    # set by setproctitle and shows it up to that NUL.
    ctypes.memmove(start, text + b"\0" + b" " * (size - len(text) - 1), size)


_ARGV_AREA: tuple[int, int] | None = None  # (start, size): a process's, for good


def _argv_area() -> tuple[int, int]:
    """Where the argv area is, read once (a kept guard retitles itself every period): (0, 0)
    when it cannot be read."""
    global _ARGV_AREA
    if _ARGV_AREA is None:
        try:
            with open("/proc/self/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
            start, end = int(fields[45]), int(fields[46])
        except (OSError, IndexError, ValueError):
            start = end = 0
        _ARGV_AREA = (start, end - start)
    return _ARGV_AREA


def _load_prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


# Loaded here, in the wrapper, once: every guard forked from it needs them at once (importing
# them in each guard cost milliseconds each).
_PRCTL = _load_prctl()

try:  # the descriptor limit, for a system without /proc (as subprocess.MAXFD)
    _MAXFD = max(256, os.sysconf("SC_OPEN_MAX"))
except (AttributeError, ValueError, OSError):
    _MAXFD = 256


def _set_parent_death_signal(sig: int) -> None:
    if _PRCTL is not None:  # None: not Linux, no parent-death signal
        _PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

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
SIGKILL when the guard dies, so that it dies even when wrapper and guard are killed together.
What COMMAND started is then killed by the guard's watcher (once.run.launch.start_watcher),
a shell that kills the group when the guard dies without saying it is done.
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
from collections.abc import Callable
from contextlib import suppress

from once.deadlines import lease_now
from once.run import launch
from once.run.stops import FORWARDED

_PR_SET_NAME = 15

# The longest a wait sleeps: select's timeout runs on the monotonic clock, which stops while
# the machine is suspended, and a deadline that passed during a suspend must be noticed soon
# after the resume. A wake-up a second costs nothing.
MAX_SLEEP = 1.0

# (the deadline pipe's read end, the lease's deadline, the grace before it for SIGTERM)
Watch = tuple[int, float, float]


def spawn(command: list[str], env: dict[str, str], tty: int | None, title: str,
          ignored: frozenset[int] = frozenset(), watch: Watch | None = None,
          inherited: tuple[int, ...] = (), stdio: dict[int, int] | None = None,
          end_group: bool = False) -> tuple[int, int]:
    """Fork the guard; return its pid and its report pipe.

    The guard has one thread, the forking one. The wrapper's threads that exist at the fork
    (the relay's, once.run.relay) wait in poll() and hold no lock the guard could need.

    inherited: the wrapper's own descriptors, which the guard closes. stdio: the command's
    stdout (1) and stderr (2) where once relays them (once.run.relay), else they are inherited.
    end_group: once the command has ended, nothing it left in the group carries on (once
    lead's terms).
    """
    report_r, report_w = os.pipe()
    said = launch.start_watcher()
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
                          stdio or {}, mask, said, end_group)
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    os.close(report_w)
    if said >= 0:
        os.close(said)  # the guard's alone now: its death is the watcher's end of file
    # Set the group from both sides, so that killpg(pid) works whoever runs first.
    with suppress(OSError):
        os.setpgid(pid, pid)
    return pid, report_r


def _guard(command: list[str], env: dict[str, str], tty: int | None, title: str,
           wrapper: int, report: int, ignored: frozenset[int],
           watch: Watch | None, stdio: dict[int, int], mask: set[int | signal.Signals],
           said: int, end_group: bool) -> int:
    gc.disable()  # a collection would touch, and so copy, every page shared with the wrapper
    signal.set_wakeup_fd(-1)  # the wrapper's, inherited across the fork
    os.setpgid(0, 0)
    launch.hold_stop_signals(ignored)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # blocked by spawn across the fork
    _retitle(title)
    signal.signal(signal.SIGUSR1, _wrapper_died)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    launch.set_parent_death_signal(signal.SIGUSR1)
    if os.getppid() != wrapper:  # the wrapper died before the signal was armed
        _wrapper_died(signal.SIGUSR1, None)
    launch.watch_group(said)
    global _said
    _said = said  # told the group: `done` is its next word
    if tty is not None:
        take_terminal(tty, os.getpgrp())
    run_one(command, env, stdio, report, watch, held=launch.stop_held)
    launch.watch_done(said)
    if end_group:
        # A term's end: what the command left dies now, with this guard, whatever the
        # wrapper's state (stopped, say, with the lease running out). Not after a stop that
        # reached the group: it may be the command's own (`trap 'kill 0' EXIT`), whose
        # children it leaves their SIGTERM's handlers to run (an attacker's finding).
        os.killpg(0, signal.SIGKILL)
    return 0


def run_one(command: list[str], env: dict[str, str], stdio: dict[int, int], report: int,
            watch: Watch | None, prepared: bool = False,
            held: Callable[[], int] | None = None) -> None:
    """Start the command, report `started`, wait for it (stepping down at the deadline),
    report how it ended; the guard's part for one command (once.run.keeper runs many).
    prepared: the guard's descriptors and signals are already what exec should find
    (once.run.keeper.prepare), so the command's fork does not set them. held: the stop signal
    that reached the guard before this command's fork (0: none; launch.stop_held): the
    command does not start, reported as one that died of it before its exec."""
    try:
        child = launch.start(command, env, stdio, os.getpid(), prepared, held)
    except launch.StoppedBeforeStart as stop:
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


def command_gone(guard: int) -> bool:
    """The wrapper's look: whether the command has exited, or is exiting, as the kernel says,
    before the guard's report of it is here (a signal then is not the command's). The guard,
    its parent, has no child left that lives: each is looked at through a pidfd (readable:
    every thread of it has exited), else in /proc (a single thread that has begun to exit
    runs no code of its own again). False where that cannot be told: a /proc of another
    PID namespace (a container's without its own: its pids are not ours, and the guard's
    would name another process, an outside attacker's finding), no list of children."""
    try:
        if not _proc_is_ours() or _parent(guard) != os.getpid():
            return False
        with open(f"/proc/{guard}/task/{guard}/children", "rb") as listing:
            children = [int(pid) for pid in listing.read().split()]
    except (OSError, ValueError):
        return False
    for pid in children:
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # reaped since the listing
        except OSError:
            return False
        try:
            if not ready([pidfd], 0) and not _exiting(pid):
                return False
        finally:
            os.close(pidfd)
    return True


_PF_EXITING = 0x4  # the kernel's task flag: do_exit has begun


def await_group_end(group: int, reap_all: bool, patience: float = 5.0) -> None:
    """Wait until nothing is left of the command's group, SIGKILLed by the machine (end_group)
    before the guard who led it was reaped: a leftover would outlive its term. Only signal 0
    goes to it now: an emptied group's number may be a newcomer's (an outside attacker's
    finding: a SIGKILL sent here, after a look). As PID 1 the orphans are ours to reap."""
    import time

    looked = lease_now()
    give_up = looked + patience
    while lease_now() < give_up and not group_taken(group):  # the guard is reaped
        try:
            os.killpg(group, 0)
        except (ProcessLookupError, PermissionError):
            return
        if reap_all:
            reap_ended()
        if lease_now() - looked >= 0.1:  # a look through /proc costs: ten a second at most
            if only_zombies(group):
                return
            looked = lease_now()
        time.sleep(0.01)


def only_zombies(group: int) -> bool:
    """Whether every process left in the group has ended, unreaped: a zombie whose parent
    left the group (setsid) and never waits for it, or the orphans a slow init reaps late,
    which signal 0 counts (an outside attacker's finding: once lead's release waited out its
    whole patience for one). False where /proc cannot tell (another PID namespace's)."""
    try:
        if not _proc_is_ours():
            return False
        for name in os.listdir("/proc"):
            if name.isdigit():
                with suppress(OSError, IndexError, ValueError):
                    fields = _stat(name)  # state (field 3), pgrp (5), threads (20)
                    if int(fields[2]) == group and not _ended(fields):
                        return False
    except OSError:
        return False
    return True


def _ended(fields: list[bytes]) -> bool:
    """A zombie whose every thread has ended: a process whose first thread exited while
    others run shows as a zombie too, counting them (and itself)."""
    return fields[0] in (b"Z", b"X") and int(fields[17]) <= 1


def reap_ended() -> None:
    """Reap every child that has ended (PID 1's orphans), waiting for none."""
    with suppress(ChildProcessError):
        while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
            launch.watcher_reaped(pid)


def wait_status(ended: os.waitid_result) -> int:
    """waitpid's status word for what os.waitid said of a child that ended."""
    if ended.si_code == os.CLD_EXITED:
        return (ended.si_status & 0xFF) << 8
    return ended.si_status | (0x80 if ended.si_code == os.CLD_DUMPED else 0)


def group_taken(group: int) -> bool:
    """Whether the number of the process group the guard led, the guard reaped, is known to
    be a stranger's now: a process has it as its pid. A group keeps its number while a
    member lives, and only its leader can have that pid; once the group is empty the number
    is free, and a newcomer that gets it as its pid leads a group of that number (an outside
    attacker's finding: a late signal killed one). False where it cannot be told (a /proc of
    another PID namespace): the group is signalled, as before."""
    try:
        return _proc_is_ours() and os.path.exists(f"/proc/{group}")
    except OSError:
        return False


def _proc_is_ours() -> bool:
    """Whether /proc is this process's PID namespace's (its pids are ours). OSError: none."""
    return os.readlink("/proc/self") == str(os.getpid())


def _stat(pid: int | str) -> list[bytes]:
    """/proc's stat of pid ("self" too), the fields after its name (the third field first)."""
    with open(f"/proc/{pid}/stat", "rb") as stat:
        return stat.read().rpartition(b")")[2].split()


def _parent(pid: int) -> int:
    return int(_stat(pid)[1])


def _exiting(pid: int) -> bool:
    """Whether pid is a process of one thread that has begun to exit (its flags, field 9,
    and its number of threads, field 20)."""
    try:
        fields = _stat(pid)
        return bool(int(fields[6]) & _PF_EXITING) and int(fields[17]) == 1
    except (OSError, IndexError, ValueError):
        return False


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


def _wrapper_died(_signum: int, _frame: object) -> None:
    # Our own kill: the watcher's would come after it, maybe after init has reaped the group
    # and its number is a newcomer's.
    launch.watch_done(_said)
    os.killpg(0, signal.SIGKILL)  # the command, its children, and this guard


_said = -1  # the watcher's pipe (launch.start_watcher), for _wrapper_died


def _retitle(title: str) -> None:
    """Show as `title` in ps and top: the thread's name (comm) and the argv area (cmdline).

    The argv area is the fork's own copy of the wrapper's; Python keeps copies of its
    arguments elsewhere, so overwriting it changes nothing but what /proc shows. Its bounds
    come from /proc/self/stat (fields 48 and 49, Linux 3.5 on).
    """
    if launch.PRCTL is None:
        return
    import ctypes

    launch.PRCTL(_PR_SET_NAME, title.split()[0].encode()[:15], 0, 0, 0)
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
            fields = _stat("self")
            start, end = int(fields[45]), int(fields[46])
        except (OSError, IndexError, ValueError):
            start = end = 0
        _ARGV_AREA = (start, end - start)
    return _ARGV_AREA



"""The command's launch from its guard (once.run.guard): what subprocess.Popen does between
fork and exec, at a fraction of its cost (a catch-up pays it every period), and the stop
signals a guard holds until then. No SQL here; standard library only (the kept guard is a
fresh interpreter that imports this and once.run.guard alone).

A stop signal the wrapper forwards to the guard's process group before the command is there
(the guard starting or slow to wake) is held by the guard (hold_stop_signals): the command
then does not start (StoppedBeforeStart). One that comes while the command is on its way,
after the guard's last look, is held back by the signal mask until the command's handlers
are its own, then delivered: the command does not start deaf to it.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Callable, Iterable
from contextlib import suppress
from typing import Any, NoReturn

from once.run.stops import FORWARDED

_PR_SET_PDEATHSIG = 1


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
    """The first stop signal held, handled or pending (blocked: start looks with them
    blocked, so none comes between the look and the fork); 0 for none."""
    if _held:
        return _held[0]
    return min(_pending_stops(), default=0)


def _pending_stops() -> set[int]:
    """The stop signals pending while blocked, but for ignored ones (Linux keeps a blocked
    signal pending even where it is ignored)."""
    return {int(sig) for sig in signal.sigpending() & set(FORWARDED)
            if signal.getsignal(sig) != signal.SIG_IGN}


# Ignored by Python itself, not by whoever started once: the command gets them at default,
# as subprocess's restore_signals gives them.
RESTORED = tuple(getattr(signal, name) for name in ("SIGPIPE", "SIGXFZ", "SIGXFSZ")
                 if hasattr(signal, name))


class StoppedBeforeStart(Exception):
    def __init__(self, number: int) -> None:
        self.number = number


def start(command: list[str], env: dict[str, str], stdio: dict[int, int], guard: int,
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
    command's, then delivered: the command does not start deaf to it. One that reached the
    guard between its last look (held) and the fork is the guard's alone: the guard sends it
    on to the child, which waits for the guard's word (`go`) before it lets signals in.

    The PATH search is made here, before the fork (found_on_path): in the child it cost half a
    millisecond of CPU a command, each directory's failed exec copying pages of ours.
    """
    found = found_on_path(command[0], env)
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    if held is not None and (number := held()):  # looked at blocked: none comes in between
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        raise StoppedBeforeStart(number)
    errors_r, errors_w = _pipe_above_stdio()
    go_r, go_w = _pipe_above_stdio()
    try:
        pid = os.fork()
    except OSError:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for fd in (errors_r, errors_w, go_r, go_w):
            os.close(fd)
        raise
    if pid == 0:
        _exec(command, env, stdio, guard, prepared, found, mask, errors_w, (go_r, go_w))
    # Pending here: came before the fork (ours alone: the child lacks it) or after (the
    # child has it too: sent again, it is still one signal, as it waits blocked for `go`).
    for number in _pending_stops():
        with suppress(ProcessLookupError):
            os.kill(pid, number)
    os.write(go_w, b"g")
    for fd in (go_r, go_w):
        os.close(fd)
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
          errors: int, go: tuple[int, int]) -> NoReturn:
    """The child's part of start: its descriptors and signals set, the guard's `go` awaited
    (go: its pipe), the exec; what fails is written to `errors` as an errno."""
    try:
        os.close(go[1])  # the guard's end: its death is then our end of file
        for target, fd in stdio.items():
            if fd == target:  # dup2 would keep it close-on-exec
                os.set_inheritable(fd, True)
            else:
                os.dup2(fd, target)
        if not prepared:
            _close_inherited(keep=(errors, go[0]))
        # A kept guard's handlers too: a stop signal from here to the exec must end the
        # child as it would the command, not be swallowed (it would start deaf to it).
        for sig in (*(() if prepared else RESTORED), *FORWARDED):
            if sig in RESTORED or signal.getsignal(sig) != signal.SIG_IGN:
                signal.signal(sig, signal.SIG_DFL)
        set_parent_death_signal(signal.SIGKILL)
        if PRCTL is not None and os.getppid() != guard:
            os.kill(os.getpid(), signal.SIGKILL)
        os.read(go[0], 1)  # the guard has sent on what came before the fork
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


def _close_inherited(keep: tuple[int, ...]) -> None:
    """Close every descriptor but 0, 1, 2 and keep's: the ones /proc lists (a loop up to the
    descriptor limit could take minutes where that limit is a billion), else all up to
    the limit."""
    for fd in open_fds():
        if fd > 2 and fd not in keep:
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


# The guard's watcher: a shell started by the wrapper before the guard (its child, reaped by
# it: an orphan would wait as a zombie under a container's init that reaps only its own), of
# no group of ours, that reads a pipe whose other end the guard alone holds once the wrapper
# has closed its own. The guard writes its group first; a guard that ends on its own then
# says `done`; one killed (with its wrapper: `pkill -9 -f once`, whose command dies of its
# parent-death signal) leaves the pipe's end of file, and the watcher kills the group, what
# the command started with it, which nobody of ours was left to kill. Its command line holds
# no `once`: `pkill -f once` passes it by. `case`, not `[`: yash runs its `[` only where PATH
# finds one, and the watcher's environment is empty (an attacker's finding: it killed the
# group after every `done`).
_WATCHER = ('read group <&3; read said <&3; '
            'case "$group/$said" in /*|*/done) ;; *) kill -s KILL -- "-$group" ;; esac')
SHELL = "/bin/sh"
_watchers: list[int] = []  # their pids, to reap


def start_watcher() -> int:
    """Start a guard's watcher (the wrapper, before it starts the guard); the pipe's end the
    guard tells it on (watch_group, watch_done), which the wrapper closes once the guard has
    it; -1 where no shell can be started. The watcher holds nothing else of ours (a pipe it
    held would not end with the guard) and says nothing (the group may be gone by then)."""
    reap_watchers(0.0)
    try:
        read, write = _pipe_above_stdio()  # never a command's stdout: 0-2 may be free
    except OSError:  # out of descriptors: the guard goes without, as without a shell
        return -1
    actions: list[tuple[Any, ...]] = [  # 3 first: a closed stdin makes the pipe's end 0
        (os.POSIX_SPAWN_DUP2, read, 3), (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0), (os.POSIX_SPAWN_DUP2, 1, 2)]
    actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in _inheritable() if fd > 3 and fd != read]
    try:
        # An empty environment: nothing of ours (a URL's password), and nothing a shell
        # imports (bash takes exported functions, named `read` or `kill`, from it).
        pid = os.posix_spawn(SHELL, ["sh", "-c", _WATCHER], {}, file_actions=actions,
                             setpgroup=0, setsigmask=(), setsigdef=FORWARDED)
    except OSError:
        os.close(write)
        return -1
    finally:
        os.close(read)
    if not _watchers:
        import atexit

        atexit.register(reap_watchers)
    _watchers.append(pid)
    return write


def watch_group(said: int) -> None:
    """Tell the watcher which group to kill should this guard die (the guard leads it)."""
    if said >= 0:
        with suppress(OSError):
            os.write(said, f"{os.getpgrp()}\n".encode())


def watch_done(said: int) -> None:
    """Tell the watcher the guard ends on its own: what is left of the group is the
    wrapper's to end."""
    if said >= 0:
        with suppress(OSError):
            os.write(said, b"done\n")


def watcher_reaped(pid: int) -> None:
    """A child reaped elsewhere (as PID 1, every child that ends): if a watcher, its pid is
    no longer one to wait for (it may be another child's by the time we would)."""
    with suppress(ValueError):
        _watchers.remove(pid)


def end_watchers(within: float = 1.0) -> None:
    """Before a guard is reaped: its watcher has ended, on its own within `within` seconds
    (it has the guard's `done`, or its end of file, by now), else killed (stopped, starved).
    Reaped, the guard frees its group's number: a watcher's kill sent after that could hit a
    newcomer that has it (an outside attacker's finding). The watchers are our unreaped
    children: their pids are no stranger's."""
    reap_watchers(within)
    for pid in _watchers:
        with suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    reap_watchers(within)


def reap_watchers(within: float = 2.0) -> None:
    """Reap the watchers that have ended (each ends with its guard), waiting `within` seconds
    at most for those still there (on a pidfd: readable once the process has ended)."""
    import select
    import time

    until = time.monotonic() + within
    for pid in list(_watchers):
        left = until - time.monotonic()
        if left > 0:
            with suppress(OSError):  # gone already, or no pidfd here: waitpid says
                pidfd = os.pidfd_open(pid)
                try:  # poll: select takes no descriptor numbered 1024 or more
                    poller = select.poll()
                    poller.register(pidfd, select.POLLIN)
                    poller.poll(left * 1000)
                finally:
                    os.close(pidfd)
        try:
            ended = os.waitpid(pid, os.WNOHANG)[0] == pid
        except ChildProcessError:  # reaped already (once as PID 1 reaps every child)
            ended = True
        if ended:
            _watchers.remove(pid)


def open_fds() -> Iterable[int]:
    """This process's descriptors: the ones /proc lists (its listing's own among them, closed
    by now), else every number up to the limit."""
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return range(3, MAXFD)


def _inheritable() -> list[int]:
    """This process's descriptors that an exec keeps (0-2, and any made so)."""
    found = []
    for fd in open_fds() if os.path.isdir("/proc/self/fd") else ():  # no loop to the limit
        with suppress(OSError):  # not open (the listing's own, closed by now)
            if os.get_inheritable(fd):
                found.append(fd)
    return found


def ignore(_signum: int, _frame: object) -> None:
    pass


def _load_prctl() -> Callable[..., int] | None:
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: no parent-death signal
        return None


# Loaded here, in the wrapper, once: every guard forked from it needs them at once (importing
# them in each guard cost milliseconds each).
PRCTL = _load_prctl()

try:  # the descriptor limit, for a system without /proc (as subprocess.MAXFD)
    MAXFD = max(256, os.sysconf("SC_OPEN_MAX"))
except (AttributeError, ValueError, OSError):
    MAXFD = 256


def set_parent_death_signal(sig: int) -> None:
    if PRCTL is not None:  # None: not Linux, no parent-death signal
        PRCTL(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)

"""The guard and the lease's deadline: what dies when, with real processes and signals.

- Killing the guard, or the wrapper and the guard together, leaves nothing of the command
  running, and nothing is recorded that would let a retry start beside it.
- The guard is told apart from the wrapper in ps and by pkill -f.
- A stopped owner's command, deaf to SIGTERM, is dead before a takeover's command starts.
- --timeout's grace sleeps; --kill-after must fit --stale-after.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import suppress
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import ONCE, continue_if_sqlite, run_once, wait_for
from ledger_sql import query
from procs import (
    alive,
    children,
    parent,
    pid_namespace,
    pids,
    process_group,
    start_once,
    stat,
)

pytestmark = pytest.mark.tables_made  # but where a test says otherwise

DAY = ["--every", "day"]
CALM = "60s"  # a database stalled by a loaded machine must not fence anyone out

# The shell's pid, then its background sleep's; both live until killed.
SLEEPER = ('exec 2>>"$DIR/child.err"; echo $$ > "$DIR/pids"; '
           'sleep 600 & echo $! >> "$DIR/pids"; wait')
# Deaf to SIGTERM, a timestamp (its own clock) a line every 0.1 s, the first one at once.
LOGGER = ('exec 2>>"$DIR/child.err"; trap "" TERM; echo $$ > "$DIR/pids"; '
          'while :; do date +%s.%N >> "$DIR/first.log"; sleep 0.1; done')


@pytest.fixture(autouse=True)
def no_strays(tmp_path: Path) -> Iterator[None]:
    """Whatever a failing test left running of the commands it started is killed."""
    yield
    for pid in pids(tmp_path / "pids", 1) or []:
        if alive(pid):
            os.killpg(process_group(pid), signal.SIGKILL)


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    return {**once_env, "DIR": str(tmp_path)}


@pytest.fixture
def sqlite_env(tmp_path: Path) -> dict[str, str]:
    """For what does not depend on the ledger: a SQLite file of the test's own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env.update(ONCE_DATABASE_URL=f"sqlite:///{tmp_path}/ledger.db", DIR=str(tmp_path),
               XDG_STATE_HOME=str(tmp_path / "state"))
    return env


def group(pgid: int) -> list[int]:
    """The live processes of a process group."""
    found = []
    for entry in os.listdir("/proc"):
        fields = stat(int(entry)) if entry.isdigit() else None
        if fields is not None and int(fields[2]) == pgid and fields[0] not in "ZXx":
            found.append(int(entry))
    return found


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()


def started(tmp_path: Path, count: int = 2) -> tuple[list[int], int]:
    """The command's pids (as it wrote them) and its guard's pid."""
    written = wait_for(lambda: pids(tmp_path / "pids", count), what="the command's pids")
    return written, parent(written[0])


# -- the guard's death -------------------------------------------------------------------------


def test_killing_the_guard_kills_the_command_before_anything_is_recorded(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    owner = start_once("run", "--job", "guard", *DAY, "--stale-after", CALM, "--", "sh", "-c",
                       SLEEPER, env=env)
    (shell, sleeper), guard = started(tmp_path)
    assert process_group(shell) == guard == process_group(sleeper)
    os.kill(guard, signal.SIGKILL)
    killed = time.monotonic()
    wait_for(lambda: not group(guard), timeout=2.0,
             what="the command and its child to die with the guard")
    assert time.monotonic() - killed < 2.0
    status = owner.wait(30)
    err = owner.stderr.read() if owner.stderr else ""
    # Recorded only now, with the whole group dead: the retry it allows runs alone.
    assert not group(guard) and not alive(shell) and not alive(sleeper)
    assert status == 137, err
    lines = err.splitlines()
    assert len(lines) == 1 and "guard process was killed by signal 9" in lines[0], err
    assert "recorded failed" in lines[0]
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", 137)]
    assert query(ledger_url, "SELECT outcome FROM once_attempts") == [("guard-died",)]
    retry = run_once("run", "--job", "guard", *DAY, "--stale-after", CALM, "--", "true",
                     env=env)
    assert retry.returncode == 0, retry.stderr
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]


def test_killing_wrapper_and_guard_together_kills_the_command(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    # The command holds a parent-death SIGKILL of its own: nobody of ours is left to kill it.
    owner = start_once("run", "--job", "both", *DAY, "--stale-after", CALM, "--", "sh", "-c",
                       'echo $$ > "$DIR/pids"; exec sleep 600', env=env)
    (command,), guard = started(tmp_path, 1)
    for pid in (owner.pid, guard):
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not alive(command), timeout=2.0, what="the command to die")
    owner.wait(10)
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("running", 1)]



@pytest.mark.parametrize("command", [
    ["run", "--job", "both", *DAY, "--stale-after", CALM],
    ["catchup", "--job", "both", *DAY, "--stale-after", CALM, "--since", "2026-01-01"],
    ["lead", "--name", "both", "--lease", CALM]], ids=["run", "catchup", "lead"])
def test_killing_wrapper_and_guard_together_kills_what_the_command_started(
        env: dict[str, str], tmp_path: Path, command: list[str]) -> None:
    # `pkill -9 -f once`: the command dies of its parent-death signal, and what it started
    # (a shell's child) ran on beside the next owner or leader, nobody of ours left to kill
    # the group. The guard's watcher (the wrapper's child, no `once` in its command line)
    # kills the group when the guard dies without saying it is done. The wrapper is stopped
    # first: it cannot answer the guard's death itself, as it would were it killed later.
    owner = start_once(*command, "--", "sh", "-c", SLEEPER, env=env)
    (shell, sleeper), guard = started(tmp_path)
    watchers = [pid for pid in children(owner.pid, watchers=True) if pid != guard]
    assert len(watchers) == 1 and "once" not in cmdline(watchers[0]), watchers
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        os.kill(guard, signal.SIGKILL)
        wait_for(lambda: not alive(shell) and not alive(sleeper), timeout=10.0,
                 what="the command and what it started to die with the guard")
        assert not group(guard)
        wait_for(lambda: not alive(watchers[0]), timeout=10.0, what="the watcher to end")
    finally:
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)





# The shell's pid, then its background sleep's (deaf to SIGTERM); the shell ends at `go`.
ENDS_AT_GO = ('exec 2>>"$DIR/child.err"; echo $$ > "$DIR/pids"; '
              'sh -c \'trap "" TERM; exec sleep 600\' & echo $! >> "$DIR/pids"; '
              'while [ ! -e "$DIR/go" ]; do sleep 0.05; done')


def test_what_a_term_leaves_dies_with_it_while_once_lead_is_stopped(
        env: dict[str, str], tmp_path: Path) -> None:
    # The guard said `done` to its watcher as its command ended; what the command left in
    # the group was then the wrapper's alone to kill at the term's end. A `once lead` stopped
    # (SIGSTOP, a debugger, starved) then left it running past the lease, beside the next
    # leader, and for good once killed (an attacker's finding). The guard now kills the
    # group itself as a term's command ends.
    owner = start_once("lead", "--name", "leaves", "--lease", CALM, "--", "sh", "-c",
                       ENDS_AT_GO, env=env)
    (shell, leftover), _ = started(tmp_path)
    os.kill(owner.pid, signal.SIGSTOP)
    try:
        (tmp_path / "go").touch()  # the term's command ends on its own
        wait_for(lambda: not alive(shell), timeout=10.0, what="the command to end")
        wait_for(lambda: not alive(leftover), timeout=10.0,
                 what="what the command left to die while once is stopped")
    finally:
        os.kill(owner.pid, signal.SIGCONT)
    owner.wait(30)
    assert owner.returncode == 0, owner.stderr.read() if owner.stderr else ""


def test_a_command_s_own_kill_0_leaves_its_children_their_handlers(
        env: dict[str, str], tmp_path: Path) -> None:
    # `trap 'kill 0' EXIT`, a script's clean-up: its SIGTERM reaches the guard too, and a
    # guard that took it for a stop SIGKILLed the children as the script ended, before their
    # own handlers had run (an attacker's finding). They run, as before.
    script = ('echo $$ > "$DIR/pids"; trap "kill 0" EXIT; '
              'sh -c \'trap "sleep 0.5; echo flushed > \\"$DIR/flushed\\"; exit 0" TERM; '
              'while :; do sleep 0.05; done\' & sleep 0.5')
    owner = start_once("run", "--job", "kill0", *DAY, "--", "sh", "-c", script, env=env)
    owner.wait(30)
    wait_for(lambda: (tmp_path / "flushed").exists(), timeout=10.0,
             what="the child's SIGTERM handler to run to its end")


def test_a_command_s_leftover_lives_on_after_a_plain_end(env: dict[str, str],
                                                         tmp_path: Path) -> None:
    # The documented other side: `once run`'s command that ends on its own, unstopped,
    # leaves what it started in the background running (the watcher's `case` says `done`
    # in every /bin/sh: yash's `[` needed a PATH, and the group was killed).
    owner = start_once("run", "--job", "plain", *DAY, "--", "sh", "-c", ENDS_AT_GO, env=env)
    (shell, leftover), _ = started(tmp_path)
    (tmp_path / "go").touch()
    assert owner.wait(30) == 0, owner.stderr.read() if owner.stderr else ""
    assert not alive(shell) and alive(leftover)
    os.kill(leftover, signal.SIGKILL)


def test_a_guard_whose_watcher_finds_no_descriptor_goes_without() -> None:
    # Out of descriptors at the watcher's pipe: a traceback, exit 1, the row left running
    # (an attacker's finding). As where no shell can start, the guard goes without one.
    from once.run import launch

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    taken: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    try:
        with suppress(OSError):  # every number under the limit taken
            while True:
                taken.append(os.open(os.devnull, os.O_RDONLY))
        with pytest.raises(OSError):
            os.pipe()
        assert launch.start_watcher() == -1
    finally:
        for fd in taken:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.parametrize("sh", ["dash", "bash", "busybox", "mksh", "yash", "zsh"])
@pytest.mark.parametrize("said", ["done", "killed", "nothing"])
def test_the_watcher_kills_the_group_only_when_the_guard_dies_in_every_sh(
        sh: str, said: str, tmp_path: Path) -> None:
    # The watcher's script as each POSIX shell Debian packages runs it as /bin/sh, in the
    # watcher's empty environment: yash ran its `[` only where PATH found one, and killed
    # the group after every `done` (an attacker's finding). As /bin/sh, each runs as `sh`.
    import shutil

    from once.run import launch

    found = shutil.which(sh)
    if found is None:
        if os.environ.get("ONCE_TEST_SHELLS") == "required":
            pytest.fail(f"ONCE_TEST_SHELLS=required, but there is no {sh}")
        pytest.skip(f"no {sh} (Debian: apt-get install {sh}; CI requires it)")
    victim = subprocess.Popen(["sleep", "60"], process_group=0)
    read, write = os.pipe()
    try:
        errors = tmp_path / "watcher.err"
        watcher = os.posix_spawn(found, ["sh", "-c", launch._WATCHER], {}, file_actions=[
            (os.POSIX_SPAWN_DUP2, read, 3),
            (os.POSIX_SPAWN_OPEN, 2, str(errors), os.O_WRONLY | os.O_CREAT, 0o600)])
        os.close(read)
        told = {"done": f"{victim.pid}\ndone\n", "killed": f"{victim.pid}\n",
                "nothing": ""}[said]
        os.write(write, told.encode())
        os.close(write)  # the guard's end: it ended (done), or died
        status = os.waitpid(watcher, 0)[1]
        complaint = errors.read_text()
        if said == "killed":
            assert victim.wait(10) == -signal.SIGKILL, complaint
        else:
            assert os.waitstatus_to_exitcode(status) == 0, complaint
            assert victim.poll() is None, complaint
    finally:
        victim.kill()
        victim.wait()


# As PID 1 of a container, a program that waits for its own children alone (a scheduler that
# runs `once run` with subprocess): then counts the zombies of its namespace.
_REAPS_ITS_OWN = """
import os, subprocess, sys
for number in range(3):
    subprocess.run([sys.argv[1], "run", "--job", f"z{number}", "--every", "day", "--", "true"])
subprocess.run([sys.argv[1], "catchup", "--job", "zc", "--every", "day", "--since",
                "2026-01-01", "--until", "2026-01-04", "--", "true"])
states = [open(f"/proc/{p}/stat").read().rpartition(")")[2].split()[0]
          for p in os.listdir("/proc") if p.isdigit()]
print(states.count("Z"))
"""


def test_a_guard_s_watcher_leaves_no_zombie_under_an_init_that_reaps_only_its_own(
        env: dict[str, str]) -> None:
    done = subprocess.run([*pid_namespace("--mount-proc"), sys.executable, "-c", _REAPS_ITS_OWN,
                           ONCE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0"], (done.stdout, done.stderr)


def test_pkill_f_once_run_spares_the_guard_which_kills_the_whole_group(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    owner = start_once("run", "--job", "pkill", *DAY, "--stale-after", CALM, "--", "sh", "-c",
                       SLEEPER, env=env)
    (shell, sleeper), guard = started(tmp_path)
    # `pkill -9 -f 'once run'`, kept to this test's own processes: the wrapper and what it
    # started.
    tree = [owner.pid, guard, shell, sleeper]
    matched = [pid for pid in tree if alive(pid) and "once run" in cmdline(pid)]
    assert matched == [owner.pid]
    for pid in matched:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not group(guard), timeout=2.0, what="the whole group to die")
    owner.wait(10)
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("running", 1)]


def test_the_guard_is_named_once_guard_job_period(sqlite_env: dict[str, str],
                                                   tmp_path: Path) -> None:
    owner = start_once("run", "--job", "named", "--every", "day", "--stale-after", CALM, "--",
                       "sh", "-c", SLEEPER, env=sqlite_env)
    try:
        _, guard = started(tmp_path)
        period = time.strftime("%Y-%m-%d", time.gmtime())
        assert Path(f"/proc/{guard}/comm").read_text().strip() == "once-guard"
        assert cmdline(guard) == f"once-guard named {period}"
        assert "once run" in cmdline(owner.pid)
        assert children(owner.pid) == [guard]
    finally:
        owner.send_signal(signal.SIGTERM)
        owner.wait(30)


# -- the lease's deadline ----------------------------------------------------------------------


@pytest.mark.slow
def test_a_stopped_owners_command_is_dead_before_the_takeover_starts(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    # --kill-after is left to its default (10 s), which a 3 s lease cuts to 1 s: SIGTERM a
    # second before the deadline, SIGKILL at it, from the guard (the wrapper is stopped).
    args = ["run", "--job", "stopped", *DAY, "--stale-after", "3s", "--"]
    first = start_once(*args, "sh", "-c", LOGGER, env=env)
    (shell,), _ = started(tmp_path, 1)
    wait_for(lambda: (tmp_path / "first.log").exists(), what="the first command's log")
    os.kill(first.pid, signal.SIGSTOP)
    try:
        def took_over() -> bool:
            result = run_once(*args, "sh", "-c", 'date +%s.%N > "$DIR/second"', env=env)
            assert result.returncode == 0, result.stderr
            return (tmp_path / "second").exists()

        # (SQLite: the stopped owner's OS lock holds the row until it is continued.)
        continue_if_sqlite(ledger_url, first, shell, took_over, 3.0)
        wait_for(took_over, what="a second attempt to take over")
    finally:
        first.send_signal(signal.SIGCONT)  # (reaped already on SQLite: then a no-op)
    status = first.wait(30)
    assert status == 70
    last_line = float((tmp_path / "first.log").read_text().split()[-1])
    second_began = float((tmp_path / "second").read_text())
    assert last_line < second_began, (
        f"the stopped owner's command wrote {last_line - second_began:.2f}s after the "
        f"takeover's command began")
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]


@pytest.mark.slow
def test_the_timeout_grace_sleeps(sqlite_env: dict[str, str], tmp_path: Path) -> None:
    # --timeout 1s --kill-after 4s on a command deaf to SIGTERM: four seconds of waiting for
    # the SIGKILL, which must not be spent spinning. The ledger is made first: creating its
    # tables costs a first run more CPU than the limit.
    warm = run_once("run", "--job", "warm", *DAY, "--", "true", env=sqlite_env)
    assert warm.returncode == 0, warm.stderr
    proc = subprocess.Popen(
        [ONCE, "run", "--job", "grace", *DAY, "--stale-after", CALM, "--timeout",
         "1s", "--kill-after", "4s", "--", "sh", "-c", 'trap "" TERM; sleep 600 & wait'],
        env=sqlite_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    began = time.monotonic()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    took = time.monotonic() - began
    assert proc.returncode == 124
    assert took >= 5.0 - 0.2
    cpu = usage.ru_utime + usage.ru_stime  # once, its guard and the command, all of it
    assert cpu < 1.0, f"{cpu:.2f}s of CPU in {took:.1f}s"


# -- --kill-after must fit --stale-after -------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("how", ["run", "catchup", "environment"])
def test_a_kill_after_that_does_not_fit_stale_after_is_a_usage_error(
        sqlite_env: dict[str, str], tmp_path: Path, how: str) -> None:
    env = dict(sqlite_env)
    given = ["--kill-after", "2s"]
    if how == "environment":
        env["ONCE_RUN_KILL_AFTER"], given = "2s", []
    command = "catchup" if how == "catchup" else "run"
    # A few days to make up (from 2026-01-01 it was hundreds: past run_once's minute under load).
    since = (datetime.now(UTC) - timedelta(days=3)).date().isoformat()
    extra = ["--since", since] if how == "catchup" else []
    result = run_once(command, "--job", "fit", *DAY, *extra, "--stale-after", "3s", *given,
                      "--", "touch", str(tmp_path / "ran"), env=env)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "once: --kill-after 2s does not fit --stale-after 3s: the command must be dead by "
        "the lease's deadline, so the grace is at most a third of --stale-after (1s)"]
    assert not (tmp_path / "ran").exists()
    assert not (tmp_path / "ledger.db").exists()  # nothing was claimed, nor even opened
    fits = run_once(command, "--job", "fit", *DAY, *extra, "--stale-after", "3s",
                    "--kill-after", "1s", "--", "touch", str(tmp_path / "ran"), env=sqlite_env)
    assert fits.returncode == 0, fits.stderr
    assert (tmp_path / "ran").exists()


def test_rerun_checks_kill_after_against_the_jobs_stale_after(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    first = run_once("run", "--job", "again", *DAY, "--stale-after", "3s", "--", "true",
                     env=env)
    assert first.returncode == 0, first.stderr
    (period,) = query(ledger_url, "SELECT period FROM once_runs")[0]
    result = run_once("rerun", "--job", "again", "--period", period, "--kill-after", "2s",
                      "--", "touch", str(tmp_path / "ran"), env=env)
    assert result.returncode == 2, result.stderr
    assert "does not fit --stale-after 3s" in result.stderr
    assert not (tmp_path / "ran").exists()
    assert query(ledger_url, "SELECT count(*) FROM once_attempts") == [(1,)]


# Started by a parent that leaks its descriptors (1100 of them, past select()'s 1024): once's
# own pipes, and its guard's, are numbered past 1024.
_MANY_FDS = ("import os, resource, sys\n"
             "resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))\n"
             "for _ in range(1100): os.set_inheritable(os.open(os.devnull, os.O_RDONLY), True)\n"
             "os.execv(sys.argv[1], sys.argv[1:])\n")


def test_once_runs_with_descriptors_numbered_past_1024(once_env: dict[str, str],
                                                       ledger_url: str) -> None:
    hard = __import__("resource").getrlimit(__import__("resource").RLIMIT_NOFILE)[1]
    if hard != -1 and hard < 4096:
        pytest.skip("the hard limit on open files is below 4096")
    for tail in ("16KiB", "0"):
        result = subprocess.run(
            [sys.executable, "-c", _MANY_FDS, ONCE, "run", "--job", f"fds-{tail}", *DAY,
             "--output-tail", tail, "--", "echo", "hi"],
            env=once_env, capture_output=True, text=True, timeout=60)
        assert (result.returncode, result.stdout, result.stderr) == (0, "hi\n", ""), tail
    assert query(ledger_url, "SELECT job, outcome FROM once_attempts ORDER BY job") == [
        ("fds-0", "done"), ("fds-16KiB", "done")]


def test_the_command_gets_stdio_alone_and_sigpipe_at_default(once_env: dict[str, str]) -> None:
    """Whatever once's parent leaked, and once's own pipes, stay out of the command; SIGPIPE
    and SIGXFSZ, which Python ignores for itself, are the command's at their default (as a
    shell gives them): `once run -- yes | head -1` ends as `yes | head -1` does."""
    script = "ls /proc/$$/fd; grep SigIgn /proc/$$/status"  # the shell's own, no pipe
    for tail in ("16KiB", "0"):
        result = subprocess.run(
            [sys.executable, "-c", _MANY_FDS, ONCE, "run", "--job", f"stdio-{tail}", *DAY,
             "--output-tail", tail, "--", "sh", "-c", script],
            env=once_env, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        fds, ignored = result.stdout.split("SigIgn:")
        assert fds.split() == ["0", "1", "2"], tail
        mask = int(ignored.strip(), 16)
        assert not mask & (1 << (signal.SIGPIPE - 1)), tail
        assert not mask & (1 << (signal.SIGXFSZ - 1)), tail


# The guard's child, between its fork and its exec, with a SIGTERM arriving right there (as a
# forwarded one can): the guard's own handler, inherited by the fork, must not swallow it.
_SIGNAL_IN_THE_WINDOW = """
import os, signal, sys
from once.run import launch
signal.signal(signal.SIGTERM, launch.ignore)  # a handler of the guard's
close = launch._close_inherited
def close_and_signal(keep):
    close(keep)
    os.kill(os.getpid(), signal.SIGTERM)
launch._close_inherited = close_and_signal
pid = launch.start(["sh", "-c", "echo started"], dict(os.environ), {}, os.getpid())
status = os.waitpid(pid, 0)[1]
print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else f"exit {os.WEXITSTATUS(status)}")
"""


def test_a_signal_between_fork_and_exec_reaches_the_command() -> None:
    result = subprocess.run([sys.executable, "-c", _SIGNAL_IN_THE_WINDOW],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{int(signal.SIGTERM)}\n"  # not "started": it never ran


# once (wrapper.run, a forked guard) gets SIGTERM while its guard is at a point of its way to
# the command's exec: the guard, held there by a hook, sends it and waits until the signal
# forwarded to its group has reached it. argv: the point, then the file the command touches.
_SIGNAL_WHILE_STARTING = """
import os, signal, sys, time
from once.run import launch, wrapper
point, ran = sys.argv[1], sys.argv[2]
once = os.getpid()

def stopped_here(blocked):
    got = []
    if not blocked:  # the guard's handler, as it is, and a note that it ran
        previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, lambda n, f: (got.append(n), previous(n, f)))
    os.kill(once, signal.SIGTERM)
    give_up = time.monotonic() + 30
    while not (got or blocked and signal.SIGTERM in signal.sigpending()):
        if time.monotonic() > give_up:
            os._exit(3)
        time.sleep(0.001)

def hooked(name, before=None, after=None):
    real = getattr(launch, name)
    def hook(*args):
        if before is not None:
            before()
        result = real(*args)
        if after is not None:
            after()
        return result
    setattr(launch, name, hook)

if point == "forked":  # the guard just forked, its handlers not yet in
    hooked("hold_stop_signals", before=lambda: stopped_here(True))
elif point == "searching":  # its handlers in, looking for the command's file
    hooked("found_on_path", before=lambda: stopped_here(False))
else:  # "forking": it has looked for a held signal, its fork is next
    hooked("stop_held", after=lambda: stopped_here(True))
outcome = wrapper.run(["sh", "-c", 'touch "$1"', "sh", ran], dict(os.environ), None)
print(outcome.kind, outcome.status, outcome.interrupted_by, os.path.exists(ran))
"""


@pytest.mark.parametrize("point", ["forked", "searching", "forking"])
def test_a_stop_signal_while_the_guard_starts_the_command_keeps_it_from_starting(
        tmp_path: Path, point: str) -> None:
    # It was swallowed by the guard (its handler ignored what its group was sent): the command
    # ran in full, the attempt was recorded interrupted, and the period ran again (an outside
    # attacker's finding). Now the command does not start, as one the signal reached before
    # its exec.
    ran = tmp_path / "ran"
    result = subprocess.run([sys.executable, "-c", _SIGNAL_WHILE_STARTING, point, str(ran)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"signaled 143 {int(signal.SIGTERM)} False\n", result.stderr
    assert not ran.exists()


# -- a catch-up's kept guard (once.run.keeper) -------------------------------------------------

MINUTES = ["--every", "minute", "--since", "2026-01-01T00:00", "--until", "2026-01-01T00:03"]
SECOND = "2026-01-01T00:01+00:00"
# Each period logs its key and its guard's pid; the one named $SLOW waits to be killed.
PERIOD_LOG = ('echo "$ONCE_PERIOD $PPID" >> "$DIR/log"; '
              'if [ "$ONCE_PERIOD" = "$SLOW" ]; then echo $$ > "$DIR/pids"; exec sleep 600; fi')


def period_log(tmp_path: Path) -> list[tuple[str, int]]:
    return [(key, int(guard)) for key, guard in
            (line.split() for line in (tmp_path / "log").read_text().splitlines())]


def test_a_killed_kept_guard_reaches_only_the_period_it_was_running(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    catchup = ["catchup", "--job", "kept", *MINUTES, "--stale-after", CALM, "--keep-going",
               "--", "sh", "-c", PERIOD_LOG]
    owner = start_once(*catchup, env={**env, "SLOW": SECOND})
    (command,), guard = started(tmp_path, 1)
    assert period_log(tmp_path)[0] == ("2026-01-01T00:00+00:00", guard)  # kept from the first
    os.kill(guard, signal.SIGKILL)
    wait_for(lambda: not alive(command), timeout=2.0, what="the command to die with its guard")
    status = owner.wait(60)
    err = owner.stderr.read() if owner.stderr else ""
    assert status == 137, err  # --keep-going: the first failure's status
    assert "guard process was killed by signal 9" in err and "recorded failed" in err, err
    runs = period_log(tmp_path)
    assert [key for key, _ in runs] == [f"2026-01-01T00:0{n}+00:00" for n in range(4)]
    later = {pid for _, pid in runs[2:]}
    assert len(later) == 1 and guard not in later  # a new guard, itself kept
    assert query(ledger_url, "SELECT period, status, attempt, exit_code FROM once_runs "
                 "ORDER BY period") == [
        ("2026-01-01T00:00+00:00", "done", 1, 0), (SECOND, "failed", 1, 137),
        ("2026-01-01T00:02+00:00", "done", 1, 0), ("2026-01-01T00:03+00:00", "done", 1, 0)]
    assert query(ledger_url, f"SELECT outcome FROM once_attempts WHERE period = '{SECOND}'"
                 ) == [("guard-died",)]
    again = run_once(*catchup, env=env)  # the failure is retried, and it alone
    assert again.returncode == 0, again.stderr
    assert [key for key, _ in period_log(tmp_path)[4:]] == [SECOND]
    assert query(ledger_url, f"SELECT status, attempt FROM once_runs WHERE period = '{SECOND}'"
                 ) == [("done", 2)]


def test_a_kept_guard_runs_more_periods_than_it_may_open_descriptors(
        sqlite_env: dict[str, str], tmp_path: Path) -> None:
    # It kept a descriptor of each period's command (its pidfd): past the limit on open files
    # (1,024 where nobody raised it: a minutely job down for 17 hours), a period's command
    # could not start ("Too many open files", recorded failed) and the catch-up stopped.
    limit = 64
    hours = ["--every", "minute", "--since", "2026-01-01T00:00", "--until", "2026-01-01T02:00"]
    result = subprocess.run(
        [ONCE, "catchup", "--job", "many", *hours, "--", "true"], env=sqlite_env,
        capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit)))
    assert result.returncode == 0, result.stderr[-2000:]
    assert query(f"sqlite:///{tmp_path / 'ledger.db'}",
                 "SELECT status, count(*) FROM once_runs GROUP BY status") == [("done", 121)]


def test_a_command_that_leaves_a_process_behind_gets_a_new_guard_for_the_next_period(
        env: dict[str, str], tmp_path: Path) -> None:
    # What it left keeps running, as after a guard of its own, and no later period's group
    # (nor a signal to it) can reach it.
    leave = ('echo "$ONCE_PERIOD $PPID" >> "$DIR/log"; '
             'if [ "$ONCE_PERIOD" = "$SLOW" ]; then sleep 600 & echo $! > "$DIR/pids"; fi')
    result = run_once("catchup", "--job", "left", *MINUTES, "--", "sh", "-c", leave,
                      env={**env, "SLOW": SECOND})
    assert result.returncode == 0, result.stderr
    (left,) = pids(tmp_path / "pids", 1) or []
    guards = [pid for _, pid in period_log(tmp_path)]
    assert guards[0] == guards[1] != guards[2] == guards[3]
    assert alive(left) and process_group(left) == guards[1]


def test_a_period_that_was_stopped_gets_its_successor_a_new_guard(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    slow = ('echo "$ONCE_PERIOD $PPID" >> "$DIR/log"; '
            'if [ "$ONCE_PERIOD" = "$SLOW" ]; then exec sleep 600; fi')
    result = run_once("catchup", "--job", "stopped", *MINUTES, "--timeout", "1s",
                      "--kill-after", "1s", "--keep-going", "--", "sh", "-c", slow,
                      env={**env, "SLOW": SECOND})
    assert result.returncode == 124, result.stderr
    guards = [pid for _, pid in period_log(tmp_path)]
    assert guards[0] == guards[1] != guards[2] == guards[3]
    assert query(ledger_url, "SELECT status FROM once_runs ORDER BY period") == [
        ("done",), ("failed",), ("done",), ("done",)]


def waits_for_a_request(guard: int) -> bool:
    """The kept guard is idle: blocked reading its request socket (its period reaped, its
    `ready` said)."""
    return Path(f"/proc/{guard}/wchan").read_text().startswith("unix_stream")


# The first period ($FIRST) waits for $DIR/go; the others then do what follows.
HOLD_FIRST = ('echo "$ONCE_PERIOD $PPID" >> "$DIR/log"; '
              'if [ "$ONCE_PERIOD" = "$FIRST" ]; then echo $$ > "$DIR/pids"; '
              'while [ ! -e "$DIR/go" ]; do sleep 0.05; done; else {others}; fi')


def stop_while_idle(tmp_path: Path, guard: int) -> None:
    """Let the first period end with its result held back (SQLite's write lock), its kept
    guard idle, waiting for the next period's request, and stop the guard there."""
    ledger = sqlite3.connect(tmp_path / "ledger.db", isolation_level=None, timeout=10)
    ledger.execute("BEGIN IMMEDIATE")  # the first period's result waits, its guard idle
    try:
        (tmp_path / "go").touch()
        wait_for(lambda: waits_for_a_request(guard), what="the guard to wait for a period")
        os.kill(guard, signal.SIGSTOP)
    finally:
        ledger.execute("ROLLBACK")
        ledger.close()


def test_a_kept_guard_stopped_between_periods_sees_the_renewals_made_meanwhile(
        sqlite_env: dict[str, str], tmp_path: Path) -> None:
    # The guard is stopped (SIGSTOP, or a machine too loaded to run it) after it said `ready`
    # and before it read the next period's request; the wrapper, alive, claims that period and
    # renews the claim past the deadline the request carried. On SIGCONT the guard must go by
    # those renewals, as a forked guard does (they wait in its deadline pipe), and not kill the
    # command at once for a deadline that never passed: the period is the wrapper's, and done.
    first = "2026-01-01T00:00+00:00"
    hold = HOLD_FIRST.format(others="sleep 0.5")
    owner = start_once("catchup", "--job", "idle", *MINUTES, "--stale-after", "3s", "--",
                       "sh", "-c", hold, env={**sqlite_env, "FIRST": first})
    _, guard = started(tmp_path, 1)
    stop_while_idle(tmp_path, guard)
    try:
        time.sleep(5.0)  # the next period claimed, its request sent, its claim renewed
    finally:
        os.kill(guard, signal.SIGCONT)
    status = owner.wait(60)
    err = owner.stderr.read() if owner.stderr else ""
    assert status == 0, err
    assert [key for key, _ in period_log(tmp_path)] == [
        f"2026-01-01T00:0{n}+00:00" for n in range(4)]


def _sending(pid: int) -> bool:
    """The process waits in sendmsg or sendto, or in poll (a send with a timeout waits
    there): x86-64's numbers; elsewhere, not known (True)."""
    if os.uname().machine != "x86_64":
        return True
    with suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/syscall").read_text().split()[0] in ("7", "44", "46")
    return False


def request_on_its_way(tmp_path: Path, pid: int) -> None:
    """Wait until the next period is claimed and its request sent, or being sent: a signal
    before the send keeps the command from starting, with nothing to forward."""
    wait_for(lambda: query(f"sqlite:///{tmp_path / 'ledger.db'}", "SELECT count(*) FROM "
                           "once_runs WHERE status = 'running'") == [(1,)] and _sending(pid),
             timeout=30, what="the next period's request")


def test_a_stopped_kept_guard_does_not_keep_once_from_a_signal(
        sqlite_env: dict[str, str], tmp_path: Path) -> None:
    # The next period's request is larger than the socket takes (a megabyte of
    # environment), and the guard, stopped, reads none of it: once's send gives up (at most
    # SEND_WAIT) and acts on the SIGTERM that came meanwhile. It waited for as long as the
    # guard was stopped, deaf to signals (an outside attacker's finding).
    from once.run.keeper import SEND_WAIT

    big = {f"ONCE_TEST_BIG{n}": str(n) * 100_000 for n in range(10)}
    first = "2026-01-01T00:00+00:00"
    hold = HOLD_FIRST.format(others="true")
    owner = start_once("catchup", "--job", "deaf", *MINUTES, "--stale-after", CALM,
                       "--kill-after", "1s", "--", "sh", "-c", hold,
                       env={**sqlite_env, **big, "FIRST": first})
    _, guard = started(tmp_path, 1)
    stop_while_idle(tmp_path, guard)
    try:
        request_on_its_way(tmp_path, owner.pid)
        os.kill(owner.pid, signal.SIGTERM)
        began = time.monotonic()
        status = owner.wait(60)
        took = time.monotonic() - began
    finally:
        with suppress(ProcessLookupError):  # killed with its period, stopped as it was
            os.kill(guard, signal.SIGCONT)
    err = owner.stderr.read() if owner.stderr else ""
    assert status == 143, err
    assert took < SEND_WAIT + 1 + 10, took  # the send's bound, --kill-after, a loaded margin
    assert [key for key, _ in period_log(tmp_path)] == [first]  # the next one never started


def test_a_kept_guard_that_does_not_take_its_request_is_a_guard_that_died(
        sqlite_env: dict[str, str], tmp_path: Path) -> None:
    # Stopped and never continued: the request is not taken within SEND_WAIT, the guard is
    # killed, and the period is recorded as one whose guard died (it said `cannot run`, exit
    # 126, as if the command could not be run); the next period gets a new guard.
    big = {f"ONCE_TEST_BIG{n}": str(n) * 100_000 for n in range(10)}
    owner = start_once("catchup", "--job", "mute", *MINUTES, "--stale-after", CALM,
                       "--keep-going", "--", "sh", "-c", HOLD_FIRST.format(others="true"),
                       env={**sqlite_env, **big, "FIRST": "2026-01-01T00:00+00:00"})
    _, guard = started(tmp_path, 1)
    stop_while_idle(tmp_path, guard)
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    status = owner.wait(60)
    err = owner.stderr.read() if owner.stderr else ""
    assert status == 137, err  # --keep-going: the first failure's status
    assert "cannot run" not in err, err
    assert query(ledger_url, "SELECT period, status, exit_code FROM once_runs "
                 "ORDER BY period") == [
        ("2026-01-01T00:00+00:00", "done", 0), (SECOND, "failed", 137),
        ("2026-01-01T00:02+00:00", "done", 0), ("2026-01-01T00:03+00:00", "done", 0)]
    assert query(ledger_url, f"SELECT outcome FROM once_attempts WHERE period = '{SECOND}'"
                 ) == [("guard-died",)]
    assert not alive(guard)


def _pending(pid: int, sig: int) -> bool:
    """`sig` waits to be delivered to the (stopped) process."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("ShdPnd:", "SigPnd:")) and int(line.split()[1], 16) >> (sig - 1) & 1:
            return True
    return False


def test_a_stop_signal_that_reaches_the_kept_guard_before_its_command_stops_the_command(
        sqlite_env: dict[str, str], tmp_path: Path) -> None:
    # once forwards SIGTERM to the group while the kept guard is yet to read the period's
    # request (stopped here; slow to wake on a loaded machine): the command must not start
    # deaf to it. It started, ran to its end, and was recorded interrupted (an outside
    # attacker's finding); now it is stopped before its start, as a forked guard's command
    # that the signal reaches before its exec.
    owner = start_once("catchup", "--job", "late", *MINUTES, "--stale-after", CALM, "--",
                       "sh", "-c", HOLD_FIRST.format(others="sleep 30"),
                       env={**sqlite_env, "FIRST": "2026-01-01T00:00+00:00"})
    _, guard = started(tmp_path, 1)
    stop_while_idle(tmp_path, guard)
    try:
        request_on_its_way(tmp_path, owner.pid)
        os.kill(owner.pid, signal.SIGTERM)
        wait_for(lambda: _pending(guard, signal.SIGTERM), timeout=30,
                 what="the SIGTERM forwarded to the stopped guard")
    finally:
        os.kill(guard, signal.SIGCONT)
    status = owner.wait(60)
    err = owner.stderr.read() if owner.stderr else ""
    assert status == 143, err
    assert [key for key, _ in period_log(tmp_path)] == ["2026-01-01T00:00+00:00"], err
    assert query(f"sqlite:///{tmp_path / 'ledger.db'}", "SELECT status, exit_code FROM "
                 f"once_runs WHERE period = '{SECOND}'") == [("failed", 143)]


def _one_line(owner: subprocess.Popen[str], status: int) -> str:
    """The one line `once` said, once it has exited with `status`."""
    err = owner.communicate(timeout=30)[1]
    assert owner.returncode == status, err
    (line,) = err.splitlines()
    return str(line)


def test_a_guard_killed_after_a_forwarded_signal_leaves_one_line(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    # A SIGTERM forwarded, then the guard killed from outside before it reported the
    # command's end: two lines said two things of one attempt ("recorded failed", then
    # "recorded failed (interrupted ...)").
    owner = start_once("run", "--job", "guard", *DAY, "--stale-after", CALM, "--", "sh", "-c",
                       SLEEPER, env=env)
    (shell, sleeper), guard = started(tmp_path)
    os.kill(guard, signal.SIGSTOP)  # it reports nothing: the command's end stays unknown
    try:
        owner.send_signal(signal.SIGTERM)
        wait_for(lambda: not alive(shell) and not alive(sleeper), timeout=10,
                 what="the forwarded SIGTERM to end the command")
    finally:
        os.kill(guard, signal.SIGKILL)
    line = _one_line(owner, 137)
    assert "SIGTERM received and forwarded to the command; once's guard process was killed " \
        "by signal 9" in line, line
    assert line.endswith("recorded failed (interrupted: not counted against --max-attempts)")
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", 137)]
    assert query(ledger_url, "SELECT outcome FROM once_attempts") == [("interrupted",)]


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
def test_a_guard_death_whose_result_the_ledger_refuses_is_one_line(
        env: dict[str, str], tmp_path: Path, ledger_url: str) -> None:
    # "recorded failed" was said before the write, then "was not recorded" after it.
    owner = start_once("run", "--job", "guard", *DAY, "--stale-after", CALM, "--", "sh", "-c",
                       SLEEPER, env=env)
    (_shell, _sleeper), guard = started(tmp_path)
    # The final write sets the status; a renewal does not.
    query(ledger_url, "CREATE TRIGGER refuse BEFORE UPDATE OF status ON once_runs "
                      "BEGIN SELECT RAISE(ABORT, 'refused by a trigger'); END")
    os.kill(guard, signal.SIGKILL)
    line = _one_line(owner, 75)
    # The command writes its pids before its guard says `started` (under load, the kill can
    # come in between: CI, 2026-12-07): the line then says so.
    assert re.search(r"once's guard process was killed by signal 9( before it said the "
                     r"command had started)?; the command(, if it had,)? was killed with it; "
                     r"the ledger refused the write, the result \(failed\) was not recorded",
                     line), line
    assert "recorded failed" not in line
    assert query(ledger_url, "SELECT status FROM once_runs") == [("running",)]


def test_the_guard_is_reaped_only_after_the_group_s_last_signal() -> None:
    # As PID 1 the wrapper reaps every orphan between its waits; it reaped the guard too, so
    # that the kills it then sent to the group (the guard's pid) could reach a newcomer given
    # that number (an outside attacker's finding). The guard's status is taken unreaped;
    # _release reaps it, after the group's last signal. Run as PID 1 would (every child
    # looked at), in a child of its own: it must see none of pytest's.
    from once.run.wrapper import _Supervisor

    def experiment() -> int:
        guard = os.fork()
        if guard == 0:
            os._exit(7)
        orphan = os.fork()
        if orphan == 0:
            os._exit(0)
        os.waitid(os.P_PID, orphan, os.WEXITED | os.WNOWAIT)  # both have ended
        os.waitid(os.P_PID, guard, os.WEXITED | os.WNOWAIT)
        supervisor = _Supervisor(None, 1.0, None)
        supervisor.guard, supervisor.reap_all = guard, True
        for _ in range(3):
            supervisor._reap(block=False)
        if os.waitid(os.P_PID, guard, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return 1  # the guard was reaped between waits
        supervisor._reap(block=True)  # the machine's Reap: its status, still unreaped
        if supervisor.guard_status is None or os.waitstatus_to_exitcode(
                supervisor.guard_status) != 7:
            return 3
        if os.waitid(os.P_PID, guard, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            return 5  # reaped before the group's last signal could go
        supervisor._release()
        try:
            os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return 0  # every child reaped, the orphan too
        return 4

    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = experiment()
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


# A leads its own group, forks B, B forks C and leaves the group (setsid); C ends, and B,
# alive, never reaps it; A writes B's pid and ends.
_ZOMBIE_LEFT = '''
import os, sys, time
b = os.fork()
if b == 0:
    c = os.fork()
    if c == 0:
        time.sleep(0.2)
        os._exit(0)
    os.setsid()
    time.sleep(600)
    os._exit(0)
with open(sys.argv[1], "w") as out:
    out.write(str(b))
'''


def test_the_group_s_end_is_not_waited_for_past_its_last_live_process(tmp_path: Path) -> None:
    # once lead's end of term waits (signal 0) for its group to be gone: a zombie whose
    # parent left the group and never reaps it kept signal 0 answering, and the release
    # waited out its whole patience (an outside attacker's finding: 5 s; a slow init's late
    # reaping of the killed does the same). Processes that have all ended run nothing.
    from once.run.guard import await_group_end

    listing = tmp_path / "pids"
    leader = subprocess.Popen([sys.executable, "-c", _ZOMBIE_LEFT, str(listing)],
                              process_group=0)
    leader.wait(timeout=30)
    group = leader.pid
    b = int(listing.read_text())
    try:
        zombie = wait_for(lambda: next(iter(children(b)), None), what="B's child")
        wait_for(lambda: stat(zombie) is not None and stat(zombie)[0] == "Z",
                 what="the zombie left in the group")
        assert int(stat(zombie)[2]) == group and int(stat(b)[2]) != group
        began = time.monotonic()
        await_group_end(group, False, patience=60)
        assert time.monotonic() - began < 30
    finally:
        os.kill(b, signal.SIGKILL)


# A leads its group and ends; B, left in it, has its first thread exit (pthread_exit) while
# a second runs on until the file is there: /proc shows B as a zombie, counting two threads.
_FIRST_THREAD_GONE = '''
import ctypes, os, sys, threading, time

def last():
    while not os.path.exists(sys.argv[1]):
        time.sleep(0.01)

b = os.fork()
if b == 0:
    threading.Thread(target=last).start()
    ctypes.CDLL(None).pthread_exit(None)
print(b, flush=True)
'''


def test_a_process_whose_first_thread_ended_is_waited_for(tmp_path: Path) -> None:
    # A zombie in /proc is not always an ended process: one whose first thread has exited
    # shows as one while its other threads run (what the wait for a term's group must not
    # take for gone).
    import threading

    from once.run.guard import await_group_end

    release = tmp_path / "release"
    leader = subprocess.Popen([sys.executable, "-c", _FIRST_THREAD_GONE, str(release)],
                              process_group=0, stdout=subprocess.PIPE, text=True)
    released: list[float] = []

    def let_go() -> None:
        released.append(time.monotonic())
        release.touch()

    try:
        assert leader.stdout is not None
        b = int(leader.stdout.readline())  # (B holds the pipe: no end of it to wait for)
        leader.wait(timeout=30)
        wait_for(lambda: (stat(b) or ["gone"])[0] == "Z", what="B's first thread to exit")
        timer = threading.Timer(1.5, let_go)
        timer.start()
        await_group_end(leader.pid, False, patience=60)
        assert released, "the group was taken for gone while a thread of it ran"
    finally:
        release.touch()
        if leader.stdout is not None:
            leader.stdout.close()

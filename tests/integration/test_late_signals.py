"""A stop signal that reaches `once` after its command ended on its own, before `once` has
heard so, is not the command's (an outside attacker's finding: a period done was recorded
interrupted and ran again, 9 in 250 signals at a command's end). The result is recorded
(done), then `once` dies of the signal; a catch-up starts no period after it.

Real `once` processes, guards and signals on every backend. The window is held open by the
command itself, which stops `once` before it exits; each signal is sent once the kernel shows
where things are: no sleeps. (A signal while the command is being started: test_guard.py.)
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import pytest

from child_log import DAY, day_key, stable_day
from helpers import ONCE, run_once, wait_for
from ledger_sql import placeholders, query
from procs import alive, children, guard_of, pid_namespace, reaped, start_once, stat

pytestmark = [pytest.mark.usefixtures("ledger_url"), pytest.mark.tables_made]


def attempts(url: str, job: str) -> list[tuple[object, ...]]:
    return [tuple(row) for row in query(url, placeholders(
        "SELECT period, attempt, outcome, exit_code FROM once_attempts WHERE job = ? "
        "ORDER BY period, attempt", url), (job,))]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def _state(pid: int) -> str:
    fields = stat(pid)
    return fields[0] if fields is not None else "gone"


# The command stops `once` (its guard's parent) and exits 0.
_STOPS_ONCE = 'kill -STOP "$(cut -d" " -f4 /proc/$PPID/stat)"; exit 0'


def _signalled_after_the_end(env: dict[str, str], reported: Callable[[int], bool],
                             *args: str) -> tuple[int, str]:
    """`once ARGS -- sh -c _STOPS_ONCE`, sent SIGTERM while stopped by its command, once
    reported(its pid) says the guard has reported the command's end, then continued: it
    hears both at once. Its status and stderr."""
    once = start_once(*args, "--", "sh", "-c", _STOPS_ONCE, env=env)
    try:
        wait_for(lambda: _state(once.pid) == "T", what="once to be stopped by its command")
        wait_for(lambda: reported(once.pid), what="the guard to report the command's end")
        once.send_signal(signal.SIGTERM)
        once.send_signal(signal.SIGCONT)
        _stdout, stderr = once.communicate(timeout=60)
    finally:
        reaped(once, 10)
    return once.returncode, stderr


def test_a_stop_signal_after_the_command_ended_on_its_own_is_not_the_command_s(
        env: dict[str, str], ledger_url: str) -> None:
    stable_day()
    status, stderr = _signalled_after_the_end(  # the guard reports the end, and exits
        env, lambda pid: [_state(guard) for guard in children(pid)] == ["Z"],
        "run", "--job", "ending", *DAY)
    assert attempts(ledger_url, "ending") == [(day_key(0), 1, "done", 0)], stderr
    assert status == -signal.SIGTERM, stderr  # it dies of it, the result written
    ran = Path(env["DIR"]) / "ran"
    again = run_once("run", "--job", "ending", *DAY, "--", "touch", str(ran), env=env)
    assert again.returncode == 0 and not ran.exists(), again.stderr  # done: not run again


def _kept_guard_waits(pid: int) -> bool:
    """The catch-up's kept guard has no command left and sleeps: it has reported the period's
    end and waits for the next."""
    [guard] = children(pid)
    return not children(guard) and _state(guard) == "S"


def test_a_catchup_whose_command_ended_before_the_signal_records_it_done(
        env: dict[str, str], ledger_url: str) -> None:
    # The same at a catch-up's period: done, and no period after it starts.
    status, stderr = _signalled_after_the_end(
        env, _kept_guard_waits, "catchup", "--job", "ending", *DAY, "--since", "2026-10-01",
        "--until", "2026-10-03")
    assert attempts(ledger_url, "ending") == [("2026-10-01", 1, "done", 0)], stderr
    assert status == 143, stderr
    assert "stopped by SIGTERM" in stderr.splitlines()[-1], stderr


def _sleeps(pid: int) -> int:
    """How many times pid's main thread has gone to sleep (its voluntary context switches)."""
    status = Path(f"/proc/{pid}/task/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines()
                if line.startswith("voluntary_ctxt_switches:"))


def _pending(pid: int, sig: signal.Signals) -> bool:
    """Whether sig waits to be delivered to pid."""
    status = Path(f"/proc/{pid}/status").read_text()
    return any(int(line.split()[1], 16) >> (sig - 1) & 1 for line in status.splitlines()
               if line.startswith(("SigPnd:", "ShdPnd:")))


def _waits(pid: int) -> bool:
    """Whether pid's main thread sleeps in poll (once's loop, the guard's watch)."""
    return "poll" in Path(f"/proc/{pid}/wchan").read_text() and _state(pid) == "S"


# Once its guard waits for it (its report of the start written), the command stops the guard
# and exits.
_STOPS_ITS_GUARD = 'until grep -q poll /proc/$PPID/wchan; do :; done; kill -STOP $PPID; exit 0'


def test_a_stop_signal_after_the_command_exited_before_its_guard_said_so_is_not_the_command_s(
        env: dict[str, str], ledger_url: str) -> None:
    # once gets SIGTERM with the command gone but its end not reported. It was sent to the
    # group and counted as the command's (recorded interrupted, run again); now the kernel is
    # asked first, and it is once's own.
    stable_day()
    once = start_once("run", "--job", "gone", *DAY, "--", "sh", "-c", _STOPS_ITS_GUARD,
                      env=env)
    try:
        guard = wait_for(lambda: guard_of(once.pid), what="the guard")
        wait_for(lambda: _state(guard) == "T" and [_state(pid) for pid in children(guard)]
                 == ["Z"], what="the command to end, its guard stopped")
        # Asleep with the report's pipe empty: it has read the guard's `started`.
        wait_for(lambda: _waits(once.pid), what="once to wait")
        asleep = _sleeps(once.pid)
        once.send_signal(signal.SIGTERM)
        # Handled (no longer pending), and once's main thread has slept again since: the turn
        # of its loop that took the signal is over.
        wait_for(lambda: not _pending(once.pid, signal.SIGTERM) and _sleeps(once.pid) > asleep
                 and _waits(once.pid), what="once to take the signal")
        os.kill(guard, signal.SIGCONT)
        _stdout, stderr = once.communicate(timeout=60)
    finally:
        reaped(once, 10)
    assert attempts(ledger_url, "gone") == [(day_key(0), 1, "done", 0)], stderr
    assert once.returncode == -signal.SIGTERM, stderr


def _worker_stopped(env: dict[str, str], ledger_url: str, job: str, leaves: str,
                    when: Callable[[subprocess.Popen[str], Path], None]) -> None:
    """`once run` of `sh -c leaves` (which leaves a worker and writes its pid last in the file
    named by {worker}), sent SIGTERM by `when(once, worker file)` at its moment: done is
    recorded, once dies of the signal, and the worker is stopped."""
    stable_day()
    worker = Path(env["DIR"]) / "worker"
    once = start_once("run", "--job", job, *DAY, "--", "sh", "-c", leaves.format(worker=worker),
                      env=env)
    try:
        when(once, worker)
        _stdout, stderr = once.communicate(timeout=60)
        left = int(worker.read_text().split()[-1])
        wait_for(lambda: not alive(left), timeout=10, what="the worker to be stopped")
    finally:
        reaped(once, 10)
        with suppress(ProcessLookupError, ValueError, FileNotFoundError, IndexError):
            os.kill(int(worker.read_text().split()[-1]), signal.SIGKILL)
    assert attempts(ledger_url, job) == [(day_key(0), 1, "done", 0)], stderr
    assert once.returncode == -signal.SIGTERM, stderr


def test_what_a_command_left_in_its_group_gets_a_stop_signal_after_the_command_s_end(
        env: dict[str, str], ledger_url: str) -> None:
    # The signal is once's own (the command has exited), but a worker the command left in its
    # group is stopped by it, as it was when it counted as the command's (an outside
    # attacker's finding: the worker ran on after once had died of the signal).
    def at_the_end(once: subprocess.Popen[str], _worker: Path) -> None:
        guard = wait_for(lambda: guard_of(once.pid), what="the guard")
        wait_for(lambda: _state(guard) == "T" and _waits(once.pid) and any(
            _state(pid) == "Z" for pid in children(guard)), what="the command to end")
        once.send_signal(signal.SIGTERM)
        once.send_signal(signal.SIGCONT)
        os.kill(guard, signal.SIGCONT)

    _worker_stopped(env, ledger_url, "leaves", "sleep 600 & echo $! > {worker}; "
                    + _STOPS_ITS_GUARD, at_the_end)


def test_a_stop_signal_reaches_the_command_in_a_pid_namespace_that_shows_another_s_proc(
        env: dict[str, str], ledger_url: str) -> None:
    # `unshare --pid` without a /proc of its own: once's pids are not those /proc lists, and
    # the guard's pid named another process there, with no children: the command was taken
    # for gone, and the signal never sent (an outside attacker's finding: it ran to its end,
    # recorded done). Now once, seeing /proc is not its namespace's, forwards it.
    stable_day()
    started = Path(env["DIR"]) / "started"
    unshare = pid_namespace()
    outer = subprocess.Popen(
        [*unshare, ONCE, "run", "--job", "namespaced", *DAY, "--", "sh", "-c",
         f"touch {started}; exec sleep 600"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: started.exists() or outer.poll() is not None,
                 what="the command to start")
        assert outer.poll() is None, outer.communicate()[1]
        [once] = children(outer.pid)
        os.kill(once, signal.SIGTERM)
        _stdout, stderr = outer.communicate(timeout=60)
    finally:
        reaped(outer, 10)
    assert attempts(ledger_url, "namespaced") == [(day_key(0), 1, "interrupted", 143)], stderr
    assert outer.returncode == 143, stderr


def test_a_stop_signal_while_a_worker_holds_the_output_stops_the_worker(
        env: dict[str, str], ledger_url: str) -> None:
    # The command exits 0 and leaves a worker in its group with its stdout: once has heard of
    # the end, its guard is gone, and it delivers the output the worker may still write. A
    # SIGTERM then is once's own (done is recorded), and the worker gets it, then SIGKILL (an
    # outside attacker's finding: it ran on after once had died of the signal, 10 in 10).
    def relaying(once: subprocess.Popen[str], worker: Path) -> None:
        wait_for(worker.exists, what="the command to leave its worker")
        shell = int(worker.read_text().split()[0])
        # The guard ended (reaped only after the group's last signal: a zombie until then).
        wait_for(lambda: not alive(shell) and not any(alive(c) for c in children(once.pid)),
                 what="the command and its guard to be gone")
        once.send_signal(signal.SIGTERM)

    _worker_stopped(env, ledger_url, "drains",
                    'sleep 600 & echo "$$ $!" > {worker}.tmp; mv {worker}.tmp {worker}; exit 0',
                    relaying)


def test_a_late_stop_signal_ends_once_as_pid_1_with_its_status(env: dict[str, str],
                                                               ledger_url: str) -> None:
    # As PID 1 (a container's init) once cannot die of its own signal: the kernel spares
    # init the signals it has no handler for, its own included. A signal after the command's
    # end (here while a worker it left holds its output) left once to exit 0 (an outside
    # attacker's finding); it exits 128+N, as a once that dies of it does.
    stable_day()
    unshare = pid_namespace("--mount-proc")
    outer = subprocess.Popen(
        [*unshare, ONCE, "run", "--job", "init", *DAY, "--", "sh", "-c", "sleep 600 & exit 0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        once = wait_for(lambda: next(iter(children(outer.pid)), None), what="once")
        # The guard ended (a zombie until the group's last signal), the shell reaped: once's
        # one live child is the worker it inherited.
        wait_for(lambda: [_comm(pid) for pid in children(once) if alive(pid)] == ["sleep"],
                 what="the command's end, its worker left")
        os.kill(once, signal.SIGTERM)
        _stdout, stderr = outer.communicate(timeout=60)
    finally:
        reaped(outer, 10)
    assert attempts(ledger_url, "init") == [(day_key(0), 1, "done", 0)], stderr
    assert outer.returncode == 143, stderr


# In a PID namespace of its own (pids from 1, ns_last_pid writable by its root): `once run`
# of a command that leaves, in a session of its own, a worker holding once's output, so
# that once still relays it after the command's group has emptied; then a newcomer given
# the group's number as its pid (ns_last_pid), and a SIGTERM to once. Prints the newcomer's
# fate and whether it got the number.
_REUSED = r'''
"$ONCE" run --job reused --every day -- sh -c \
    'cut -d" " -f5 /proc/$$/stat > "$DIR/group"; setsid sleep 300 & exit 0' > "$DIR/out" &
once=$!
i=0
# Until the guard (the group's leader: its pid is the group's number) has ended: a zombie.
until [ -s "$DIR/group" ] && \
      [ "$(sed 's/.*) //' "/proc/$(cat "$DIR/group")/stat" | cut -c1)" = Z ]; do
    i=$((i + 1)); [ $i -gt 3000 ] && { echo "timeout"; exit 1; }; sleep 0.01
done
group=$(cat "$DIR/group")
echo $((group - 1)) > /proc/sys/kernel/ns_last_pid
setsid sleep 1000 &
newcomer=$!
kill -TERM $once
wait $once
echo "once=$?"
sleep 0.2
kill -0 $newcomer 2>/dev/null && echo "newcomer alive" || echo "newcomer killed"
[ "$newcomer" = "$group" ] && echo "number taken" || echo "number not taken"
'''


def test_a_late_signal_spares_a_newcomer_that_took_the_group_s_number(
        env: dict[str, str], ledger_url: str) -> None:
    # The command's group emptied while once relayed a worker's output (the worker in a
    # session of its own), and a newcomer got the group's number as its pid: once's late
    # signal, sent on to the group, killed the newcomer (an outside attacker's finding).
    # The guard, who led the group, is now reaped only after the group's last signal: its
    # pid, the group's number, is nobody else's until then.
    if os.geteuid() != 0:
        pytest.skip("ns_last_pid needs root in the namespace's owner")
    stable_day()
    done = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "sh", "-c", _REUSED],
                          env={**env, "ONCE": ONCE}, capture_output=True, text=True,
                          timeout=120)
    lines = done.stdout.split()
    assert "number not taken" in done.stdout, (done.stdout, done.stderr)
    assert "newcomer alive" in done.stdout, (done.stdout, done.stderr)
    assert "once=143" in lines, (done.stdout, done.stderr)
    assert attempts(ledger_url, "reused") == [(day_key(0), 1, "done", 0)]


# Loaded by every Python the test starts (PYTHONPATH): once's import of its command line
# waits, its mark made, for the test's word, so that a signal comes while once is loading.
_SLOW_LOAD = '''
import os, sys, time

_DIR = os.environ.get("ONCE_TEST_LOADING")


def _hold(event, args):
    if event == "import" and args[0] == "once.cli.main":
        open(os.path.join(_DIR, "loading"), "w").close()
        until = time.monotonic() + 60
        try:
            while not os.path.exists(os.path.join(_DIR, "go")) and time.monotonic() < until:
                time.sleep(0.01)
        except BaseException:
            # What CPython does where a handler's exception comes at the wrong moment: its
            # compiler folding a constant, importlib's module-lock callback, a dataclass's
            # __set_name__ drop it or turn it into another.
            if not os.environ.get("ONCE_TEST_SWALLOW"):
                raise


if _DIR:
    sys.addaudithook(_hold)
'''


@pytest.mark.parametrize("command, swallowed", [
    (["run", "--job", "early", *DAY], False), (["lead", "--name", "early", "--lease", "3s"], False),
    (["run", "--job", "early", *DAY], True)], ids=["run", "lead", "run-swallowed"])
def test_a_stop_signal_while_once_loads_ends_it_as_pid_1(env: dict[str, str], tmp_path: Path,
                                                         ledger_url: str, command: list[str],
                                                         swallowed: bool) -> None:
    # As PID 1 the kernel drops a signal at its default: a SIGTERM while Python loaded once
    # (docker stop just after the container's start) was lost, and the command ran to its
    # end, recorded done (an outside attacker's finding, 5 in 5 at 50 ms). Then the handler
    # that ends it raised SystemExit, which CPython drops at some moments of an import (the
    # second attacker: 3 in 108): the command ran again (swallowed: where it is dropped).
    stable_day()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(_SLOW_LOAD)
    ran = tmp_path / "ran"
    outer = subprocess.Popen(
        [*pid_namespace("--mount-proc"), ONCE, *command, "--", "touch", str(ran)],
        env={**env, "PYTHONPATH": str(hooks), "ONCE_TEST_LOADING": str(tmp_path),
             **({"ONCE_TEST_SWALLOW": "1"} if swallowed else {})},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for((tmp_path / "loading").exists, what="once to load its command line")
        [once] = children(outer.pid)
        os.kill(once, signal.SIGTERM)
        (tmp_path / "go").touch()
        _stdout, stderr = outer.communicate(timeout=60)
    finally:
        reaped(outer, 10)
    assert outer.returncode == 143, stderr
    assert not ran.exists()
    table = "once_runs" if command[0] == "run" else "once_lead_terms"
    assert query(ledger_url, f"SELECT count(*) FROM {table}") == [(0,)]

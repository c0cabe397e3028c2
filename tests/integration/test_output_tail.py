"""The command's output (issue 18): relayed unchanged where it is not a terminal, its last
bytes stored with the attempt's finish, on every backend, by real `once` processes (the
reports that show them read in this process: helpers.run_either)."""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import ONCE, run_either, wait_for
from ledger_sql import query
from procs import Terminal

pytestmark = pytest.mark.tables_made  # none is about a first use

DAY = ["--every", "day"]

# Writes to stdout and stderr in turn: lines, binary data (every byte value, NULs), large
# blocks (the relay's zero-copy path), and no trailing newline. Deterministic, so that a
# direct run and a run under once can be compared byte for byte.
WRITER = r"""
import os, random, sys
rng = random.Random(18)
for i in range(200):
    fd = 1 + i % 2
    size = rng.choice([1, 7, 100, 4096, 70000, 300000]) if i % 9 else 2_000_000
    os.write(fd, b"line %d of fd %d\n" % (i, fd))
    os.write(fd, bytes(range(256)) * (size // 256 + 1))
os.write(1, b"the end, no newline")
os.write(2, b"err end")
"""


def writer(tmp_path: Path) -> list[str]:
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    return [sys.executable, str(script)]


def once_run(env: dict[str, str], *args: str, job: str = "out",
             stderr: int = subprocess.PIPE) -> subprocess.CompletedProcess[bytes]:
    """`once run --job JOB --every day ARGS`; stderr=subprocess.STDOUT: one pipe for both."""
    return subprocess.run([ONCE, "run", "--job", job, *DAY, *args], env=env,
                          stdout=subprocess.PIPE, stderr=stderr, timeout=120)


def commands_own(output: bytes) -> bytes:
    """What the command wrote, without once's own lines (a failure's, issue 36)."""
    return b"".join(line for line in output.splitlines(keepends=True)
                    if not line.startswith(b"once: "))


def stored(ledger_url: str, job: str = "out") -> list[tuple[object, ...]]:
    """(attempt, outcome, exit_code, output) of each attempt of job."""
    return query(ledger_url, "SELECT attempt, outcome, exit_code, output FROM once_attempts "
                             f"WHERE job = '{job}' ORDER BY attempt")


def decoded(data: bytes) -> str:
    return data.decode("utf-8", "replace").replace("\0", "\ufffd")


def test_each_stream_arrives_unchanged_and_the_tail_is_stored(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    command = writer(tmp_path)
    direct = subprocess.run(command, capture_output=True, timeout=120)
    result = once_run(once_env, "--output-tail", "1MiB", "--", *command)
    assert result.returncode == 0, result.stderr[-500:]
    assert result.stdout == direct.stdout
    assert result.stderr == direct.stderr
    [(attempt, outcome, code, output)] = stored(ledger_url)
    assert (attempt, outcome, code) == (1, "done", 0)
    assert isinstance(output, str)
    # The last MiB of both streams together, in the order once read them, decoded.
    assert output.endswith(("the end, no newline", "err end"))
    assert "\0" not in output and "\ufffd" in output
    assert len(output.encode()) >= 1024 * 1024 - 3  # less a character cut in two


def test_one_destination_for_both_keeps_their_interleaving(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    command = writer(tmp_path)
    direct = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=120)
    result = once_run(once_env, "--output-tail", "100", "--", *command,
                      stderr=subprocess.STDOUT)
    assert result.returncode == 0
    assert result.stdout == direct.stdout  # once says nothing on a done run
    [(_, _, _, output)] = stored(ledger_url)
    last = direct.stdout[-100:]
    for _ in range(3):  # a character cut in two at the start is left out
        last = last[1:] if last[0] & 0xC0 == 0x80 else last
    assert output == decoded(last)
    assert output.endswith("the end, no newlineerr end")


def test_a_file_opened_for_appending_gets_every_byte(ledger_url: str, once_env: dict[str, str],
                                                     tmp_path: Path) -> None:
    # `>>log 2>&1`: the kernel refuses to splice into a file opened O_APPEND; the relay
    # falls back to reading and writing, and the interleaving is the command's own.
    command = writer(tmp_path)
    expected, got = tmp_path / "direct.log", tmp_path / "once.log"
    for path, argv in ((expected, command),
                       (got, [ONCE, "run", "--job", "out", *DAY, "--", *command])):
        path.write_bytes(b"before\n")
        with path.open("ab") as log:
            assert subprocess.run(argv, env=once_env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=120).returncode == 0
    assert got.read_bytes() == expected.read_bytes()
    [(_, _, _, output)] = stored(ledger_url)
    assert output.endswith("the end, no newlineerr end")


def test_catchup_and_rerun_store_each_attempts_output(once_env: dict[str, str],
                                                      ledger_url: str) -> None:
    catchup = run_either("catchup", "--job", "back", *DAY, "--since", "2026-10-24", "--until",
                       "2026-10-25", "-q", "--", "sh", "-c", 'echo "made up $ONCE_PERIOD"',
                       env=once_env)
    assert catchup.returncode == 0, catchup.stderr
    rerun = run_either("rerun", "--job", "back", "--period", "2026-10-24", "--", "sh", "-c",
                     'echo "again $ONCE_ATTEMPT"; exit 5', env=once_env)
    assert rerun.returncode == 5, rerun.stderr
    rows = query(ledger_url, "SELECT period, attempt, output FROM once_attempts "
                             "WHERE job = 'back' ORDER BY period, attempt")
    assert rows == [("2026-10-24", 1, "made up 2026-10-24\n"), ("2026-10-24", 2, "again 2\n"),
                    ("2026-10-25", 1, "made up 2026-10-25\n")]
    shown = run_either("logs", "back", "--period", "2026-10-24", env=once_env)
    assert shown.stdout.splitlines()[1:] == ["again 2"]


def test_a_tail_over_the_limit_keeps_the_last_bytes(once_env: dict[str, str],
                                                    ledger_url: str) -> None:
    command = ["sh", "-c", 'i=0; while [ $i -lt 5000 ]; do echo "line $i"; i=$((i+1)); done']
    result = once_run(once_env, "--output-tail", "1KiB", "--", *command)
    assert result.returncode == 0
    [(_, _, _, output)] = stored(ledger_url)
    assert output == result.stdout.decode()[-1024:]
    assert output.endswith("line 4999\n")


def test_output_tail_0_captures_nothing(once_env: dict[str, str], ledger_url: str) -> None:
    result = once_run(once_env, "--output-tail", "0", "--", "sh", "-c", "echo hi; echo ho >&2")
    assert (result.returncode, result.stdout, result.stderr) == (0, b"hi\n", b"ho\n")
    assert stored(ledger_url) == [(1, "done", 0, None)]


def test_no_output_is_stored_empty(once_env: dict[str, str], ledger_url: str) -> None:
    assert once_run(once_env, "--", "true").returncode == 0
    assert stored(ledger_url) == [(1, "done", 0, "")]


def test_failed_and_timed_out_runs_keep_their_tail(once_env: dict[str, str],
                                                   ledger_url: str) -> None:
    failed = once_run(once_env, "--", "sh", "-c", "echo working; echo 'disk full' >&2; exit 3",
                      job="f", stderr=subprocess.STDOUT)
    assert (failed.returncode, commands_own(failed.stdout)) == (3, b"working\ndisk full\n")
    assert stored(ledger_url, "f") == [(1, "failed", 3, "working\ndisk full\n")]
    slow = once_run(once_env, "--timeout", "1", "--kill-after", "1", "--", "sh", "-c",
                    "echo before; sleep 60", job="t")
    assert slow.returncode == 124, slow.stderr
    assert stored(ledger_url, "t") == [(1, "timed-out", 143, "before\n")]


def test_a_forwarded_sigterm_keeps_what_the_command_said(once_env: dict[str, str],
                                                         ledger_url: str) -> None:
    script = "trap 'echo got TERM; exit 143' TERM; echo ready; while :; do sleep 0.1; done"
    proc = subprocess.Popen([ONCE, "run", "--job", "s", *DAY, "--", "sh", "-c", script],
                            env=once_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    # Relayed as it is written, not when the command ends.
    assert proc.stdout.readline() == b"ready\n"
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert out == b"got TERM\n"
    [(_, outcome, code, output)] = stored(ledger_url, "s")
    assert (outcome, code) == ("interrupted", 143)
    assert output.startswith("ready\n") and "got TERM\n" in output  # sh may say more


def test_a_fenced_out_attempt_keeps_what_it_said(once_env: dict[str, str], ledger_url: str,
                                                 tmp_path: Path) -> None:
    started = tmp_path / "started"
    proc = subprocess.Popen([ONCE, "run", "--job", "fenced", *DAY, "--stale-after", "3", "--",
                             "sh", "-c", f'echo "working on it"; touch {started}; exec sleep 60'],
                            env=once_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    wait_for(started.exists, what="the command to start")
    # Another attempt takes the period's row: the next renewal finds it gone.
    query(ledger_url, "UPDATE once_runs SET attempt = 2, fence = fence + 10 "
                      "WHERE job = 'fenced'")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 70, err
    assert out == b"working on it\n"
    [(attempt, outcome, code, output)] = stored(ledger_url, "fenced")
    assert (attempt, outcome, code, output) == (1, None, None, "working on it\n")
    shown = run_either("logs", "fenced", "--attempt", "1", env=once_env)
    assert shown.stdout.splitlines()[1:] == ["working on it"], shown.stderr


def test_a_command_that_closes_stdout_early(once_env: dict[str, str], ledger_url: str) -> None:
    script = "echo first; exec 1>&-; sleep 0.5; echo 'still here' >&2"
    result = once_run(once_env, "--", "sh", "-c", script)
    assert (result.returncode, result.stdout, result.stderr) == (0, b"first\n",
                                                                 b"still here\n")
    [(_, _, _, output)] = stored(ledger_url)
    assert output == "first\nstill here\n"


def test_a_background_child_holding_the_pipe_does_not_hold_once(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    pid_file = tmp_path / "bg.pid"
    script = f'sleep 60 & echo $! > {pid_file}; echo "left it running"'
    began = time.monotonic()
    result = once_run(once_env, "--", "sh", "-c", script)
    took = time.monotonic() - began
    try:
        assert result.returncode == 0
        assert result.stdout == b"left it running\n"
        assert took < 15, took  # the relay stops 1 s after the command's end
        assert stored(ledger_url) == [(1, "done", 0, "left it running\n")]
    finally:
        os.kill(int(pid_file.read_text()), signal.SIGKILL)


@pytest.mark.slow
def test_a_slow_reader_still_gets_every_byte(once_env: dict[str, str],
                                             ledger_url: str) -> None:
    # The command writes 2 MB and ends long before its reader has read it: without once the
    # pipe would hold the rest for the reader; with once, the relay delivers it all before
    # once ends, however long the reader takes, and the stored tail is its end.
    size = 2_000_000
    # --stale-after 3: the claim is renewed while the reader takes its time (a lease left
    # to expire would cut the delivery short).
    proc = subprocess.Popen([ONCE, "run", "--job", "slow", *DAY, "--stale-after", "3", "--",
                             sys.executable, "-c",
                             f"import os; os.write(1, bytes(range(256)) * {size // 256})"],
                            env=once_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    got = bytearray()
    while chunk := proc.stdout.read1(64 * 1024):
        got += chunk
        time.sleep(0.2)  # about 330 kB/s: seconds after the command has ended
    assert proc.wait(60) == 0, proc.stderr.read() if proc.stderr else ""
    assert got == bytes(range(256)) * (size // 256)
    [(_, outcome, _, output)] = stored(ledger_url, "slow")
    assert outcome == "done"
    assert output == decoded(bytes(range(256)) * 64)[-len(output):]
    assert len(output.encode("utf-8", "surrogatepass")) >= 16 * 1024 - 3


def test_on_a_terminal_nothing_is_captured_and_the_command_owns_it(
        once_env: dict[str, str], ledger_url: str) -> None:
    script = ('test -t 0 && test -t 1 && test -t 2 && echo "all a terminal"; '
              'read line; echo "read $line"')
    term = Terminal([ONCE, "run", "--job", "tty", *DAY, "--", "sh", "-c", script], once_env)
    term.expect("all a terminal")
    term.write(b"hello\n")
    term.expect("read hello")
    assert term.wait() == 0
    assert stored(ledger_url, "tty") == [(1, "done", 0, None)]


def test_a_reader_that_goes_away_breaks_the_commands_pipe(once_env: dict[str, str],
                                                          ledger_url: str) -> None:
    # `once run ... | head -1`: without once, `yes` dies of SIGPIPE; so it must with once.
    pipeline = f"{ONCE} run --job yes --every day -- yes | head -n 1"
    result = subprocess.run(["sh", "-c", pipeline], env=once_env, capture_output=True,
                            timeout=60)
    assert result.stdout == b"y\n"
    [(_, outcome, code, output)] = stored(ledger_url, "yes")
    assert (outcome, code) == ("failed", 128 + signal.SIGPIPE)
    assert output.startswith("y\n")


@pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("size", ["2MiB", "-1", "16 parsecs", "1.5k"])
def test_a_bad_size_is_a_usage_error(once_env: dict[str, str], ledger_url: str,
                                     tmp_path: Path, size: str) -> None:
    marker = tmp_path / "ran"
    result = once_run(once_env, "--output-tail", size, "--", "touch", str(marker))
    assert result.returncode == 2
    assert result.stderr.decode().startswith("once: ") and result.stderr.count(b"\n") == 1
    assert b"--output-tail" in result.stderr and b"size" in result.stderr
    assert not marker.exists()
# -- once logs, history, status --------------------------------------------------------------


def test_once_logs_on_another_host_prints_the_latest_attempt(once_env: dict[str, str],
                                                             ledger_url: str) -> None:
    first = once_run({**once_env, "ONCE_OWNER": "host-a"}, "--", "sh", "-c",
                     "echo 'first try'; echo 'disk full' >&2; exit 3", job="nightly",
                     stderr=subprocess.STDOUT)
    assert first.returncode == 3
    second = once_run({**once_env, "ONCE_OWNER": "host-b"}, "--", "echo", "second try",
                      job="nightly")
    assert second.returncode == 0
    period = query(ledger_url, "SELECT period FROM once_runs")[0][0]
    elsewhere = {**once_env, "ONCE_OWNER": "host-c"}  # another host reading the ledger
    latest = run_either("logs", "nightly", env=elsewhere)
    assert latest.returncode == 0, latest.stderr
    head, *body = latest.stdout.splitlines()
    assert head.startswith(f"==> nightly {period} attempt 2: done (exit 0), owner host-b, "
                           f"finished ") and head.endswith(" <==")
    assert body == ["second try"]
    earlier = run_either("logs", "nightly", "--attempt", "1", env=elsewhere)
    assert earlier.stdout.splitlines()[0].startswith(
        f"==> nightly {period} attempt 1: failed (exit 3), owner host-a, finished ")
    assert earlier.stdout.splitlines()[1:] == ["first try", "disk full"]
    as_json = json.loads(run_either("logs", "nightly", "--period", period, "--attempt", "1",
                                  "--json", env=elsewhere).stdout)
    assert {k: as_json[k] for k in ("job", "period", "attempt", "owner", "status", "outcome",
                                    "exit_code", "output")} == {
        "job": "nightly", "period": period, "attempt": 1, "owner": "host-a",
        "status": "failed", "outcome": "failed", "exit_code": 3,
        "output": "first try\ndisk full\n"}


def test_once_logs_says_what_it_cannot_show(once_env: dict[str, str],
                                            ledger_url: str) -> None:
    assert once_run(once_env, "--output-tail", "0", "--", "echo", "hi",
                    job="quiet").returncode == 0
    quiet = run_either("logs", "quiet", env=once_env)
    assert quiet.returncode == 0
    assert quiet.stdout.count("\n") == 1 and quiet.stdout.startswith("==> quiet ")
    assert quiet.stderr.startswith("once: no output was captured")
    unknown = run_either("logs", "nobody", env=once_env)
    assert unknown.returncode == 2 and unknown.stderr.startswith("once: unknown job 'nobody'")
    missing = run_either("logs", "quiet", "--attempt", "7", env=once_env)
    assert missing.returncode == 2 and missing.stderr == "once: job quiet has no attempt 7\n"


def test_history_and_status_show_the_last_line_of_a_failure(once_env: dict[str, str],
                                                            ledger_url: str) -> None:
    failed = once_run(once_env, "--", "sh", "-c", "echo working; echo 'error: disk full'; "
                      "echo; exit 4", job="h")
    assert failed.returncode == 4
    period = query(ledger_url, "SELECT period FROM once_runs")[0][0]
    table = run_either("history", "h", env=once_env)
    assert table.returncode == 0, table.stderr
    head, row = table.stdout.splitlines()
    assert head.endswith("REASON  LAST LINE")
    assert row.endswith("error: disk full")
    [entry] = json.loads(run_either("history", "h", "--json", env=once_env).stdout)
    assert entry["last_line"] == "error: disk full"
    [job] = json.loads(run_either("status", "h", "--json", env=once_env).stdout)
    assert job["failed_periods"][0]["last_line"] == "error: disk full"
    assert job["last_failure"] == {"period": period, "attempt": 1, "exit_code": 4,
                                   "finished_at": job["failed_periods"][0]["finished_at"],
                                   "last_line": "error: disk full"}


def test_once_logs_shows_control_characters_escaped(once_env: dict[str, str],
                                                    ledger_url: str) -> None:
    # ESC would recolour the terminal, a carriage return overwrite the header, [b] be markup.
    script = r"printf '\033[2J[b]bold[/b]\tok\r\nover\rwritten\n'; exit 1"
    assert once_run(once_env, "--", "sh", "-c", script, job="esc").returncode == 1
    shown = run_either("logs", "esc", env=once_env)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[1:] == ["\\u001b[2J[b]bold[/b]\tok", "over\\rwritten"]
    raw = json.loads(run_either("logs", "esc", "--json", env=once_env).stdout)
    assert raw["output"] == "\x1b[2J[b]bold[/b]\tok\r\nover\rwritten\n"
    assert raw["last_line"] == "written"
    [entry] = json.loads(run_either("history", "esc", "--json", env=once_env).stdout)
    assert entry["last_line"] == "written"


def test_a_done_attempt_has_no_last_line_column(once_env: dict[str, str],
                                                ledger_url: str) -> None:
    assert once_run(once_env, "--", "echo", "fine", job="ok").returncode == 0
    [entry] = json.loads(run_either("history", "ok", "--json", env=once_env).stdout)
    assert (entry["outcome"], entry["last_line"]) == ("done", None)
    [job] = json.loads(run_either("status", "ok", "--json", env=once_env).stdout)
    assert job["last_failure"] is None


def _held(fd: int) -> int:
    """How many bytes the pipe that fd reads holds."""
    held = array.array("i", [0])
    fcntl.ioctl(fd, termios.FIONREAD, held, True)
    return held[0]


def _pipe_full(fd: int) -> bool:
    """Whether the pipe whose read end is fd holds as much as it can."""
    return _held(fd) >= fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)


def _emptied(path: str) -> bool:
    """Whether the pipe at path (a /proc/PID/fd/N of the command's) holds nothing."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a reader of it, which reads nothing
    try:
        return _held(fd) == 0
    finally:
        os.close(fd)


@contextmanager
def _once_into_pipe(args: list[str], env: dict[str, str], read: int,
                    write: int) -> Iterator[subprocess.Popen[bytes]]:
    """`once ARGS` writing to the pipe (read, write), whose write end only it keeps open;
    killed if the test leaves it running, and the read end closed after."""
    try:
        proc = subprocess.Popen([ONCE, *args], env=env, stdout=write, stderr=subprocess.PIPE)
        os.close(write)
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        os.close(read)


@pytest.mark.parametrize("stop", ["sigterm", "timeout"])
def test_a_stop_is_not_held_up_by_a_reader_that_never_reads(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path, stop: str) -> None:
    # systemctl stop, a pod's deletion or --timeout while once's stdout is a pipe that nobody
    # reads (a stuck log shipper): the command is stopped, and once must record it and exit
    # within --kill-after, not wait for the reader for ever while it renews the claim (until
    # systemd's or Kubernetes' SIGKILL, which leaves the attempt unrecorded).
    read, write = os.pipe()
    timeout = ["--timeout", "2"] if stop == "timeout" else []
    args = ["run", "--job", "stuck", *DAY, "--kill-after", "2", *timeout, "--",
            sys.executable, "-c", "import os; os.write(1, b'x' * 5_000_000)"]
    with _once_into_pipe(args, once_env, read, write) as proc:
        wait_for(lambda: _pipe_full(read), what="once's stdout to fill up")
        if stop == "sigterm":
            proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    expected = (143, "interrupted") if stop == "sigterm" else (124, "timed-out")
    assert proc.returncode == expected[0], err
    [(_, outcome, code, output)] = stored(ledger_url, "stuck")
    assert (outcome, code) == (expected[1], 143)
    assert output and set(output) == {"x"}


def test_what_could_not_be_delivered_is_still_in_the_tail(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    # once's stdout is full before the command says anything (a stuck log shipper): the
    # lines the relay took from the command but could not pass on are what the command said,
    # and the stored tail must have them (it had only what reached the reader: nothing).
    read, write = os.pipe()
    os.set_blocking(write, False)
    with pytest.raises(BlockingIOError):
        while True:
            os.write(write, b"." * 4096)
    os.set_blocking(write, True)
    pid_file = tmp_path / "pid"
    script = f"echo 'disk full'; echo $$ > {pid_file}; exec sleep 60"
    args = ["run", "--job", "full", *DAY, "--kill-after", "2", "--", "sh", "-c", script]
    with _once_into_pipe(args, once_env, read, write) as proc:
        wait_for(lambda: pid_file.exists() and pid_file.read_text().strip(),
                 what="the command to speak")
        stdout = f"/proc/{pid_file.read_text().strip()}/fd/1"
        wait_for(lambda: _emptied(stdout), what="the relay to take its line")
        proc.send_signal(signal.SIGTERM)
        err = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, err
    assert stored(ledger_url, "full") == [(1, "interrupted", 143, "disk full\n")]


# 2,000 lines on stdout, then an error on stderr, and the end: under CPU load the relay's
# stdout thread read the last lines after the stderr thread had read the error, which then
# fell out of the 16 KiB tail (issue 34: 5 runs of 61 on PostgreSQL stored no error).
LAST_WORDS = ("i=1; while [ $i -le 2000 ]; do echo line-$i; i=$((i+1)); done; "
              "echo 'ERROR boom' >&2; exit 1")


@contextmanager
def cpu_load(spinners: int = 3) -> Iterator[None]:
    """Processes that keep the cores busy (the machine's other work) until the block ends;
    none where the machine's other work keeps them busy already (a load average of a task a
    core or more: a whole CI, where three more only slowed every test beside this one, four
    times over, one per backend, for two minutes each)."""
    if os.getloadavg()[0] >= (os.cpu_count() or 1):
        spinners = 0
    procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(spinners)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


@pytest.mark.slow
def test_under_load_the_tail_ends_with_the_last_thing_said(once_env: dict[str, str],
                                                           ledger_url: str) -> None:
    runs = 25
    with cpu_load():
        for n in range(runs):
            result = once_run(once_env, "--", "sh", "-c", LAST_WORDS, job=f"last{n}")
            assert result.returncode == 1, result.stderr[-500:]
            assert result.stdout.endswith(b"line-1999\nline-2000\n")
            assert commands_own(result.stderr) == b"ERROR boom\n"
    outputs = query(ledger_url, "SELECT job, output FROM once_attempts")
    assert len(outputs) == runs
    wrong = {job: output[-40:] for job, output in outputs
             if not output.endswith("line-1999\nline-2000\nERROR boom\n")}
    assert not wrong, f"{len(wrong)} of {runs} tails lost the error at their end: {wrong}"

"""Pings and hooks (issue 8): a real HTTP server on 127.0.0.1, real `once` processes.

The server records every request's path and arrival time (on the monotonic clock, which the
kernel shares between processes); it can answer, answer with an error, or hang past the
client's timeout, and a closed port stands for a server that refuses. What pings and hooks
do not depend on the ledger's dialect runs on SQLite only (ids end in [sqlite]); what does
(fencing out, skips of real claims, attempts) runs on every backend.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from helpers import ONCE, continue_if_sqlite, run_once, wait_for
from ledger_sql import query
from once.run import notify
from procs import start_once

pytestmark = pytest.mark.tables_made  # none is about a first use

# The ledger's dialect does not matter to the test: run it on SQLite only.
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

KEY = "5ec12e7-ab5e-4c3f-9d1e-0badc0ffee00"  # stands for a healthchecks.io check's UUID
DAY = ["--every", "day"]
MARGIN = 10.0  # seconds: process start-up and scheduling on a loaded two-core machine (6 s
# was seen short by half a second beside another test run)
HOOKS = ["--on-success", 'env > "$DIR/success.env"', "--on-failure",
         'env > "$DIR/failure.env"', "--on-skip", 'env > "$DIR/skip.env"']


# -- the server ------------------------------------------------------------------------------


class PingServer:
    """An HTTP server on 127.0.0.1 that records (path, monotonic time) of each request, and
    appends each path to the file log, for a command that waits for a ping to arrive."""

    def __init__(self, log: Path) -> None:
        self.requests: list[tuple[str, float]] = []
        self.bodies: list[tuple[str, str, bytes | None]] = []  # (method, path, POST body)
        self.log = log
        self.status = 200
        self.hang = False  # hold every request until the test ends
        self.released = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # healthchecks.io takes the output as a POST body
                length = int(self.headers.get("Content-Length") or 0)
                outer.bodies.append(("POST", self.path, self.rfile.read(length)))
                self.answer()

            def do_GET(self) -> None:
                outer.bodies.append(("GET", self.path, None))
                self.answer()

            def answer(self) -> None:
                outer.requests.append((self.path, time.monotonic()))
                with open(outer.log, "a") as log:
                    log.write(self.path + "\n")
                if outer.hang:
                    outer.released.wait(60)
                self.send_response(outer.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"OK")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def url(self, key: str = KEY) -> str:
        return f"http://127.0.0.1:{self.port}/ping/{key}"

    def paths(self) -> list[str]:
        return [path for path, _ in self.requests]

    def close(self) -> None:
        self.released.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PingServer]:
    ping_server = PingServer(tmp_path / "requests.log")
    yield ping_server
    ping_server.close()


@pytest.fixture
def refused_url() -> Iterator[str]:
    """A URL whose port refuses connections: bound (so nobody else takes it), not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/ping/{KEY}"


@pytest.fixture
def env(once_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """once_env, with no proxy between `once` and 127.0.0.1."""
    clean = {k: v for k, v in once_env.items() if "proxy" not in k.lower()}
    return {**clean, "DIR": str(tmp_path), "no_proxy": "*"}


# -- helpers ---------------------------------------------------------------------------------


def once(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`once` run to its end; the ping URL's key never appears in what it prints."""
    result = run_once(*args, env=env, timeout=timeout)
    assert KEY not in result.stdout + result.stderr, result.stderr
    return result


def once_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("once:")]


# The line a failed run says of itself (flow's, issue 36): what these tests look past.
FAILED = re.compile(r"once: \S+ \S+: failed \((exit \d+|killed by \w+)\), attempt \d+ of \d+; ")


def past_failure(stderr: str) -> str:
    """stderr without the failed run's own line, which must be there once when it is."""
    kept = [line for line in stderr.splitlines(keepends=True) if not FAILED.match(line)]
    return "".join(kept)


def hook_env(path: Path) -> dict[str, str]:
    """The ONCE_* variables a hook saw (it wrote `env` to path)."""
    return dict(line.split("=", 1) for line in path.read_text().splitlines()
                if line.startswith("ONCE_") and not line.startswith("ONCE_DATABASE_URL="))


def ran_hooks(tmp_path: Path) -> list[str]:
    return sorted(p.stem for p in tmp_path.glob("*.env"))


# -- pings -----------------------------------------------------------------------------------


# Waits (up to 30 s) until the server has seen URL/start, then writes the time and exits.
AWAIT_START = ('i=0; until grep -q /start "$DIR/requests.log" 2>/dev/null; do '
               '[ $i -lt 600 ] || exit 9; i=$((i+1)); sleep 0.05; done; '
               'exec "$PYTHON" -c "import time; print(repr(time.monotonic()))" > "$DIR/ended"')


@sqlite_only
def test_start_then_success(server: PingServer, env: dict[str, str], tmp_path: Path) -> None:
    result = once("run", "--job", "pinged", *DAY, "--ping", server.url(), "--", "sh", "-c",
                  AWAIT_START, env={**env, "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr  # the start ping came while it ran
    assert result.stderr == ""
    assert server.paths() == [f"/ping/{KEY}/start", f"/ping/{KEY}"]
    (_, start), (_, success) = server.requests
    assert start < float((tmp_path / "ended").read_text()) < success


@sqlite_only
@pytest.mark.parametrize(("exit_status", "path"), [(False, "fail"), (True, "3")],
                         ids=["fail", "ping-exit-status"])
def test_a_failure_pings_fail_or_the_status(server: PingServer, env: dict[str, str],
                                            exit_status: bool, path: str) -> None:
    flag = ["--ping-exit-status"] if exit_status else []
    result = once("run", "--job", "failing", *DAY, "--ping", server.url(), *flag, "--", "sh",
                  "-c", "exit 3", env=env)
    assert result.returncode == 3
    assert past_failure(result.stderr) == "" and FAILED.match(result.stderr)
    assert server.paths() == [f"/ping/{KEY}/start", f"/ping/{KEY}/{path}"]


@sqlite_only
def test_a_query_string_stays_at_the_end(server: PingServer, env: dict[str, str]) -> None:
    result = once("run", "--job", "query", *DAY, "--ping", server.url() + "?create=1", "--",
                  "false", env=env)
    assert result.returncode == 1
    assert server.paths() == [f"/ping/{KEY}/start?create=1", f"/ping/{KEY}/fail?create=1"]


@sqlite_only
def test_a_skip_pings_only_with_ping_on_skip(server: PingServer, env: dict[str, str]) -> None:
    args = ["run", "--job", "skipper", *DAY, "--ping", server.url()]
    assert once(*args, "--", "true", env=env).returncode == 0
    server.requests.clear()
    quiet = once(*args, "--", "true", env=env)
    assert (quiet.returncode, quiet.stderr) == (0, "")
    assert server.paths() == []  # skipped-done, no --ping-on-skip: nothing
    alive = once(*args, "--ping-on-skip", "--", "true", env=env)
    assert (alive.returncode, alive.stderr) == (0, "")
    assert server.paths() == [f"/ping/{KEY}"]  # no start: nothing started


@sqlite_only
def test_a_held_period_pings_on_skip_while_the_owner_runs(server: PingServer,
                                                          env: dict[str, str],
                                                          tmp_path: Path) -> None:
    owner = start_once("run", "--job", "held", *DAY, "--ping", server.url(), "--", "sh", "-c",
                       'touch "$DIR/started"; while [ ! -e "$DIR/release" ]; do sleep 0.05; '
                       'done', env=env)
    try:
        wait_for(lambda: f"/ping/{KEY}/start" in server.paths(), what="the start ping")
        skip = once("run", "--job", "held", *DAY, "--ping", server.url("other"),
                    "--ping-on-skip", *HOOKS, "--", "true", env=env)
        assert (skip.returncode, skip.stderr) == (0, "")
        assert server.paths() == [f"/ping/{KEY}/start", "/ping/other"]
        seen = hook_env(tmp_path / "skip.env")
        assert seen["ONCE_OUTCOME"] == "skipped-held" and seen["ONCE_STATUS"] == "0"
        assert "ONCE_ATTEMPT" not in seen and "ONCE_FENCE" not in seen
        assert ran_hooks(tmp_path) == ["skip"]
    finally:
        (tmp_path / "release").touch()
        _, err = owner.communicate(timeout=60)
    assert owner.returncode == 0, err
    assert server.paths()[-1] == f"/ping/{KEY}"


@sqlite_only
def test_a_period_failed_out_never_pings_alive(server: PingServer, env: dict[str, str],
                                               tmp_path: Path) -> None:
    args = ["run", "--job", "spent", *DAY, "--max-attempts", "1", "--ping", server.url(),
            "--ping-on-skip", "--ping-exit-status"]
    assert once(*args, "--", "false", env=env).returncode == 1
    server.requests.clear()
    skip = once(*args, *HOOKS, "--", "true", env=env)
    assert skip.returncode == 0
    assert len(once_lines(skip.stderr)) == 1  # the documented "no attempts left" warning
    assert server.paths() == [f"/ping/{KEY}/fail"]  # not URL (alive), nor URL/0 (success)
    assert hook_env(tmp_path / "skip.env")["ONCE_OUTCOME"] == "skipped-failed"


@sqlite_only
def test_a_4xx_answer_is_not_retried_and_a_5xx_is(server: PingServer,
                                                  env: dict[str, str]) -> None:
    server.status = 404
    result = once("run", "--job", "gone", *DAY, "--ping", server.url(), "--", "true",
                  env=env)
    assert result.returncode == 0
    assert server.paths() == [f"/ping/{KEY}/start", f"/ping/{KEY}"]
    assert once_lines(result.stderr) == [
        f"once: ping http://127.0.0.1:{server.port}/… failed: start, success: HTTP 404"]
    assert result.stderr.count("\n") == 1
    server.requests.clear()
    server.status = 503
    result = once("run", "--job", "busy", *DAY, "--ping", server.url(), "--", "true",
                  env=env)
    assert result.returncode == 0
    assert server.paths().count(f"/ping/{KEY}") == notify.PING_TRIES
    assert len(once_lines(result.stderr)) == 1 and "HTTP 503" in result.stderr


@pytest.mark.slow
@sqlite_only
def test_the_ledger_unreachable_pings_nothing(server: PingServer, env: dict[str, str],
                                              tmp_path: Path) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        db = f"postgresql://once@127.0.0.1:{closed.getsockname()[1]}/none"
        result = once("run", "--job", "lost", *DAY, "--db", db, "--ping", server.url(),
                      "--ping-on-skip", *HOOKS, "--", "true", env=env)
    assert result.returncode == 75, result.stderr
    assert server.paths() == [] and ran_hooks(tmp_path) == []


# -- a server that hangs or refuses ----------------------------------------------------------


@pytest.mark.slow
@sqlite_only
def test_a_hanging_server_delays_the_exit_by_at_most_the_bound(server: PingServer,
                                                               env: dict[str, str],
                                                               tmp_path: Path) -> None:
    server.hang = True
    bound = notify.PING_BUDGET + MARGIN
    # Both exit statuses at once: the two runs wait out their timeouts side by side.
    runs = {}
    for status in (0, 3):
        began = time.monotonic()
        runs[status] = (began, start_once(
            "run", "--job", f"hang-{status}", *DAY, "--ping", server.url(f"{KEY}-{status}"),
            "--", sys.executable, "-c", "import sys, time; open(sys.argv[1], 'w')"
            ".write(repr(time.monotonic())); sys.exit(int(sys.argv[2]))",
            str(tmp_path / f"ran-{status}"), str(status), env=env))
    # Each exit's instant, against the command's own start: once's start-up and claim on a
    # loaded machine are no ping's delay (from once's start, 21.3 s was seen against 20.5).
    exited: dict[int, float] = {}

    def both_exited() -> bool:
        exited.update({status: time.monotonic() for status, (_, proc) in runs.items()
                       if status not in exited and proc.poll() is not None})
        return len(exited) == len(runs)

    wait_for(both_exited, timeout=bound + 60, what="both runs to exit")
    for status, (_, proc) in runs.items():
        out, err = proc.communicate(timeout=30)
        took = exited[status] - float((tmp_path / f"ran-{status}").read_text())
        assert proc.returncode == status, err
        assert took < bound, took
        assert KEY not in out + err
        lines = past_failure(err).splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"once: ping http://127.0.0.1:{server.port}/… failed"), err
        assert "timed out" in lines[0] or "no answer" in lines[0], lines[0]
        mine = [(p, t) for p, t in server.requests if p.startswith(f"/ping/{KEY}-{status}")]
        result = f"/ping/{KEY}-{status}" if status == 0 else f"/ping/{KEY}-{status}/fail"
        assert mine[0][0] == f"/ping/{KEY}-{status}/start"  # and never after the result
        assert mine[1:] and {p for p, _ in mine[1:]} == {result}, mine
        # The hanging start ping did not hold the command back until it timed out.
        assert float((tmp_path / f"ran-{status}").read_text()) < mine[0][1] + notify.PING_TIMEOUT


@sqlite_only
@pytest.mark.parametrize("status", [0, 3])
def test_a_refusing_server_changes_nothing_but_one_line(refused_url: str, env: dict[str, str],
                                                        tmp_path: Path, status: int) -> None:
    began = time.monotonic()
    result = once("run", "--job", "refused", *DAY, "--ping", refused_url, "--on-success",
                  'touch "$DIR/hooked"', "--on-failure", 'touch "$DIR/hooked"', "--", "sh",
                  "-c", f"exit {status}", env=env)
    took = time.monotonic() - began
    assert result.returncode == status
    assert took < notify.PING_BUDGET + MARGIN, took
    lines = past_failure(result.stderr).splitlines()
    assert len(lines) == 1, result.stderr
    host = refused_url.rsplit("/", 2)[0]
    assert lines[0].startswith(f"once: ping {host}/… failed") and "refused" in lines[0]
    assert (tmp_path / "hooked").exists()  # the hook still ran


# -- hooks -----------------------------------------------------------------------------------


def test_hooks_see_the_run_for_done_failed_and_skips(env: dict[str, str], tmp_path: Path,
                                                     ledger_url: str) -> None:
    done = once("run", "--job", "hooked", "--namespace", "ns", *DAY, *HOOKS, "--", "true",
                env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert ran_hooks(tmp_path) == ["success"]
    seen = hook_env(tmp_path / "success.env")
    period = seen["ONCE_PERIOD"]
    assert seen == {"ONCE_JOB": "ns:hooked", "ONCE_PERIOD": period,
                    "ONCE_PERIOD_START": seen["ONCE_PERIOD_START"],
                    "ONCE_PERIOD_END": seen["ONCE_PERIOD_END"], "ONCE_PERIOD_TZ": "UTC",
                    "ONCE_ATTEMPT": "1", "ONCE_FENCE": seen["ONCE_FENCE"],
                    "ONCE_OUTCOME": "done", "ONCE_STATUS": "0",
                    "ONCE_OUTPUT_FILE": seen["ONCE_OUTPUT_FILE"]}  # the output was captured
    assert query(ledger_url, "SELECT period, fence FROM once_runs") == [
        (period, int(seen["ONCE_FENCE"]))]

    skip = once("run", "--job", "hooked", "--namespace", "ns", *DAY, "--skipped-exit-code",
                "9", *HOOKS, "--", "true", env=env)
    assert (skip.returncode, skip.stderr) == (9, "")
    assert ran_hooks(tmp_path) == ["skip", "success"]
    seen = hook_env(tmp_path / "skip.env")
    assert (seen["ONCE_JOB"], seen["ONCE_PERIOD"]) == ("ns:hooked", period)
    assert (seen["ONCE_OUTCOME"], seen["ONCE_STATUS"]) == ("skipped-done", "9")
    assert "ONCE_ATTEMPT" not in seen

    for attempt in (1, 2):
        failed = once("run", "--job", "broken", *DAY, *HOOKS, "--", "sh", "-c", "exit 3",
                      env=env)
        assert failed.returncode == 3
        seen = hook_env(tmp_path / "failure.env")
        assert (seen["ONCE_JOB"], seen["ONCE_OUTCOME"], seen["ONCE_STATUS"],
                seen["ONCE_ATTEMPT"]) == ("broken", "failed", "3", str(attempt))
    assert ran_hooks(tmp_path) == ["failure", "skip", "success"]


@sqlite_only
def test_timed_out_pings_failure_and_keeps_124(server: PingServer, env: dict[str, str],
                                               tmp_path: Path) -> None:
    result = once("run", "--job", "slow", *DAY, "--timeout", "1s", "--ping", server.url(),
                  "--ping-exit-status", *HOOKS, "--", "sleep", "30", env=env)
    assert result.returncode == 124
    assert len(once_lines(result.stderr)) == 1 and "timed out" in result.stderr
    assert server.paths() == [f"/ping/{KEY}/start", f"/ping/{KEY}/124"]
    assert ran_hooks(tmp_path) == ["failure"]
    seen = hook_env(tmp_path / "failure.env")
    assert (seen["ONCE_OUTCOME"], seen["ONCE_STATUS"], seen["ONCE_ATTEMPT"]) == (
        "timed-out", "124", "1")


@pytest.mark.slow
def test_fenced_out_pings_failure_and_runs_on_failure(server: PingServer, env: dict[str, str],
                                                      tmp_path: Path, ledger_url: str) -> None:
    args = ["run", "--job", "paused", *DAY, "--stale-after", "2s"]
    first = start_once(*args, "--ping", server.url(), *HOOKS, "--", "sh", "-c",
                       'touch "$DIR/started"; exec sleep 600', env=env)
    wait_for(lambda: (tmp_path / "started").exists() and server.paths(),
             what="the command and the start ping")
    os.kill(first.pid, signal.SIGSTOP)
    try:
        def second_ran() -> bool:
            result = once(*args, "--", "touch", str(tmp_path / "second"), env=env)
            if result.returncode == 75:
                # Not yet: the claim waited past its short bound (--stale-after 2s) on a lock
                # the owner held when the stop caught it in a renewal (SQLite's write lock, a
                # MySQL row lock), or on a loaded machine's server; nothing was taken over.
                assert "nothing was run" in result.stderr, result.stderr
                return False
            assert result.returncode == 0, result.stderr
            return (tmp_path / "second").exists()

        continue_if_sqlite(ledger_url, first, None, second_ran, 2.0)
        wait_for(second_ran, what="a second instance to take over")
    finally:
        first.send_signal(signal.SIGCONT)  # (reaped already on SQLite: then a no-op)
    out, err = first.communicate(timeout=60)
    assert first.returncode == 70, err
    assert KEY not in out + err
    assert len(once_lines(err)) == 1 and "fenced out" in err
    assert server.paths() == [f"/ping/{KEY}/start", f"/ping/{KEY}/fail"]
    assert ran_hooks(tmp_path) == ["failure"]
    seen = hook_env(tmp_path / "failure.env")
    assert (seen["ONCE_JOB"], seen["ONCE_OUTCOME"], seen["ONCE_STATUS"],
            seen["ONCE_ATTEMPT"]) == ("paused", "fenced-out", "70", "1")
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]


@sqlite_only
def test_a_failing_hook_changes_nothing_but_one_line(env: dict[str, str],
                                                     ledger_url: str) -> None:
    result = once("run", "--job", "fine", *DAY, "--on-success", "exit 5", "--", "true",
                  env=env)
    assert result.returncode == 0
    assert result.stderr.splitlines() == ["once: --on-success hook exited 5"]
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("done", 0)]


@sqlite_only
@pytest.mark.parametrize(("hook", "status"), [("no-such-command-4e2c", 127),
                                              ("/dev/null", 126)],
                         ids=["not-found", "not-executable"])
def test_a_hook_that_cannot_run_changes_nothing_but_one_line(env: dict[str, str],
                                                             ledger_url: str, hook: str,
                                                             status: int) -> None:
    result = once("run", "--job", "sad", *DAY, "--on-failure", hook, "--", "sh", "-c",
                  "exit 3", env=env)
    assert result.returncode == 3
    # The shell says why in its own words; once adds one line.
    assert once_lines(past_failure(result.stderr)) == [f"once: --on-failure hook exited {status}"]
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", 3)]


def test_a_hook_whose_shell_cannot_start_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    monkeypatch.setattr(notify, "SHELL", str(tmp_path / "no-shell"))
    notify.Notifier(on_success="true").finished("done", 0, dict(os.environ))
    err = capsys.readouterr().err
    assert err == "once: --on-success hook could not start: No such file or directory\n"


def test_a_hook_that_hangs_is_killed(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(notify, "HOOK_TIMEOUT", 0.5)
    began = time.monotonic()
    assert notify.run_hook("exec sleep 30", dict(os.environ), "--on-skip") is None
    assert time.monotonic() - began < 5
    assert capsys.readouterr().err == (
        "once: --on-skip hook timed out after 0.5s and was killed, with every process it "
        "started\n")


@sqlite_only
def test_shards_tell_one_outcome(server: PingServer, env: dict[str, str],
                                 tmp_path: Path) -> None:
    args = ["run", "--job", "sharded", *DAY, "--shards", "2", "--ping", server.url(),
            "--ping-on-skip", *HOOKS]
    first = once(*args, "--", "true", env=env)  # shard 0
    second = once(*args, "--", "true", env=env)  # shard 0 done: shard 1 runs, no skip told
    assert (first.returncode, second.returncode) == (0, 0)
    assert ran_hooks(tmp_path) == ["success"]
    assert server.paths() == [f"/ping/{KEY}/start", f"/ping/{KEY}"] * 2
    assert hook_env(tmp_path / "success.env")["ONCE_SHARD"] == "1"
    server.requests.clear()
    third = once(*args, "--", "true", env=env)  # both done: one skip
    assert third.returncode == 0
    assert server.paths() == [f"/ping/{KEY}"]
    seen = hook_env(tmp_path / "skip.env")
    assert seen["ONCE_OUTCOME"] == "skipped-done" and "ONCE_SHARD" not in seen


# -- the URL ---------------------------------------------------------------------------------


@sqlite_only
def test_ping_url_file(server: PingServer, env: dict[str, str], tmp_path: Path) -> None:
    url_file = tmp_path / "ping-url"
    url_file.write_text(server.url() + "\n")
    result = once("run", "--job", "filed", *DAY, "--ping-url-file", str(url_file), "--",
                  "true", env=env)
    assert (result.returncode, result.stderr) == (0, "")
    assert server.paths() == [f"/ping/{KEY}/start", f"/ping/{KEY}"]


@sqlite_only
@pytest.mark.parametrize("problem", ["missing", "empty", "no-scheme", "space", "both"])
def test_a_bad_ping_url_is_a_usage_error(env: dict[str, str], tmp_path: Path,
                                         problem: str) -> None:
    url_file = tmp_path / "ping-url"
    extra: list[str] = []
    if problem == "empty":
        url_file.write_text("\n")
    elif problem == "no-scheme":
        url_file.write_text(f"hc-ping.com/{KEY}")
    elif problem == "space":
        url_file.write_text(f"https://hc-ping.com/{KEY} /x")
    elif problem == "both":
        url_file.write_text(f"https://hc-ping.com/{KEY}")
        extra = ["--ping", f"https://hc-ping.com/{KEY}"]
    result = once("run", "--job", "bad-url", *DAY, "--ping-url-file", str(url_file), *extra,
                  "--", "touch", str(tmp_path / "ran"), env=env)
    assert result.returncode == 2
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("once: ")
    assert not (tmp_path / "ran").exists()


# -- the output with the pings and hooks (issue 18) --------------------------------------------


def test_the_failure_pings_body_is_the_output_tail(server: PingServer,
                                                   env: dict[str, str]) -> None:
    script = "echo starting; i=0; while [ $i -lt 3000 ]; do echo line $i; i=$((i+1)); done; " \
             "echo 'error: disk full'; exit 3"
    result = once("run", "--job", "body", *DAY, "--ping", server.url(), "--", "sh", "-c",
                  script, env=env)
    assert result.returncode == 3, result.stderr
    assert once_lines(past_failure(result.stderr)) == []
    start, fail = server.bodies
    assert start == ("GET", f"/ping/{KEY}/start", None)
    method, path, body = fail
    assert (method, path) == ("POST", f"/ping/{KEY}/fail")
    # The last 10KiB (the default) of what the command wrote.
    assert body == result.stdout.encode()[-10 * 1024:]
    assert body.endswith(b"line 2999\nerror: disk full\n")


@sqlite_only
def test_ping_body_tail_bounds_the_body_and_0_sends_none(server: PingServer,
                                                         env: dict[str, str]) -> None:
    once("run", "--job", "small", *DAY, "--ping", server.url(), "--ping-body-tail", "8",
         "--", "echo", "done at last", env=env)
    once("run", "--job", "none", *DAY, "--ping", server.url(), "--ping-body-tail", "0",
         "--", "echo", "quiet", env=env)
    once("run", "--job", "off", *DAY, "--ping", server.url(), "--output-tail", "0",
         "--", "echo", "not captured", env=env)
    results = [entry for entry in server.bodies if not entry[1].endswith("/start")]
    assert results == [("POST", f"/ping/{KEY}", b"at last\n"), ("GET", f"/ping/{KEY}", None),
                       ("GET", f"/ping/{KEY}", None)]


@sqlite_only
def test_a_hook_reads_the_output_from_once_output_file(env: dict[str, str],
                                                       tmp_path: Path) -> None:
    hook = 'cp "$ONCE_OUTPUT_FILE" "$DIR/seen"; echo "$ONCE_OUTPUT_FILE" > "$DIR/path"'
    result = subprocess.run([ONCE, "run", "--job", "hooked", *DAY, "--on-failure", hook,
                             "--", "sh", "-c", "printf 'binary \\377 kept\\n'; exit 1"],
                            env=env, capture_output=True, timeout=60)  # bytes: not UTF-8
    assert (result.returncode, result.stdout) == (1, b"binary \xff kept\n"), result.stderr
    assert (tmp_path / "seen").read_bytes() == b"binary \xff kept\n"  # as the command wrote it
    assert not Path((tmp_path / "path").read_text().strip()).exists()  # removed after the hook
    quiet = once("run", "--job", "plain", *DAY, "--output-tail", "0", "--on-success",
                 'echo "[${ONCE_OUTPUT_FILE-unset}]" > "$DIR/unset"', "--", "true", env=env)
    assert quiet.returncode == 0
    assert (tmp_path / "unset").read_text() == "[unset]\n"


def _in_full_tmp(command: list[str], tmp: Path) -> list[str]:
    """command in a mount namespace of its own where tmp is a full filesystem (a tmpfs of one
    page: a file can be made, 16 KiB cannot be written), or [] where that is not allowed."""
    if shutil.which("unshare") is None:
        return []
    tmp.mkdir()
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "true"],
                           capture_output=True, timeout=30)
    if probe.returncode != 0:
        return []
    mount = f'mount -t tmpfs -o size=4k tmpfs "{tmp}" && exec "$@"'
    return ["unshare", "--mount", "--map-root-user", "sh", "-c", mount, "sh", *command]


@sqlite_only
def test_a_hook_runs_when_once_output_file_cannot_be_written(env: dict[str, str],
                                                            tmp_path: Path) -> None:
    # A full /tmp, or a container's read-only root: the hook (the failure's alarm) still runs,
    # without ONCE_OUTPUT_FILE, and the outcome and the exit status are the command's.
    full = tmp_path / "full"
    hook = 'echo "[${ONCE_OUTPUT_FILE-unset}] $ONCE_OUTCOME" > "$DIR/hook"'
    command = _in_full_tmp([ONCE, "run", "--job", "hooked", *DAY, "--on-failure", hook, "--",
                            "sh", "-c", "head -c 20000 /dev/zero | tr '\\0' x; exit 3"], full)
    if not command:
        pytest.skip("no mount namespace here to fill a temporary directory")
    result = subprocess.run(command, env={**env, "TMPDIR": str(full)}, capture_output=True,
                            timeout=60)
    assert result.returncode == 3, result.stderr
    assert result.stdout == b"x" * 20000
    assert (tmp_path / "hook").read_text() == "[unset] failed\n"
    assert past_failure(result.stderr.decode()).splitlines() == [
        "once: --on-failure hook: ONCE_OUTPUT_FILE could not be written (No space left on "
        "device); the hook runs without it"]
    assert query(env["ONCE_DATABASE_URL"], "SELECT outcome, exit_code FROM once_attempts") == [
        ("failed", 3)]

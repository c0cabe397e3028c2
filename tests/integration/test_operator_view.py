"""The operator's view (issue 15): hostile text in reports, which ledger a report read, an
empty ledger, cron's environment, stops and hooks, metrics, read-only reports, the default
ledger's file modes and shell completion.

Real ledgers, made by real `once` processes; the reports read in this process
(helpers.run_either), but those on a terminal and as another user; what does not depend on
the ledger's dialect runs on SQLite only (ids end in [sqlite]).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from helpers import ONCE, run_either, run_once
from ledger_sql import db_time, placeholders, query
from once.ledger import parse_url
from procs import Terminal

pytestmark = pytest.mark.tables_made  # but where a test says otherwise

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

# Text that a terminal obeys: a title change, a screen clear, a bell, a line that forges an
# OK under a WARNING exit, a bidi override.
HOSTILE = "ev\x1b]0;pwned\x07il\x1b[2J\nOK 1 job: every due period done\u202e"


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def once(env: dict[str, str], *args: str, timeout: float = 60) -> Any:
    return run_either(*args, env=env, timeout=timeout)


def on_terminal(env: dict[str, str], *args: str) -> tuple[str, int]:
    """`once ARGS` on a pseudo-terminal 200 columns wide: what it drew, its exit status."""
    term = Terminal([ONCE, *args], {**env, "TERM": "xterm-256color", "COLUMNS": "200"})
    status = term.wait(timeout=60)
    return term.output.decode(errors="replace"), status


def raw_controls(text: str) -> list[str]:
    """Control characters other than newlines and rich's colour (SGR) sequences."""
    import re

    bare = re.sub(r"\x1b\[[0-9;]*m", "", text)  # colour and bold: rich's own
    return [ch for ch in bare if not (ch.isprintable() or ch in "\n\r ")]


def make_stale(url: str, job: str, period: str) -> None:
    """Turn a finished row into a running attempt whose heartbeat stopped an hour ago."""
    query(url, placeholders("UPDATE once_runs SET status='running', finished_at=NULL, "
                            "exit_code=NULL, heartbeat_at=? WHERE job=? AND period=?", url),
          (db_time(url, datetime.now(UTC) - timedelta(hours=1)), job, period))
    # Its attempt, as a running one stands (a finished one would be a done marker).
    query(url, placeholders("UPDATE once_attempts SET status='running', finished_at=NULL, "
                            "exit_code=NULL, outcome=NULL WHERE job=? AND period=? AND "
                            "attempt=(SELECT attempt FROM once_runs WHERE job=? AND period=?)",
                            url), (job, period, job, period))


# -- 10. hostile text ------------------------------------------------------------------------


@pytest.mark.slow
def test_control_characters_from_outside_are_shown_escaped(once_env: dict[str, str],
                                                           ledger_url: str) -> None:
    """A rerun reason, a watermark, and an owner and a job name as a past version or another
    client may have stored them are shown with their controls escaped, in a pipe and on a
    terminal, and `once check` stays one line per finding."""
    day = ["--every", "day", "--", "true"]
    for job in ("hostile", "renamed"):
        assert once(once_env, "run", "--job", job, *day).returncode == 0
    assert once(once_env, "rerun", "--job", "hostile", "--period", today(), "--reason",
                HOSTILE, "--", "true").returncode == 0
    assert once(once_env, "state", "hostile", "--set", HOSTILE).returncode == 0
    # Today's CLI refuses such an owner and such a job name; the ledger may hold them all
    # the same (an older once, another client): the reports must show them harmlessly.
    evil = "re\x1b[2Jnamed\nOK 1 job: every due period done"
    for table in ("once_runs", "once_attempts", "once_jobs"):
        query(ledger_url, placeholders(f"UPDATE {table} SET job=? WHERE job=?", ledger_url),
              (evil, "renamed"))
    for table in ("once_runs", "once_attempts"):
        query(ledger_url, placeholders(f"UPDATE {table} SET owner=? WHERE period=?",
                                       ledger_url), (HOSTILE, today()))
    for job in ("hostile", evil):
        make_stale(ledger_url, job, today())

    check = once(once_env, "check")
    assert check.returncode == 1, check.stdout + check.stderr  # WARNING: stale, not yet due
    lines = check.stdout.splitlines()
    assert len(lines) == 2 and all(line.startswith("WARNING ") for line in lines), lines
    assert lines[0].startswith(f"WARNING hostile {today()} stale (owner ")
    assert raw_controls(check.stdout) == []
    assert "\\u001b]0;pwned\\u0007" in lines[0] and "\\nOK 1 job" in lines[0]
    # The first three fields never contain spaces, whatever the job's name holds.
    assert lines[1].split(" ")[1:4] == [
        "re\\u001b[2Jnamed\\nOK\\u00201\\u0020job:\\u0020every\\u0020due\\u0020period"
        "\\u0020done", today(), "stale"]

    for args in (("history", "hostile"), ("status",), ("status", "--timeline")):
        piped = once(once_env, *args)
        assert piped.returncode == 0, piped.stderr
        assert raw_controls(piped.stdout) == [], (args, piped.stdout)
    history = once(once_env, "history", "hostile").stdout
    assert history.count("\\u001b[2J") >= 3  # the owners, the reason, the watermark's note
    assert "\\u202e" in history

    for args in (("history", "hostile"), ("status",), ("check",)):
        drawn, status = on_terminal(once_env, *args)
        assert status in (0, 1), drawn
        assert raw_controls(drawn) == [], (args, drawn)
        assert "\\u001b]0;pwned" in drawn

    # JSON keeps the text itself, escaped by JSON.
    found = json.loads(once(once_env, "check", "--json").stdout)
    assert {f["owner"] for f in found} == {HOSTILE} and {f["job"] for f in found} == {
        "hostile", evil}


# -- 11. rich markup -------------------------------------------------------------------------


@sqlite_only
def test_nothing_from_the_ledger_or_the_command_line_is_read_as_markup(
        once_env: dict[str, str], tmp_path: Path) -> None:
    ledger = tmp_path / "[bold]ops"
    ledger.mkdir()
    env = {**once_env, "ONCE_DATABASE_URL": f"sqlite:///{ledger}/ledger.db"}
    link = "[link=https://evil.example/]nightly"
    for job in ("x[/]y", link):
        assert once(env, "run", "--job", job, "--every", "day", "--", "true").returncode == 0

    drawn, status = on_terminal(env, "history", "x[/]y")
    assert status == 0, drawn
    assert "x[/]y" in drawn and "Traceback" not in drawn

    drawn, status = on_terminal(env, "status")
    assert status == 0, drawn
    assert "\x1b]8;" not in drawn  # no hyperlink
    assert link in drawn and "x[/]y" in drawn
    assert "[bold]ops" in drawn  # the ledger's URL in the caption, as it is

    drawn, status = on_terminal(env, "history", link)
    assert status == 0 and "\x1b]8;" not in drawn and link in drawn

    drawn, status = on_terminal(env, "status", "x[/]y", "--timeline")
    assert status == 0 and "x[/]y" in drawn


# -- 18. an empty ledger, a job that never ran -----------------------------------------------


@pytest.mark.tables_made(False)  # an empty ledger
def test_check_on_an_empty_ledger_is_unknown(once_env: dict[str, str],
                                             ledger_url: str) -> None:
    """The cron line that audits the wrong (empty) ledger must not stay green."""
    for _ in ("no tables", "tables, no job"):
        result = once(once_env, "check")
        assert result.returncode == 3, result.stdout + result.stderr
        (line,) = result.stdout.splitlines()
        assert line.startswith("UNKNOWN - - empty (no job has run in the ledger ")
        assert parse_url(ledger_url).redacted in line
        (finding,) = json.loads(once(once_env, "check", "--json").stdout)
        assert (finding["severity"], finding["status"], finding["job"]) == ("UNKNOWN", 3, None)
        assert once(once_env, "schema").returncode == 0

    result = once(once_env, "check", "--namespace", "prod")
    assert result.returncode == 3 and "namespace prod" in result.stdout
    # Expected jobs that never ran at all are the first kind of absence: CRITICAL.
    result = once(once_env, "check", "nightly")
    assert (result.returncode, result.stdout) == (
        2, "CRITICAL nightly - unknown (never ran: no run of this job in the ledger)\n")


# -- 19. which ledger ------------------------------------------------------------------------


def _with_password(url: str) -> str | None:
    """The URL with a password in it, where the test server ignores it (PostgreSQL's trust
    authentication); None elsewhere."""
    if parse_url(url).dialect != "postgresql" or "@" not in url:
        return None
    scheme, _, rest = url.partition("://")
    user, _, host = rest.partition("@")
    return f"{scheme}://{user.split(':')[0]}:s3cret-pw@{host}"


def test_status_and_check_name_the_ledger_they_read(once_env: dict[str, str],
                                                    ledger_url: str) -> None:
    assert once(once_env, "run", "--job", "nightly", "--every", "day", "--",
                "true").returncode == 0
    shown_as = parse_url(ledger_url).redacted
    (entry,) = json.loads(once(once_env, "status", "--json").stdout)
    assert entry["ledger"] == shown_as
    piped = once(once_env, "status").stdout.splitlines()
    assert piped[-1] == f"ledger: {shown_as}"
    (line,) = once(once_env, "check").stdout.splitlines()
    assert line == f"OK 1 job: every due period done (ledger {shown_as})"
    drawn, _ = on_terminal(once_env, "status")
    assert "ledger:" in drawn

    secret = _with_password(ledger_url)
    if secret is not None:
        env = {**once_env, "ONCE_DATABASE_URL": secret}
        for args in (("status", "--json"), ("status",), ("check",), ("check", "nope", "--json")):
            result = once(env, *args)
            assert result.returncode in (0, 2), result.stderr
            assert "s3cret-pw" not in result.stdout + result.stderr
            assert ":***@" in result.stdout


def test_help_gives_the_default_ledger_rule() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    for command in ("run", "status", "check"):
        text = " ".join(run_once(command, "--help", env=env).stdout.split())
        assert "$XDG_STATE_HOME/once/ledger.db" in text
        assert "~/.local/state/once/ledger.db" in text
        assert "ONCE_DATABASE_URL_FILE" in text


# -- 15. metrics -----------------------------------------------------------------------------


def metric(text: str, name: str, **labels: str) -> float:
    """One sample of `once metrics`' exposition."""
    for line in text.splitlines():
        if line.startswith(name + "{"):
            body, _, value = line[len(name) + 1:].rpartition("} ")
            pairs = dict(item.split("=", 1) for item in body.split(","))
            if all(pairs.get(k) == f'"{v}"' for k, v in labels.items()):
                return float(value)
    raise AssertionError(f"no sample {name} {labels} in:\n{text}")


def test_metrics_do_not_count_watermark_sets_as_runs(once_env: dict[str, str]) -> None:
    """`once state --set` is recorded in the history, but it is neither a run nor a rerun."""
    day = ["run", "--job", "sync", "--every", "day", "--", "true"]
    assert once(once_env, *day).returncode == 0
    for value in ("a", "b"):
        assert once(once_env, "state", "sync", "--set", value).returncode == 0
    assert once(once_env, *day).returncode == 0  # skipped: done
    assert once(once_env, *day).returncode == 0  # skipped: done
    text = once(once_env, "metrics").stdout
    job = {"once_job": "sync"}
    assert metric(text, "once_runs_total", status="done", **job) == 1
    assert metric(text, "once_reruns_total", **job) == 0
    assert metric(text, "once_takeovers_total", **job) == 0
    assert metric(text, "once_fires_total", **job) == 3
    assert metric(text, "once_skips_total", **job) == 2


# -- 17. reports for an account that may only read -------------------------------------------


NOBODY = 65534
# Root without the capabilities that pass over file modes: a user like any other, who may
# read the ledger (owned by nobody, 0644, in a 0755 directory) but not write it.
READER = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner"]


def as_reader(*args: str, env: dict[str, str]) -> Any:
    import subprocess

    return subprocess.run([*READER, ONCE, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def give_away(directory: Path) -> None:
    """The directory and its files belong to nobody now, readable by all."""
    for path in (directory, *directory.iterdir()):
        os.chown(path, NOBODY, NOBODY)
        path.chmod(0o755 if path.is_dir() else 0o644)


@pytest.mark.slow
@sqlite_only
def test_sqlite_reports_work_for_a_reader_that_cannot_write(once_env: dict[str, str],
                                                            tmp_path: Path) -> None:
    """A monitoring account that may read the ledger but not write it (nor its directory)
    gets its reports, with no writer at work and while one holds the WAL."""
    import shutil

    from helpers import wait_for
    from procs import start_once

    if os.geteuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root and setpriv, to take away the right to write")
    home = tmp_path / "ledger"
    home.mkdir()
    env = {**once_env, "ONCE_DATABASE_URL": f"sqlite:///{home}/ledger.db"}
    assert once(env, "run", "--job", "nightly", "--every", "day", "--", "true").returncode == 0
    give_away(home)
    assert as_reader("schema", env=env).returncode == 75  # it really cannot write
    before = sorted(p.name for p in home.iterdir())
    for args in (("status", "--json"), ("history", "nightly"), ("metrics",)):
        result = as_reader(*args, env=env)
        assert result.returncode == 0, (args, result.stdout + result.stderr)
    assert sorted(p.name for p in home.iterdir()) == before  # nothing created
    assert as_reader("check", env=env).stdout == once(env, "check").stdout

    # A writer at work: its command runs while its connection holds the WAL open.
    started = home / "started"
    writer = start_once("run", "--job", "busy", "--every", "day", "--", "sh", "-c",
                        f"touch {started}; sleep 30", env=env)
    try:
        wait_for(started.exists, what="the writer's command to start")
        give_away(home)
        result = as_reader("status", "--json", env=env)
        assert result.returncode == 0, result.stderr
        running = {j["job"]: j["running"] for j in json.loads(result.stdout)}
        assert [r["period"] for r in running["busy"]] == [today()]
        assert as_reader("check", env=env).returncode == 0
    finally:
        writer.kill()
        writer.wait()


# -- 14. a hook's children -------------------------------------------------------------------


@sqlite_only
def test_a_hook_past_its_limit_is_killed_with_everything_it_started(
        once_env: dict[str, str], tmp_path: Path) -> None:
    """The hook's background child would hold once's stdout and stderr: cron would wait."""
    import time

    from procs import alive

    pid_file = tmp_path / "child.pid"
    env = {**once_env, "_ONCE_HOOK_TIMEOUT": "1"}
    began = time.monotonic()
    result = once(env, "run", "--job", "hooked", "--every", "day", "--on-success",
                  f"sleep 40 & echo $! > {pid_file}; wait; true", "--", "true", timeout=90)
    took = time.monotonic() - began  # the pipes close only when the last holder is gone
    assert result.returncode == 0, result.stderr
    assert took < 25, f"once's output stayed open {took:.0f}s"
    assert "--on-success hook timed out after 1s" in result.stderr
    assert not alive(int(pid_file.read_text()))


# -- 16. --log-format json: one JSON object a line ------------------------------------------


def json_lines(stderr: str) -> list[dict[str, Any]]:
    """Every line of stderr as a JSON object (fails on a plain line)."""
    return [json.loads(line) for line in stderr.splitlines()]


@sqlite_only
def test_json_logs_cover_catch_up_progress_pings_and_hooks(once_env: dict[str, str]) -> None:
    import socket

    with socket.socket() as closed:  # a port nobody listens on: the ping is refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    days = [(datetime.now(UTC).date() - timedelta(days=n)).isoformat() for n in (3, 2)]
    result = once(once_env, "catchup", "--job", "late", "--every", "day", "--since", days[0],
                  "--until", days[1], "--log-format", "json", "--", "true")
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stderr)
    assert [(e["event"], e.get("period")) for e in events] == [
        *(("progress", d) for d in days), ("summary", None)]
    assert events[0]["message"].startswith(f"late {days[0]}: done (exit 0, ")
    assert events[-1]["job"] == "late" and events[-1]["level"] == "info"
    assert events[-1]["message"].startswith("caught up 2 periods of late in ")

    result = once(once_env, "run", "--job", "late", "--every", "day", "--catchup", "5",
                  "--log-format", "json", "--ping", f"http://127.0.0.1:{port}/key",
                  "--on-success", "exit 5", "--", "true", timeout=90)
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stderr)
    kinds = [e["event"] for e in events]
    assert kinds.count("progress") == 1  # yesterday, made up before today
    assert kinds.count("ping-failed") == 2 and kinds.count("hook-failed") == 2
    assert all(e["level"] == "error" for e in events if e["event"].endswith("-failed"))
    assert all(e["job"] == "late" and e["message"] for e in events)


# -- 21. every stop once handles leaves one line ---------------------------------------------


def test_a_forwarded_signal_leaves_one_line(once_env: dict[str, str], tmp_path: Path) -> None:
    """A pod stopped with SIGTERM: the log says which job, period and attempt, and why it
    ended; with -q too, and as JSON."""
    import signal

    from helpers import wait_for
    from procs import start_once

    for options in ((), ("-q",), ("--log-format", "json")):
        started = tmp_path / f"started{len(options)}"
        job = f"pod{len(options)}"
        proc = start_once("run", "--job", job, "--every", "day", *options, "--", "sh", "-c",
                          f"touch {started}; sleep 60", env=once_env)
        wait_for(started.exists, what="the command to start")
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 143, stderr
        (line,) = stderr.splitlines()
        if options == ("--log-format", "json"):
            record = json.loads(line)
            assert (record["event"], record["job"], record["period"], record["attempt"]) == (
                "interrupted", job, today(), 1)
            line = "once: " + record["message"]
        assert line.startswith(f"once: {job} {today()} attempt 1: SIGTERM received and "
                               f"forwarded to the command"), line
        assert "recorded failed" in line


def test_quiet_keeps_errors(once_env: dict[str, str]) -> None:
    """-q is for the every-few-minutes idiom: it drops the failed-out warning that every
    fire would mail, never an error."""
    args = ["run", "--job", "flaky", "--every", "day", "--max-attempts", "1", "-q"]
    assert once(once_env, *args, "--", "false").returncode == 1
    skipped = once(once_env, *args, "--", "false")
    assert (skipped.returncode, skipped.stderr) == (0, "")
    timed = once(once_env, "run", "--job", "slow", "--every", "day", "-q", "--timeout", "1",
                 "--", "sleep", "30")
    assert timed.returncode == 124
    assert timed.stderr.startswith(f"once: slow {today()} attempt 1: timed out")


# -- 22. the default ledger is the user's alone ----------------------------------------------


def modes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mode & 0o777 for p in (directory, *directory.iterdir())}


@pytest.mark.tables_made(False)  # an empty ledger
@sqlite_only
@pytest.mark.parametrize("first", ["run", "schema"])
def test_the_default_ledger_is_created_private(once_env: dict[str, str], tmp_path: Path,
                                               first: str) -> None:
    import subprocess

    env = {k: v for k, v in once_env.items() if k != "ONCE_DATABASE_URL"}
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    args = (["run", "--job", "j", "--every", "day", "--", "true"] if first == "run"
            else ["schema"])
    done = subprocess.run([ONCE, *args], env=env, capture_output=True, text=True, timeout=60,
                          umask=0o022)
    assert done.returncode == 0, done.stderr
    ledger = tmp_path / "state" / "once"
    found = modes(ledger)
    assert found.pop("once") == 0o700 and found.pop("ledger.db") == 0o600
    assert all(mode == 0o600 for mode in found.values()), found  # -wal, -shm, .locks

    # What exists keeps its mode: a directory and ledger the user opened up on purpose.
    ledger.chmod(0o750)
    (ledger / "ledger.db").chmod(0o640)
    assert once(env, "run", "--job", "j", "--every", "day", "--", "true").returncode == 0
    assert modes(ledger)["once"] == 0o750 and modes(ledger)["ledger.db"] == 0o640

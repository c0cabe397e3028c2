"""The operator's view (issue 15): hostile text in reports, which ledger a report read, an
empty ledger, cron's environment, stops and hooks, metrics, read-only reports, the default
ledger's file modes and shell completion.

Real `once` processes on real ledgers; what does not depend on the ledger's dialect runs on
SQLite only (ids end in [sqlite]).
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from helpers import ONCE, run_once
from ledger_sql import query
from once.ledger import parse_url
from procs import Terminal

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

# Text that a terminal obeys: a title change, a screen clear, a bell, a line that forges an
# OK under a WARNING exit, a bidi override.
HOSTILE = "ev\x1b]0;pwned\x07il\x1b[2J\nOK 1 job: every due period done\u202e"


def today() -> str:
    return datetime.now(UTC).date().isoformat()


def once(env: dict[str, str], *args: str, **kwargs: Any) -> Any:
    return run_once(*args, env=env, **kwargs)


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


def db_time(url: str, instant: datetime) -> Any:
    at = instant.astimezone(UTC)
    dialect = parse_url(url).dialect
    if dialect == "sqlite":
        return at.strftime("%Y-%m-%d %H:%M:%S.%f")
    return at if dialect == "postgresql" else at.replace(tzinfo=None)


def placeholders(sql: str, url: str) -> str:
    return sql if parse_url(url).dialect == "sqlite" else sql.replace("?", "%s")


def make_stale(url: str, job: str, period: str) -> None:
    """Turn a finished row into a running attempt whose heartbeat stopped an hour ago."""
    query(url, placeholders("UPDATE once_runs SET status='running', finished_at=NULL, "
                            "exit_code=NULL, heartbeat_at=? WHERE job=? AND period=?", url),
          (db_time(url, datetime.now(UTC) - timedelta(hours=1)), job, period))


# -- 10. hostile text ------------------------------------------------------------------------


def test_control_characters_from_outside_are_shown_escaped(once_env: dict[str, str],
                                                           ledger_url: str) -> None:
    """ONCE_OWNER, a rerun reason and a watermark are shown with their controls escaped, in
    a pipe and on a terminal, and `once check` stays one line per finding."""
    env = {**once_env, "ONCE_OWNER": HOSTILE}
    assert once(env, "run", "--job", "hostile", "--every", "day", "--", "true").returncode == 0
    assert once(once_env, "rerun", "--job", "hostile", "--period", today(), "--reason",
                HOSTILE, "--", "true").returncode == 0
    assert once(once_env, "state", "hostile", "--set", HOSTILE).returncode == 0
    # The latest attempt's owner is the hostile one again, its heartbeat stopped.
    assert once(env, "rerun", "--job", "hostile", "--period", today(), "--",
                "true").returncode == 0
    make_stale(ledger_url, "hostile", today())

    check = once(once_env, "check")
    assert check.returncode == 1, check.stdout + check.stderr  # WARNING: stale, not yet due
    lines = check.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"WARNING hostile {today()} stale (owner ")
    assert raw_controls(check.stdout) == []
    assert "\\u001b]0;pwned\\u0007" in lines[0] and "\\nOK 1 job" in lines[0]

    for args in (("history", "hostile"), ("status",), ("status", "hostile", "--timeline")):
        piped = once(once_env, *args)
        assert piped.returncode == 0, piped.stderr
        assert raw_controls(piped.stdout) == [], (args, piped.stdout)
    history = once(once_env, "history", "hostile").stdout
    assert history.count("\\u001b[2J") >= 3  # the owner, the reason, the watermark's note
    assert "\\u202e" in history

    for args in (("history", "hostile"), ("status",), ("check",)):
        drawn, status = on_terminal(once_env, *args)
        assert status in (0, 1), drawn
        assert raw_controls(drawn) == [], (args, drawn)
        assert "\\u001b]0;pwned" in drawn

    # JSON keeps the text itself, escaped by JSON.
    (finding,) = json.loads(once(once_env, "check", "--json").stdout)
    assert finding["owner"] == HOSTILE


@sqlite_only
def test_a_hostile_url_in_an_error_line_is_escaped(once_env: dict[str, str]) -> None:
    result = once(once_env, "run", "--job", "a", "--every", "day", "--db",
                  "sqlite:///no-such-dir\x1b[2J/ledger.db", "--", "true")
    assert result.returncode == 75
    assert result.stderr.startswith("once: ") and result.stderr.count("\n") == 1
    assert raw_controls(result.stderr) == [] and "\\u001b[2J" in result.stderr


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
        2, "CRITICAL nightly - unknown (no run of this job in the ledger)\n")


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

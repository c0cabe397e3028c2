"""`once status`, `history`, `check` and `metrics` on every backend, on ledgers built by real
`once run` and `once catchup` (and, where a scenario needs a past state, rows written with SQL).

Dates are relative to today (UTC unless a test says otherwise), so the tests hold on any day.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import termios
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from helpers import ONCE, run_either
from ledger_sql import db_time, placeholders, query, tables_locked
from once.ledger import parse_url
from once.periods import Period
from once.schedules import schedule

pytestmark = [pytest.mark.usefixtures("ledger_url"), pytest.mark.tables_made]


def today(tz: str = "UTC") -> date:
    return datetime.now(ZoneInfo(tz)).date()


def day(n: int) -> str:
    """The key of the day n days from today (UTC)."""
    return (today() + timedelta(days=n)).isoformat()


def once(env: dict[str, str], *args: str) -> Any:
    return run_either(*args, env=env)


def catchup(env: dict[str, str], job: str, since: str, until: str, *options: str,
            command: tuple[str, ...] = ("true",)) -> None:
    result = once(env, "catchup", "--job", job, "--every", "day", "--since", since,
                  "--until", until, *options, "--", *command)
    assert result.returncode not in (2, 69, 70, 75), result.stderr  # else the child's status


def run_today(env: dict[str, str], job: str, *options: str,
              command: tuple[str, ...] = ("true",)) -> Any:
    return once(env, "run", "--job", job, "--every", "day", *options, "--", *command)


def status_json(env: dict[str, str], *args: str) -> list[dict[str, Any]]:
    result = once(env, "status", "--json", *args)
    assert result.returncode == 0, result.stderr
    parsed: list[dict[str, Any]] = json.loads(result.stdout)
    return parsed


def ledger(env: dict[str, str]) -> str:
    """How check's OK line names the ledger it read."""
    return f"ledger {parse_url(env['ONCE_DATABASE_URL']).redacted}"


def check_lines(env: dict[str, str], *args: str) -> tuple[int, list[str]]:
    result = once(env, "check", *args)
    assert result.returncode in (0, 1, 2), result.stderr
    return result.returncode, result.stdout.splitlines()


# -- writing a past state with SQL -----------------------------------------------------------


def set_running(url: str, job: str, period: str, heartbeat: datetime,
                started: datetime | None = None) -> None:
    """Turn a row into a running attempt whose last heartbeat was at `heartbeat` (and which
    started at `started`, if given)."""
    query(url, placeholders("UPDATE once_runs SET status='running', finished_at=NULL, "
                            "exit_code=NULL, heartbeat_at=? WHERE job=? AND period=?", url),
          (db_time(url, heartbeat), job, period))
    if started is not None:
        query(url, placeholders("UPDATE once_runs SET started_at=? WHERE job=? AND period=?",
                                url), (db_time(url, started), job, period))
    # Its attempt, as a running one stands (a finished one would be a done marker).
    query(url, placeholders("UPDATE once_attempts SET status='running', finished_at=NULL, "
                            "exit_code=NULL, outcome=NULL WHERE job=? AND period=? AND "
                            "attempt=(SELECT attempt FROM once_runs WHERE job=? AND period=?)",
                            url), (job, period, job, period))


def insert_done(url: str, job: str, periods: list[Period]) -> None:
    """Done rows for these periods, in bulk, through the driver."""
    target = parse_url(url)
    now = datetime.now(UTC)
    rows = [(job, p.key, "done", 1, 1000 + i, "seed", db_time(url, p.start), db_time(url, p.end),
             db_time(url, now), db_time(url, now), db_time(url, now), 0)
            for i, p in enumerate(periods)]
    sql = placeholders("INSERT INTO once_runs (job, period, status, attempt, fence, owner, "
                       "period_start, period_end, started_at, heartbeat_at, finished_at, "
                       "exit_code) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", url)
    if target.dialect == "sqlite":
        import sqlite3

        conn = sqlite3.connect(target.path)
        with conn:
            conn.executemany(sql, rows)
        conn.close()
    elif target.dialect == "postgresql":
        import psycopg

        with psycopg.connect(target.connect_args["conninfo"], autocommit=True) as pg:
            pg.cursor().executemany(sql, rows)
    else:
        import pymysql

        my = pymysql.connect(**target.connect_args, autocommit=True)
        try:
            my.cursor().executemany(sql, rows)
        finally:
            my.close()


# -- status ----------------------------------------------------------------------------------


def test_status_json_after_run_and_catchup(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-5), day(-3))
    assert run_today(once_env, "nightly").returncode == 0
    assert run_today(once_env, "flaky", command=("sh", "-c", "exit 3")).returncode == 3
    jobs = status_json(once_env)
    assert [j["job"] for j in jobs] == ["flaky", "nightly"]
    for entry in jobs:
        for key in ("job", "schedule", "tz", "last_done", "running", "failed", "missing",
                    "next", "last_finished_at", "last_duration_s"):
            assert key in entry
    flaky, nightly = jobs
    assert nightly["schedule"] == "day" and nightly["kind"] == "every"
    assert nightly["tz"] == "UTC"
    assert nightly["last_done"] == day(0)
    assert nightly["running"] == [] and nightly["failed"] == 0
    assert nightly["missing"] == 2
    assert nightly["missing_periods"] == [day(-2), day(-1)]
    assert nightly["first_period"] == day(-5)
    assert nightly["next"] == day(1)
    assert nightly["last_duration_s"] >= 0
    assert datetime.fromisoformat(nightly["last_finished_at"]).tzinfo is not None
    assert flaky["last_done"] is None and flaky["failed"] == 1 and flaky["missing"] == 0
    assert flaky["failed_periods"][0] == {**flaky["failed_periods"][0], "period": day(0),
                                          "attempt": 1, "exit_code": 3, "attempts_left": 2}


def test_status_names_jobs_and_reports_unknown_ones(once_env: dict[str, str]) -> None:
    run_today(once_env, "a")
    run_today(once_env, "b")
    assert [j["job"] for j in status_json(once_env, "b")] == ["b"]
    result = once(once_env, "status", "b", "nope")
    assert result.returncode == 2
    assert "nope" in result.stderr and result.stderr.startswith("once: ")
    assert "b" in result.stdout


def test_status_is_namespace_aware(once_env: dict[str, str]) -> None:
    run_today(once_env, "report", "--namespace", "prod")
    run_today(once_env, "report", "--namespace", "staging")
    run_today(once_env, "plain")
    assert [j["job"] for j in status_json(once_env, "--namespace", "prod")] == ["prod:report"]
    assert [j["job"] for j in status_json(once_env, "--namespace", "prod", "report")] == [
        "prod:report"]
    assert len(status_json(once_env)) == 3
    code, lines = check_lines(once_env, "--namespace", "staging", "report")
    assert code == 0, lines


def test_status_in_a_pipe_is_plain_text(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-3), day(-3))
    run_today(once_env, "nightly")
    result = once(once_env, "status")
    assert result.returncode == 0
    assert "\x1b" not in result.stdout
    header, row, blank, ledger = result.stdout.splitlines()
    assert (blank, ledger) == ("", f"ledger: {once_env['ONCE_DATABASE_URL']}")
    assert header.split()[:3] == ["JOB", "SCHEDULE", "TZ"]
    assert row.startswith("nightly ")
    assert day(0) in row and f"2 from {day(-2)}" in row


def test_status_on_a_terminal_is_a_coloured_table(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-3), day(-3))
    run_today(once_env, "nightly")
    out, code = in_pty([ONCE, "status"], once_env)
    assert code == 0
    assert "\x1b[" in out  # colour
    assert "JOB" in out and "nightly" in out and "MISSING" in out
    assert "─" in out  # rich's table rule


def in_pty(argv: list[str], env: dict[str, str], columns: int = 200) -> tuple[str, int]:
    """Run a command on a pseudo-terminal of the given width; its output and exit status."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: its stdin, stdout and stderr are the terminal
        try:
            os.execve(argv[0], argv, {**env, "TERM": "xterm-256color", "COLUMNS": str(columns)})
        finally:
            os._exit(127)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    chunks = []
    while True:
        ready, _, _ = select.select([fd], [], [], 60)
        if not ready:
            break
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    _, wait_status = os.waitpid(pid, 0)
    return b"".join(chunks).decode(errors="replace"), os.waitstatus_to_exitcode(wait_status)


@pytest.mark.tables_made(False)  # an empty ledger
def test_status_on_an_empty_ledger(once_env: dict[str, str]) -> None:
    result = once(once_env, "status")
    assert result.returncode == 0 and result.stdout == ""
    assert status_json(once_env) == []
    result = once(once_env, "check")  # an empty ledger is more often the wrong one: UNKNOWN
    assert result.returncode == 3 and result.stdout.startswith("UNKNOWN - - empty ")


# -- check -----------------------------------------------------------------------------------


def test_check_names_both_missing_days(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-3), day(-3))
    assert run_today(once_env, "nightly").returncode == 0
    code, lines = check_lines(once_env)
    assert code == 2
    assert lines == [f"CRITICAL nightly {day(-2)} missing", f"CRITICAL nightly {day(-1)} missing"]
    result = once(once_env, "check", "--json")
    assert result.returncode == 2
    found = json.loads(result.stdout)
    assert [(f["severity"], f["status"], f["job"], f["period"], f["problem"]) for f in found] == [
        ("CRITICAL", 2, "nightly", day(-2), "missing"),
        ("CRITICAL", 2, "nightly", day(-1), "missing")]
    assert found[0]["line"] == lines[0]


def test_check_all_done(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-3), day(0))
    code, lines = check_lines(once_env)
    assert (code, lines) == (0, [f"OK 1 job: every due period done ({ledger(once_env)})"])
    result = once(once_env, "check", "--json")
    assert (result.returncode, json.loads(result.stdout)) == (0, [])


def test_check_failed_out_period_is_critical_before_it_is_due(once_env: dict[str, str]) -> None:
    assert run_today(once_env, "once-only", "--max-attempts", "1",
                     command=("false",)).returncode == 1
    code, lines = check_lines(once_env)
    assert code == 2
    assert lines == [f"CRITICAL once-only {day(0)} failed-out "
                     f"(attempt 1 of 1, exit 1, no attempts left)"]


def test_check_failed_with_attempts_left_waits_until_due(once_env: dict[str, str]) -> None:
    assert run_today(once_env, "retry", command=("false",)).returncode == 1
    assert check_lines(once_env)[0] == 0  # today is not due; the next fire retries it
    catchup(once_env, "past", day(-1), day(-1), command=("sh", "-c", "exit 4"))
    code, lines = check_lines(once_env)
    assert code == 2
    assert lines == [f"CRITICAL past {day(-1)} failed (attempt 1 of 3, exit 4)"]
    assert status_json(once_env, "past")[0]["failed"] == 1


def test_check_stale_heartbeat_warns(once_env: dict[str, str], ledger_url: str) -> None:
    run_today(once_env, "stuck")
    set_running(ledger_url, "stuck", day(0), datetime.now(UTC) - timedelta(hours=1))
    code, lines = check_lines(once_env)
    assert code == 1
    (line,) = lines
    assert line.startswith(f"WARNING stuck {day(0)} stale (owner ")
    assert "heartbeat 1h ago, stale after 5m" in line
    (entry,) = status_json(once_env)
    assert entry["running"][0]["stale"] is True and entry["missing"] == 0


def test_check_highest_status_wins(once_env: dict[str, str], ledger_url: str) -> None:
    run_today(once_env, "stuck")
    set_running(ledger_url, "stuck", day(0), datetime.now(UTC) - timedelta(hours=1))
    catchup(once_env, "gap", day(-2), day(-2))
    code, lines = check_lines(once_env)
    assert code == 2
    assert lines[0] == f"CRITICAL gap {day(-1)} missing"
    assert lines[1].startswith(f"WARNING stuck {day(0)} stale")


def test_check_due_period_held_by_a_live_attempt_is_an_overrun(once_env: dict[str, str],
                                                               ledger_url: str) -> None:
    catchup(once_env, "slow", day(-2), day(0))
    # An attempt that started seconds ago (a rerun, a catch-up) has not overrun its period.
    set_running(ledger_url, "slow", day(-1), datetime.now(UTC))
    assert check_lines(once_env) == (0, [f"OK 1 job: every due period done "
                                         f"({ledger(once_env)})"])
    # One that has run longer than its day has.
    set_running(ledger_url, "slow", day(-1), datetime.now(UTC),
                started=datetime.now(UTC) - timedelta(hours=25))
    code, lines = check_lines(once_env)
    assert code == 2  # a hung run is loud: neither missing nor failed, but overrun
    assert len(lines) == 1 and lines[0].startswith(f"CRITICAL slow {day(-1)} overrun (owner ")
    (entry,) = status_json(once_env)
    assert entry["missing"] == 0 and entry["failed"] == 0
    (running,) = entry["running"]
    assert running["period"] == day(-1) and running["due"] and not running["stale"]
    assert running["overrun"]
    # The same attempt gone quiet: the due period is missing now, and loudly.
    set_running(ledger_url, "slow", day(-1), datetime.now(UTC) - timedelta(hours=2))
    code, lines = check_lines(once_env)
    assert code == 2
    assert lines[0].startswith(f"CRITICAL slow {day(-1)} stale (owner ")
    assert status_json(once_env)[0]["missing"] == 1


def test_check_grace(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-3), day(-3))
    assert check_lines(once_env)[1] == [f"CRITICAL nightly {day(-2)} missing",
                                        f"CRITICAL nightly {day(-1)} missing"]
    assert check_lines(once_env, "--grace", "1d") == (
        2, [f"CRITICAL nightly {day(-2)} missing"])
    assert check_lines(once_env, "--grace", "3d")[0] == 0
    assert check_lines(once_env, "--grace", "0")[0] == 2


def test_check_lag_makes_a_period_due_one_period_later(once_env: dict[str, str]) -> None:
    # --lag 1: yesterday's period is claimed today and due only once today has ended.
    catchup(once_env, "lagged", day(-4), day(-3), "--lag", "1")
    assert check_lines(once_env) == (2, [f"CRITICAL lagged {day(-2)} missing"])
    catchup(once_env, "plain", day(-4), day(-3))
    assert check_lines(once_env, "plain") == (2, [f"CRITICAL plain {day(-2)} missing",
                                                  f"CRITICAL plain {day(-1)} missing"])
    assert once(once_env, "run", "--job", "lagged", "--every", "day", "--lag", "1", "--",
                "true").returncode == 0
    (entry,) = status_json(once_env, "lagged")
    assert entry["last_done"] == day(-1) and entry["missing_periods"] == [day(-2)]


def test_check_lists_ten_then_a_range(once_env: dict[str, str]) -> None:
    catchup(once_env, "long", day(-25), day(-25))
    run_today(once_env, "long")
    code, lines = check_lines(once_env)
    assert code == 2
    assert lines[:10] == [f"CRITICAL long {day(n)} missing" for n in range(-24, -14)]
    assert lines[10:] == [f"CRITICAL long {day(-14)}..{day(-1)} missing (14 more periods)"]
    (entry,) = status_json(once_env)
    assert entry["missing"] == 24 and entry["missing_last"] == day(-1)
    assert len(entry["missing_periods"]) == 10


def test_check_unknown_job_is_critical(once_env: dict[str, str]) -> None:
    run_today(once_env, "known")
    assert check_lines(once_env, "known", "ghost") == (
        2, ["CRITICAL ghost - unknown (never ran: no run of this job in the ledger)"])


def test_check_cron_job(once_env: dict[str, str]) -> None:
    cron = schedule(None, "0 3 * * *", "UTC")
    now = datetime.now(UTC)
    last_due = cron.previous(cron.containing(now))
    first = cron.shifted(last_due, -4)
    result = once(once_env, "catchup", "--job", "c", "--cron", "0 3 * * *", "--since",
                  first.key, "--until", first.key, "--", "true")
    assert result.returncode == 0, result.stderr
    missing = [p.key for p in cron.between(cron.next(first), last_due)]
    assert len(missing) == 4
    assert check_lines(once_env) == (2, [f"CRITICAL c {k} missing" for k in missing])
    assert status_json(once_env)[0]["missing"] == 4


def test_check_across_a_dst_change(once_env: dict[str, str], ledger_url: str) -> None:
    """An hourly New York job over the latest fall-back week: the repeated 01:00 hour is two
    periods, and missing both is two findings with distinct keys."""
    tz = "America/New_York"
    hourly = schedule("hour", None, tz)
    change = latest_fall_back(tz)
    first = hourly.containing(change - timedelta(days=3))
    result = once(once_env, "catchup", "--job", "ny", "--every", "hour", "--tz", tz, "--since",
                  first.key, "--until", first.key, "--", "true")
    assert result.returncode == 0, result.stderr
    current = hourly.containing(datetime.now(UTC))
    repeated = [hourly.containing(change - timedelta(minutes=30)),
                hourly.containing(change + timedelta(minutes=30))]
    assert [p.key[-6:] for p in repeated] == ["-04:00", "-05:00"]
    assert repeated[0].key[:16] == repeated[1].key[:16]  # the same wall time, twice
    rest = [p for p in hourly.between(hourly.next(first), current) if p not in repeated]
    insert_done(ledger_url, "ny", rest)
    code, lines = check_lines(once_env)
    assert (code, lines) == (2, [f"CRITICAL ny {p.key} missing" for p in repeated])
    (entry,) = status_json(once_env)
    assert entry["missing"] == 2 and entry["missing_periods"] == [p.key for p in repeated]
    # The day of the change has 25 hourly periods; the timeline draws it as a row of 25.
    result = once(once_env, "status", "ny", "--timeline", "--last", str(len(rest) + 3))
    assert result.returncode == 0, result.stderr
    row = next(line for line in result.stdout.splitlines()
               if line.startswith(change.astimezone(ZoneInfo(tz)).date().isoformat()))
    cells = row.split(maxsplit=1)[1]
    assert cells.count(".") == 2 and len(cells.replace(" ", "")) == 25


def latest_fall_back(tz: str) -> datetime:
    """The latest instant before now at which the zone's UTC offset went down."""
    zone = ZoneInfo(tz)
    at = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    while True:
        before = (at - timedelta(hours=1)).astimezone(zone).utcoffset()
        after = at.astimezone(zone).utcoffset()
        assert before is not None and after is not None
        if after < before:
            return at
        at -= timedelta(hours=1)


# -- history ---------------------------------------------------------------------------------


def test_history_lists_every_attempt_newest_first(once_env: dict[str, str]) -> None:
    assert run_today(once_env, "flaky", command=("sh", "-c", "exit 5")).returncode == 5
    assert run_today(once_env, "flaky").returncode == 0
    result = once(once_env, "rerun", "--job", "flaky", "--period", day(0), "--reason",
                  "bad input", "--", "true")
    assert result.returncode == 0, result.stderr
    result = once(once_env, "history", "flaky", "--json")
    assert result.returncode == 0, result.stderr
    entries = json.loads(result.stdout)
    assert [(e["attempt"], e["status"], e["exit_code"], e["reason"]) for e in entries] == [
        (3, "done", 0, "bad input"), (2, "done", 0, None), (1, "failed", 5, None)]
    fences = [e["fence"] for e in entries]
    assert fences == sorted(fences, reverse=True)
    for e in entries:
        assert set(e) >= {"job", "period", "attempt", "fence", "owner", "status", "outcome",
                          "started_at", "finished_at", "duration_s", "exit_code", "reason"}
        assert e["period"] == day(0) and e["job"] == "flaky" and e["duration_s"] >= 0
    limited = json.loads(once(once_env, "history", "flaky", "--json", "--limit", "1").stdout)
    assert [e["attempt"] for e in limited] == [3]
    plain = once(once_env, "history", "flaky")
    assert "\x1b" not in plain.stdout
    lines = plain.stdout.splitlines()
    assert lines[0].split()[:4] == ["PERIOD", "ATTEMPT", "FENCE", "OWNER"]
    assert len(lines) == 4 and "bad input" in lines[1]


def test_history_period_filter_and_takeover(once_env: dict[str, str], ledger_url: str) -> None:
    catchup(once_env, "j", day(-2), day(-1))
    set_running(ledger_url, "j", day(-1), datetime.now(UTC) - timedelta(hours=1))
    result = once(once_env, "catchup", "--job", "j", "--every", "day", "--since", day(-1),
                  "--until", day(-1), "--", "true")
    assert result.returncode == 0, result.stderr
    entries = json.loads(once(once_env, "history", "j", "--period", day(-1), "--json").stdout)
    assert [(e["attempt"], e["outcome"]) for e in entries][1] == (1, "taken-over")
    assert entries[0]["attempt"] == 2 and entries[0]["status"] == "done"
    assert {e["period"] for e in entries} == {day(-1)}


def test_history_of_an_unknown_job(once_env: dict[str, str]) -> None:
    result = once(once_env, "history", "ghost")
    assert result.returncode == 2
    assert result.stderr.startswith("once: unknown job 'ghost'")


# -- metrics ---------------------------------------------------------------------------------


def metric_samples(env: dict[str, str]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    result = once(env, "metrics")
    assert result.returncode == 0, result.stderr
    samples = {}
    families = list(text_string_to_metric_families(result.stdout))
    for family in families:
        assert family.documentation, family.name  # every metric has HELP
        assert family.type in ("gauge", "counter"), family.name
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_metrics_parse_and_count(once_env: dict[str, str]) -> None:
    weird = 'we"ird\\job'
    catchup(once_env, "nightly", day(-3), day(-3))
    assert run_today(once_env, "nightly", command=("sh", "-c", "exit 1")).returncode == 1
    assert run_today(once_env, "nightly").returncode == 0  # a retry: a takeover of a failed row
    assert run_today(once_env, "nightly").returncode == 0  # a skip: done already
    assert once(once_env, "rerun", "--job", "nightly", "--period", day(0), "--",
                "true").returncode == 0
    assert run_today(once_env, weird).returncode == 0
    s = metric_samples(once_env)
    job = (("once_job", "nightly"),)
    assert s[("once_fires_total", job)] == 5
    assert s[("once_runs_total", (("once_job", "nightly"), ("status", "done")))] == 3
    assert s[("once_runs_total", (("once_job", "nightly"), ("status", "failed")))] == 1
    assert s[("once_skips_total", job)] == 1
    assert s[("once_takeovers_total", job)] == 1
    assert s[("once_reruns_total", job)] == 1
    assert s[("once_missing_periods", job)] == 2
    assert s[("once_failed_periods", job)] == 0
    finished = s[("once_last_success_timestamp_seconds", job)]
    assert abs(finished - datetime.now(UTC).timestamp()) < 600
    assert s[("once_last_duration_seconds", job)] >= 0
    info = (("kind", "every"), ("once_job", "nightly"), ("schedule", "day"), ("tz", "UTC"))
    assert s[("once_job_info", info)] == 1
    # Label values survive escaping: the parser gives back the exact name.
    assert s[("once_fires_total", (("once_job", weird),))] == 1


@pytest.mark.tables_made(False)  # an empty ledger
def test_metrics_on_an_empty_ledger_parse(once_env: dict[str, str]) -> None:
    assert metric_samples(once_env) == {}


def test_metrics_are_namespace_aware(once_env: dict[str, str]) -> None:
    run_today(once_env, "a", "--namespace", "prod")
    run_today(once_env, "b")
    result = once({**once_env, "ONCE_NAMESPACE": "prod"}, "metrics")
    assert 'once_job="prod:a"' in result.stdout and 'once_job="b"' not in result.stdout


# -- timeline --------------------------------------------------------------------------------


def test_timeline_in_a_pipe_uses_plain_symbols(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-9), day(-6))
    catchup(once_env, "nightly", day(-4), day(-4), command=("false",))
    catchup(once_env, "nightly", day(-2), day(0))
    result = once(once_env, "status", "nightly", "--timeline")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b" not in out
    assert "# done" in out and ". missing" in out and "x failed" in out
    grid = [line for line in out.splitlines() if line[:3] in ("Mon", "Tue", "Wed", "Thu", "Fri",
                                                             "Sat", "Sun")]
    assert len(grid) == 7
    cells = "".join(line[4:] for line in grid)
    assert cells.count("#") == 7 and cells.count("x") == 1 and cells.count(".") == 2
    (entry,) = status_json(once_env, "nightly", "--timeline")
    states = {c["period"]: c["state"] for c in entry["timeline"]}
    assert states[day(-4)] == "failed" and states[day(-5)] == "missing"
    assert states[day(-3)] == "missing" and states[day(0)] == "done"
    assert next(iter(states)) == day(-9)  # never before the job's first period


def test_timeline_last_and_hourly_rows(once_env: dict[str, str]) -> None:
    hourly = schedule("hour", None, "UTC")
    current = hourly.containing(datetime.now(UTC))
    first = hourly.shifted(current, -30)
    result = once(once_env, "catchup", "--job", "h", "--every", "hour", "--since", first.key,
                  "--until", hourly.shifted(current, -1).key, "--", "true")
    assert result.returncode == 0, result.stderr
    result = once(once_env, "status", "h", "--timeline", "--last", "48")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "(31 periods: 30 done, 1 not due yet)" in lines[0]
    assert lines[2].split()[:3] == ["00", "03", "06"]
    symbols = "".join(line[10:] for line in lines if line[:2] == "20")
    assert symbols.count("#") == 30 and symbols.count("-") == 1
    assert once(once_env, "status", "--last", "3").returncode == 2  # --last needs --timeline


def test_timeline_on_a_terminal_is_coloured(once_env: dict[str, str]) -> None:
    catchup(once_env, "nightly", day(-3), day(-3))
    run_today(once_env, "nightly")
    out, code = in_pty([ONCE, "status", "nightly", "--timeline"], once_env)
    assert code == 0
    assert "\x1b[" in out and "■" in out and "□" in out


# -- shards ----------------------------------------------------------------------------------


def test_a_sharded_period_is_done_only_when_every_shard_is(once_env: dict[str, str],
                                                           ledger_url: str) -> None:
    result = once(once_env, "catchup", "--job", "sh", "--every", "day", "--shards", "3",
                  "--since", day(-2), "--until", day(0), "--", "true")
    assert result.returncode == 0, result.stderr
    assert len(query(ledger_url, "SELECT period FROM once_runs")) == 9
    assert check_lines(once_env)[0] == 0
    query(ledger_url, placeholders("DELETE FROM once_runs WHERE period IN (?, ?, ?)", ledger_url),
          (f"{day(-2)}#1", f"{day(-1)}#0", f"{day(-1)}#2"))
    code, lines = check_lines(once_env)
    assert (code, lines) == (2, [f"CRITICAL sh {day(-2)}#1 missing",
                                 f"CRITICAL sh {day(-1)}#0 missing",
                                 f"CRITICAL sh {day(-1)}#2 missing"])
    (entry,) = status_json(once_env, "sh", "--timeline", "--last", "3")
    assert entry["missing"] == 3
    assert [c["state"] for c in entry["timeline"]] == ["missing", "missing", "done"]
    query(ledger_url, placeholders("DELETE FROM once_runs WHERE period = ?", ledger_url),
          (f"{day(-1)}#1",))
    assert check_lines(once_env)[1] == [f"CRITICAL sh {day(-2)}#1 missing",
                                        f"CRITICAL sh {day(-1)}#0 missing",
                                        f"CRITICAL sh {day(-1)}#1 missing",
                                        f"CRITICAL sh {day(-1)}#2 missing"]


# -- many rows: the counts and the gap finder, on every backend ------------------------------


def test_check_finds_every_gap_among_many_rows(once_env: dict[str, str], ledger_url: str
                                               ) -> None:
    # 3,000 hourly periods of a job in Berlin (DST changes inside), done but for: one missing
    # period, a stretch of 15, one before the last; a failed period and a stale attempt, which
    # are no gap. once check, status and metrics find exactly those (the counts per stretch,
    # the search down to each gap, the search back to the last one).
    sched = schedule("hour", None, "Europe/Berlin")
    assert once(once_env, "run", "--job", "big", "--every", "hour", "--tz", "Europe/Berlin",
                "--", "true").returncode == 0
    current = sched.containing(datetime.now(UTC))
    periods = [sched.previous(current)]
    while len(periods) < 3000:
        periods.append(sched.previous(periods[-1]))
    periods.reverse()  # oldest first; the current period is done by the run above
    gone = {100, *range(1700, 1715), 2998}
    insert_done(ledger_url, "big", [p for i, p in enumerate(periods) if i not in gone])
    query(ledger_url, placeholders("UPDATE once_jobs SET first_period_start = ? WHERE job = ?",
                                   ledger_url), (db_time(ledger_url, periods[0].start), "big"))
    query(ledger_url, placeholders("UPDATE once_runs SET status = 'failed', exit_code = 3 "
                                   "WHERE job = ? AND period = ?", ledger_url),
          ("big", periods[500].key))
    set_running(ledger_url, "big", periods[2500].key, datetime.now(UTC) - timedelta(hours=2))
    missing = [periods[i].key for i in sorted(gone)]

    result = once(once_env, "check", "--json")
    assert result.returncode == 2, result.stderr
    found = json.loads(result.stdout)
    listed = sorted(gone)  # one line each for the first ten, then one for the rest
    expected = sorted([*((i, periods[i].key, "missing") for i in listed[:10]),
                       (listed[10], f"{missing[10]}..{missing[-1]}", "missing"),
                       (500, periods[500].key, "failed"), (2500, periods[2500].key, "stale")])
    assert [(f["period"], f["problem"]) for f in found] == [(k, p) for _, k, p in expected]
    assert [f["count"] for f in found if ".." in f["period"]] == [len(missing) - 10]
    (state,) = status_json(once_env)
    assert state["missing"] == len(missing) + 1  # the stale attempt's period too
    assert state["missing_periods"] == [periods[i].key for i in sorted({*gone, 2500})][:10]
    assert state["missing_last"] == missing[-1]
    metrics = once(once_env, "metrics").stdout
    assert f'once_missing_periods{{once_job="big"}} {len(missing) + 1}' in metrics

    insert_done(ledger_url, "big", [periods[i] for i in sorted(gone)])
    query(ledger_url, placeholders("UPDATE once_runs SET status = 'done' WHERE job = ?",
                                   ledger_url), ("big",))
    code, lines = check_lines(once_env)
    assert (code, lines) == (0, [f"OK 1 job: every due period done ({ledger(once_env)})"])


@pytest.mark.parametrize("report", [("status",), ("check",), ("metrics",),
                                    ("history", "behind"), ("logs", "behind")])
def test_a_report_behind_a_table_another_session_locked_ends_at_its_bound(
        ledger_url: str, once_env: dict[str, str], monkeypatch: pytest.MonkeyPatch,
        report: tuple[str, ...]) -> None:
    # A `LOCK TABLE` or DDL left in an open transaction held every report for as long as it
    # was held, `once check` in a monitoring system's hands among them: it now gives up at
    # records.LOCK_WAIT (60 s; 1 s here), exit 75, saying which lock it waited on.
    target = parse_url(ledger_url)
    if target.dialect == "sqlite":
        pytest.skip("a WAL ledger's readers wait on no writer")
    from once.ledger import fleet
    from once.report import snapshot

    monkeypatch.setattr(fleet, "LOCK_WAIT", 1.0)
    monkeypatch.setattr(snapshot, "LOCK_WAIT", 1.0)
    assert run_today(once_env, "behind").returncode == 0
    with tables_locked(ledger_url, "once_runs", "once_attempts"):
        began = datetime.now(UTC)
        result = once(once_env, *report)
        took = (datetime.now(UTC) - began).total_seconds()
    assert result.returncode == 75, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith(f"once: cannot read the ledger {target.redacted}: waited on a "
                           f"table's lock held by another session past 1s ("), line
    assert took < 30, took
    assert once(once_env, *report).returncode == 0  # and reads again once it is let go


def test_the_lead_names_behind_a_table_another_session_locked_end_at_the_bound(
        ledger_url: str, once_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    # The leases' read said `cannot read the leases: canceling statement due to lock timeout
    # LINE 1: ...` (the server's text whole, a part of the statement in it; an attacker's
    # finding): one line now, the lock named, as the other reads say it.
    target = parse_url(ledger_url)
    if target.dialect == "sqlite":
        pytest.skip("a WAL ledger's readers wait on no writer")
    from once.ledger import fleet

    monkeypatch.setattr(fleet, "LOCK_WAIT", 1.0)
    assert once(once_env, "lead", "--name", "held", "--lease", "3s", "--",
                "true").returncode == 0
    with tables_locked(ledger_url, "once_leases"):
        result = once(once_env, "status", "--leads")
    assert result.returncode == 75, (result.stdout, result.stderr)
    [line] = result.stderr.splitlines()
    assert line.startswith("once: cannot read the leases: waited on a table's lock held by "
                           "another session past 1s ("), line

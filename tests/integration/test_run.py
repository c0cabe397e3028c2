"""`once run` on every backend: exactly once per period, retries, skips, the child's world."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from helpers import ONCE, release_together, run_once
from ledger_sql import query, scalar
from once.ledger.schema import SCHEMA_VERSION

pytestmark = pytest.mark.usefixtures("ledger_url")

# A child that appends its period, attempt and fence to a log: the children's own count.
RECORD = ["sh", "-c", 'echo "$ONCE_PERIOD $ONCE_ATTEMPT $ONCE_FENCE" >> "$LOG"']


def record_env(once_env: dict[str, str], tmp_path: Path) -> tuple[dict[str, str], Path]:
    log = tmp_path / "children.log"
    return {**once_env, "LOG": str(log)}, log


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_first_run_claims_and_second_skips(once_env: dict[str, str], tmp_path: Path,
                                           ledger_url: str) -> None:
    env, log = record_env(once_env, tmp_path)
    first = run_once("run", "--job", "hello", "--every", "day", "--", *RECORD, env=env)
    assert first.returncode == 0, first.stderr
    second = run_once("run", "--job", "hello", "--every", "day", "--", *RECORD, env=env)
    assert second.returncode == 0, second.stderr
    assert len(lines(log)) == 1
    row = query(ledger_url, "SELECT status, attempt, exit_code FROM once_runs WHERE job='hello'")
    assert row == [("done", 1, 0)]


@pytest.mark.slow
def test_race_of_24_processes_runs_the_command_once(once_env: dict[str, str],
                                                    tmp_path: Path) -> None:
    # On an empty ledger: the 24 first uses also race to create the tables.
    env, log = record_env(once_env, tmp_path)
    cmd = [ONCE, "run", "--job", "race", "--every", "day", "--", *RECORD]
    results = release_together([cmd] * 24, tmp_path / "gate", env)
    assert [r.returncode for r in results] == [0] * 24, [r.stderr for r in results if r.stderr]
    assert len(lines(log)) == 1


@pytest.mark.slow
def test_race_on_a_stale_running_row_has_one_taker(once_env: dict[str, str], tmp_path: Path,
                                                   ledger_url: str) -> None:
    env, log = record_env(once_env, tmp_path)
    first = run_once("run", "--job", "stale", "--every", "day", "--", "true", env=env)
    assert first.returncode == 0
    # Make the row look like an owner that died long ago (the database's clock decides).
    query(ledger_url, "UPDATE once_runs SET status='running', finished_at=NULL, "
                      "heartbeat_at=period_start WHERE job='stale'")
    query(ledger_url, "UPDATE once_attempts SET status='running', finished_at=NULL, "
                      "exit_code=NULL, outcome=NULL WHERE job='stale'")  # not a done marker
    cmd = [ONCE, "run", "--job", "stale", "--every", "day", "--stale-after", "1m", "--",
           *RECORD]
    results = release_together([cmd] * 24, tmp_path / "gate", env)
    assert [r.returncode for r in results] == [0] * 24, [r.stderr for r in results if r.stderr]
    (entry,) = lines(log)
    assert entry.split()[1] == "2"  # attempt 2
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 2)]


@pytest.mark.slow
def test_race_on_a_failed_row_has_one_retrier(once_env: dict[str, str], tmp_path: Path,
                                              ledger_url: str) -> None:
    env, log = record_env(once_env, tmp_path)
    failed = run_once("run", "--job", "flaky", "--every", "day", "--", "false", env=env)
    assert failed.returncode == 1
    cmd = [ONCE, "run", "--job", "flaky", "--every", "day", "--", *RECORD]
    results = release_together([cmd] * 24, tmp_path / "gate", env)
    assert [r.returncode for r in results] == [0] * 24, [r.stderr for r in results if r.stderr]
    (entry,) = lines(log)
    _, attempt, fence = entry.split()
    assert attempt == "2"
    first_fence = scalar(ledger_url, "SELECT fence FROM once_attempts WHERE attempt=1")
    assert int(fence) > first_fence
    history = query(ledger_url, "SELECT attempt, status, exit_code FROM once_attempts "
                                "ORDER BY attempt")
    assert history == [(1, "failed", 1), (2, "done", 0)]


def test_child_environment(once_env: dict[str, str], tmp_path: Path) -> None:
    dump = [sys.executable, "-c",
            "import json,os; print(json.dumps({k: v for k, v in os.environ.items() "
            "if k.startswith('ONCE_') and k != 'ONCE_DATABASE_URL'}))"]
    result = run_once("run", "--job", "env", "--every", "day", "--tz", "Europe/Berlin",
                      "--namespace", "prod", "--", *dump, env=once_env)
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    assert seen["ONCE_JOB"] == "prod:env"
    assert seen["ONCE_PERIOD_TZ"] == "Europe/Berlin" and "ONCE_TZ" not in seen
    assert seen["ONCE_ATTEMPT"] == "1"
    assert int(seen["ONCE_FENCE"]) >= 1
    key = seen["ONCE_PERIOD"]
    assert seen["ONCE_PERIOD_START"].startswith(key + "T00:00:00+0")
    assert seen["ONCE_PERIOD_END"] > seen["ONCE_PERIOD_START"]


def test_stdin_stdout_stderr_pass_through(once_env: dict[str, str]) -> None:
    result = run_once("run", "--job", "io", "--every", "day", "--", "sh", "-c",
                      "cat; echo to-err >&2", env=once_env, input="from stdin\n")
    assert result.returncode == 0
    assert result.stdout == "from stdin\n"
    assert "to-err" in result.stderr


def test_exit_status_is_the_childs_and_the_row_failed(once_env: dict[str, str],
                                                      ledger_url: str) -> None:
    result = run_once("run", "--job", "three", "--every", "day", "--", "sh", "-c", "exit 3",
                      env=once_env)
    assert result.returncode == 3
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", 3)]


def test_child_killed_by_a_signal_exits_128_plus_n(once_env: dict[str, str],
                                                   ledger_url: str) -> None:
    result = run_once("run", "--job", "sig", "--every", "day", "--", "sh", "-c", "kill -TERM $$",
                      env=once_env)
    assert result.returncode == 128 + 15
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", 143)]


@pytest.mark.parametrize(("command", "status"), [(["no-such-command-xyz"], 127),
                                                 (["/etc/passwd"], 126)])
def test_a_command_that_cannot_start_is_failed(once_env: dict[str, str], ledger_url: str,
                                               command: list[str], status: int) -> None:
    result = run_once("run", "--job", "exec", "--every", "day", "--", *command, env=once_env)
    assert result.returncode == status
    assert result.stderr.startswith("once: cannot run")
    assert len(result.stderr.splitlines()) == 1
    assert query(ledger_url, "SELECT status, exit_code FROM once_runs") == [("failed", status)]


def test_failed_period_is_retried_with_a_larger_fence(once_env: dict[str, str],
                                                      ledger_url: str) -> None:
    args = ["run", "--job", "retry", "--every", "day", "--max-attempts", "2", "--"]
    assert run_once(*args, "false", env=once_env).returncode == 1
    assert run_once(*args, "false", env=once_env).returncode == 1
    used_up = run_once(*args, "true", env=once_env)
    assert used_up.returncode == 0
    assert used_up.stderr.startswith("once: ") and "no attempts left" in used_up.stderr
    assert len(used_up.stderr.splitlines()) == 1
    fences = [f for (f,) in query(ledger_url, "SELECT fence FROM once_attempts ORDER BY attempt")]
    assert len(fences) == 2 and fences[1] > fences[0]
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("failed", 2)]


def test_skipped_exit_code(once_env: dict[str, str]) -> None:
    args = ["run", "--job", "skip", "--every", "day", "--skipped-exit-code", "9", "--", "true"]
    assert run_once(*args, env=once_env).returncode == 0
    assert run_once(*args, env=once_env).returncode == 9


def test_namespaces_keep_jobs_apart(once_env: dict[str, str], ledger_url: str) -> None:
    for namespace in ("staging", "prod"):
        env = {**once_env, "ONCE_NAMESPACE": namespace}
        assert run_once("run", "--job", "sweep", "--every", "day", "--", "true",
                        env=env).returncode == 0
    jobs = sorted(j for (j,) in query(ledger_url, "SELECT job FROM once_runs"))
    assert jobs == ["prod:sweep", "staging:sweep"]


def test_fence_grows_across_periods_of_a_job(once_env: dict[str, str], ledger_url: str) -> None:
    for lag in (2, 1, 0):
        assert run_once("run", "--job", "lagged", "--every", "day", "--lag", str(lag), "--",
                        "true", env=once_env).returncode == 0
    rows = query(ledger_url, "SELECT period, fence FROM once_runs ORDER BY period")
    fences = [f for _, f in rows]
    assert fences == sorted(fences) and len(set(fences)) == 3


def test_jobs_table_keeps_the_schedule(once_env: dict[str, str], ledger_url: str) -> None:
    assert run_once("run", "--job", "kept", "--cron", "0 2 * * *", "--tz", "Asia/Kathmandu",
                    "--lag", "1", "--max-attempts", "5", "--", "true", env=once_env
                    ).returncode == 0
    row = query(ledger_url, "SELECT kind, schedule, tz, lag, max_attempts FROM once_jobs")
    assert row == [("cron", "0 2 * * *", "Asia/Kathmandu", 1, 5)]


def test_a_bad_value_is_not_mistaken_for_a_lost_race(once_env: dict[str, str],
                                                     ledger_url: str) -> None:
    # A row the database refuses (here a CHECK constraint; once's own input limits refuse
    # what would overflow a column before anything is sent): that is an error (exit 75,
    # nothing run), never "someone else holds it" (exit 0).
    if ledger_url.startswith("sqlite"):
        pytest.skip("the claim's statement differs; SQLite's refusal is tested elsewhere")
    assert run_once("run", "--job", "first", "--every", "day", "--", "true",
                    env=once_env).returncode == 0  # the tables exist from here on
    query(ledger_url, "ALTER TABLE once_runs ADD CONSTRAINT no_bad CHECK (job <> 'bad')")
    marker = Path(once_env["XDG_STATE_HOME"]) / "ran"
    result = run_once("run", "--job", "bad", "--every", "day", "--", "touch", str(marker),
                      env=once_env)
    assert result.returncode == 75, result.stderr
    assert result.stderr.startswith("once: ") and len(result.stderr.splitlines()) == 1
    assert not marker.exists()


def test_default_ledger_is_sqlite_under_xdg_state_home(once_env: dict[str, str],
                                                       tmp_path: Path) -> None:
    env = {k: v for k, v in once_env.items() if k != "ONCE_DATABASE_URL"}
    state = tmp_path / "xdg"
    env["XDG_STATE_HOME"] = str(state)
    assert run_once("run", "--job", "local", "--every", "day", "--", "true",
                    env=env).returncode == 0
    assert (state / "once" / "ledger.db").is_file()
    del env["XDG_STATE_HOME"]
    env["HOME"] = str(tmp_path / "home")
    assert run_once("run", "--job", "local", "--every", "day", "--", "true",
                    env=env).returncode == 0
    assert (tmp_path / "home" / ".local" / "state" / "once" / "ledger.db").is_file()


@pytest.mark.slow
def test_python_api_200_periods_16_claimers(ledger_url: str) -> None:
    from claimers import race_periods

    winners = race_periods(ledger_url, periods=200, claimers=16)
    assert winners == {i: 1 for i in range(200)}


def test_unreachable_ledger_exits_75_without_running(once_env: dict[str, str], tmp_path: Path,
                                                     ledger_url: str) -> None:
    marker = tmp_path / "ran"
    if ledger_url.startswith("sqlite"):
        bad = tmp_path / "corrupt.db"
        bad.write_bytes(b"this is not a database" * 100)
        before = bad.read_bytes()
        url = f"sqlite:///{bad}"
    elif ledger_url.startswith("postgresql"):
        url = "postgresql://app:secret@127.0.0.1:1/ops"
    else:
        url = "mariadb://app:secret@127.0.0.1:1/ops"
    env = {**once_env, "ONCE_DATABASE_URL": url}
    result = run_once("run", "--job", "x", "--every", "day", "--", "touch", str(marker), env=env)
    assert result.returncode == 75
    assert result.stderr.startswith("once: ")
    assert len(result.stderr.splitlines()) == 1
    assert "secret" not in result.stderr
    assert not marker.exists()
    if ledger_url.startswith("sqlite"):
        assert bad.read_bytes() == before


def test_once_schema_creates_and_reports(once_env: dict[str, str], ledger_url: str) -> None:
    result = run_once("schema", env=once_env)
    assert result.returncode == 0, result.stderr
    assert scalar(ledger_url, "SELECT value FROM once_meta WHERE name='schema_version'") == str(
        SCHEMA_VERSION)
    assert query(ledger_url, "SELECT count(*) FROM once_runs") == [(0,)]


def test_environment_variable_for_an_option(once_env: dict[str, str], ledger_url: str) -> None:
    env = {**once_env, "ONCE_RUN_MAX_ATTEMPTS": "7"}
    assert run_once("run", "--job", "envopt", "--every", "day", "--", "true",
                    env=env).returncode == 0
    assert query(ledger_url, "SELECT max_attempts FROM once_jobs") == [(7,)]



def test_log_format_json_one_object_per_decision(once_env: dict[str, str]) -> None:
    args = ["run", "--job", "logs", "--every", "day", "-v", "--log-format", "json", "--"]
    first = run_once(*args, "true", env=once_env)
    second = run_once(*args, "true", env=once_env)
    events = [json.loads(line) for r in (first, second) for line in r.stderr.splitlines()]
    assert [e["event"] for e in events] == ["claimed", "done", "skipped-done"]
    assert all(e["job"] == "logs" and e["period"] for e in events)
    assert events[0]["attempt"] == 1 and events[0]["fence"] >= 1


def test_quiet_logs_nothing_on_a_skip_with_attempts_left(once_env: dict[str, str]) -> None:
    args = ["run", "--job", "quiet", "--every", "day", "-q", "--"]
    assert run_once(*args, "true", env=once_env).stderr == ""
    assert run_once(*args, "true", env=once_env).stderr == ""

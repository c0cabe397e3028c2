"""What an operator sees on a terminal (issue 26, items 6 and 7): `once status` fitted to an
80- and a 160-column terminal, --wide, the plain table of a pipe; `once history` and `once
check` at 80 columns, saying what they leave out, and a lagging job's NEXT (issue 36, item
4); catch-up's progress on a terminal and in a pipe.

Real `once` processes on a pseudo-terminal of a set size (tests/procs.Terminal), on SQLite:
nothing here depends on the ledger's dialect.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from helpers import ONCE, run_once, wait_for
from procs import Terminal, start_once

pytestmark = pytest.mark.tables_made  # none is about a first use

sqlite_only = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)

NAMES = ("monthly-close-of-books", "nightly-invoices", "hourly-sync", "backup-eu-west-1")
OWNER = "batch-worker-eu-west-1c-7f9d8:48213"  # a pod name: long, as owners are


def day(n: int) -> str:
    return (datetime.now(UTC).date() + timedelta(days=n)).isoformat()


def hour(n: int) -> str:
    at = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) + timedelta(hours=n)
    return at.strftime("%Y-%m-%dT%H:00")


def once(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    result = run_once(*args, env=env, timeout=120)
    assert result.returncode not in (2, 69, 70, 75), result.stderr
    return result


def drawn(env: dict[str, str], columns: int, *args: str) -> tuple[list[str], int]:
    """`once ARGS` on a terminal `columns` wide: its lines without colour, its status."""
    plain = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    term = Terminal([ONCE, *args], {**plain, "TERM": "xterm-256color"}, columns=columns)
    status = term.wait(timeout=60)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", term.output.decode(errors="replace"))
    return [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")], status


@pytest.fixture
def fleet(once_env: dict[str, str], tmp_path: Path) -> Iterator[dict[str, str]]:
    """Done, missing, failed, running (a long owner) and stale jobs, long names among them."""
    env = once_env
    once(env, "catchup", "--job", NAMES[0], "--every", "day", "--since", day(-6), "--until",
         day(-3), "--", "true")
    once(env, "run", "--job", NAMES[1], "--every", "day", "--tz", "Europe/Berlin", "--",
         "sh", "-c", "echo 'error: disk full'; exit 3")
    once(env, "catchup", "--job", NAMES[2], "--every", "hour", "--since", hour(-5), "--until",
         hour(-1), "--", "true")
    stuck = start_once("run", "--job", NAMES[3], "--every", "day", "--stale-after", "1s", "--",
                       "sh", "-c", f"touch {tmp_path}/stuck; exec sleep 60", env=env)
    wait_for(lambda: (tmp_path / "stuck").exists(), what="the backup's claim")
    stuck.kill()  # its owner dies mid-run: the row goes stale, a --stale-after later
    stuck.wait()
    wait_for(lambda: json.loads(once(env, "status", "--json", NAMES[3]).stdout)[0][
        "current_state"] == "stale", what="the backup's row to go stale")
    running = start_once("run", "--job", NAMES[2], "--every", "hour", "--", "sh", "-c",
                         f"touch {tmp_path}/running; exec sleep 120",
                         env={**env, "ONCE_OWNER": OWNER})
    wait_for(lambda: (tmp_path / "running").exists(), what="the running sync")
    try:
        yield env
    finally:
        running.terminate()
        running.communicate(timeout=60)


@sqlite_only
def test_status_fits_an_80_column_terminal_without_splitting_a_name(
        fleet: dict[str, str]) -> None:
    lines, status = drawn(fleet, 80, "status")
    assert status == 0, lines
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    for name in NAMES:  # each job's row: one line, its whole name, the compact NEXT
        rows = [line for line in lines if line.startswith(name + " ")]
        assert len(rows) == 1, "\n".join(lines)
        assert re.search(r"\d\d(:|-)\d\d in \d+[smhd]", rows[0]), rows[0]
    table = lines[:next(i for i, line in enumerate(lines) if line.startswith("ledger:"))]
    assert not [line for line in table if line[:1].isalnum()
                and line.split()[0] not in (*NAMES, "JOB")], lines  # no wrapped row
    header = lines[0].split()
    assert header[0] == "JOB" and {"FAILED", "MISSING", "NOW", "NEXT"} <= set(header)
    assert "hidden at this width" in "\n".join(lines)  # and says what it left out
    backup = next(line for line in lines if line.startswith(NAMES[3]))
    assert "stale" in backup, "\n".join(lines)  # today's period: its owner died


@sqlite_only
def test_a_name_longer_than_the_terminal_is_cut_short_and_the_verdict_stays(
        once_env: dict[str, str]) -> None:
    long = "x" * 150
    for job in (long, "nightly"):
        once(once_env, "run", "--job", job, "--every", "day", "--", "true")
    lines, status = drawn(once_env, 80, "status")
    assert status == 0 and max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert {"JOB", "FAILED", "MISSING", "NOW", "NEXT"} <= set(lines[0].split())
    first = [line.split()[0] for line in lines[2:4]]
    assert first[0] == "nightly" and re.fullmatch(r"x{30,60}…", first[1]), first
    assert all(" done " in line for line in lines[2:4])


@sqlite_only
def test_status_on_a_160_column_terminal_keeps_every_row_on_one_line(
        fleet: dict[str, str]) -> None:
    lines, status = drawn(fleet, 160, "status")
    assert status == 0 and max(len(line) for line in lines) <= 160, "\n".join(lines)
    for name in NAMES:
        rows = [line for line in lines if line.startswith(name + " ")]
        assert len(rows) == 1 and re.search(r" in \d+[smhd]", rows[0]), (name, lines)
    sync = next(line for line in lines if line.startswith(NAMES[2]))
    assert OWNER in sync and "running" in sync  # the owner whole, the current hour running
    assert len(lines[0].split()) > 8  # more columns than at 80


@sqlite_only
def test_wide_draws_every_column_in_full_and_a_pipe_gets_them_all(
        fleet: dict[str, str]) -> None:
    lines, status = drawn(fleet, 80, "status", "--wide")
    assert status == 0
    headers = ["JOB", "SCHEDULE", "TZ", "LAST DONE", "FINISHED", "TOOK", "RUNNING", "FAILED",
               "MISSING", "NOW", "NEXT"]
    assert re.split(r"\s{2,}", lines[0].strip()) == headers, lines[0]
    assert any(f"{day(-3)}" in line for line in lines)  # whole keys, not 12-01
    piped = once(fleet, "status")
    plain = piped.stdout.splitlines()
    assert re.split(r"\s{2,}", plain[0]) == headers
    assert not re.search(r"\x1b", piped.stdout)
    sync = next(line for line in plain if line.startswith(NAMES[2]))
    assert f"{hour(0)}+00:00 running" in sync and f"{hour(1)}+00:00 in " in sync
    berlin = next(line for line in plain if line.startswith(NAMES[1]))
    assert "failed" in berlin.split("  ")[-2] or " failed " in berlin
    assert plain[-1].startswith("ledger: sqlite:")


# -- history and check at 80 columns (issue 36) ------------------------------------------------

BERLIN = "nightly-invoices-berlin"
SAID = ("error: relation \"orders_2026\" does not exist (SQLSTATE 42P01) while building the "
        "nightly invoices for the Berlin office")


@pytest.fixture
def berlin(once_env: dict[str, str]) -> dict[str, str]:
    """A Berlin job whose failure said a long last line (no attempts left) and an hourly job
    with --lag 1."""
    once(once_env, "catchup", "--job", BERLIN, "--every", "day", "--tz", "Europe/Berlin",
         "--since", day(-3), "--until", day(-2), "--", "true")
    once(once_env, "run", "--job", BERLIN, "--every", "day", "--tz", "Europe/Berlin",
         "--max-attempts", "1", "--", "sh", "-c", f"echo '{SAID}'; exit 3")
    once(once_env, "run", "--job", "hourly-lag", "--every", "hour", "--lag", "1", "--", "true")
    return once_env


@sqlite_only
def test_history_at_80_columns_names_what_it_hides_and_keeps_the_zone(
        berlin: dict[str, str]) -> None:
    lines, status = drawn(berlin, 80, "history", BERLIN)
    assert status == 0 and max(len(line) for line in lines) <= 80, "\n".join(lines)
    header = lines[1]
    assert "STARTED (Europe/Berlin)" in header, header  # the times' zone, not a bare STARTED
    shown = set(re.split(r"\s{2,}", header.strip()))
    hidden = next(line for line in lines if line.startswith("hidden at this width: "))
    named = hidden.removeprefix("hidden at this width: ").removesuffix(
        " (--wide shows them)").split(", ")
    every = {"PERIOD", "ATTEMPT", "FENCE", "OWNER", "STARTED", "FINISHED", "TOOK", "STATUS",
             "EXIT", "REASON", "LAST LINE"}
    assert {h.split(" (")[0] for h in shown} | set(named) == every, (header, hidden)
    assert "FENCE" in named  # what the new user missed, named
    failed = next(line for line in lines if " failed " in line)
    assert SAID not in failed and failed.endswith("…"), failed
    at = lines.index("LAST LINE cut at this width: --wide shows it whole; all an attempt said:")
    assert lines[at + 1] == f"  once logs {BERLIN} --period P --attempt N"
    wide, status = drawn(berlin, 80, "history", BERLIN, "--wide")
    assert status == 0 and re.split(r"\s{2,}", wide[1].strip()) == [
        "PERIOD", "ATTEMPT", "FENCE", "OWNER", "STARTED (Europe/Berlin)", "FINISHED", "TOOK",
        "STATUS", "EXIT", "REASON", "LAST LINE"]
    assert any(line.endswith(SAID) for line in wide), wide  # the whole line
    assert not [line for line in wide if line.startswith(("hidden", "LAST LINE cut"))]
    piped = once(berlin, "history", BERLIN).stdout  # a pipe: as it was
    assert re.split(r"\s{2,}", piped.splitlines()[0]) == re.split(r"\s{2,}", wide[1].strip())
    assert SAID in piped and "hidden" not in piped


@sqlite_only
def test_the_fleets_history_at_80_columns_keeps_its_utc(berlin: dict[str, str]) -> None:
    lines, status = drawn(berlin, 80, "history")
    assert status == 0 and max(len(line) for line in lines) <= 80, "\n".join(lines)
    assert "STARTED (UTC)" in lines[0], lines[0]
    assert any(line.startswith("LAST LINE cut at this width") for line in lines), lines
    assert "once logs JOB --period P --attempt N" in "\n".join(lines)


@sqlite_only
def test_check_at_80_columns_puts_a_findings_details_under_it(berlin: dict[str, str]) -> None:
    lines, status = drawn(berlin, 80, "check")
    assert status == 2 and max(len(line) for line in lines) <= 80, "\n".join(lines)
    lines = [line for line in lines if line]
    piped = run_once("check", env=berlin)
    assert piped.returncode == 2, piped.stderr
    findings = piped.stdout.splitlines()  # a pipe's: one line each, as ever
    out = next(line for line in findings if " failed-out " in line)
    assert re.fullmatch(rf"CRITICAL {BERLIN} \S+ failed-out \(attempt 1 of 1, exit 3, no "
                        r"attempts left\)", out) and len(out) > 80, out
    # On the terminal: each finding's head at the margin, its details indented under it,
    # the words those of the pipe's line.
    heads = [i for i, line in enumerate(lines) if not line.startswith(" ")]
    assert [lines[i].split()[0] for i in heads] == [f.split()[0] for f in findings]
    ends = [*heads[1:], len(lines)]
    assert [" ".join(part.strip() for part in lines[i:j])
            for i, j in zip(heads, ends, strict=True)] == findings
    at = lines.index(f"CRITICAL {BERLIN} {out.split()[2]} failed-out")
    assert lines[at + 1] == "    (attempt 1 of 1, exit 3, no attempts left)"


@sqlite_only
def test_a_lagging_jobs_next_reads_as_a_period_due_later(berlin: dict[str, str]) -> None:
    lines, status = drawn(berlin, 80, "status")
    assert status in (0, 2) and max(len(line) for line in lines) <= 80, "\n".join(lines)
    lag = next(line for line in lines if line.startswith("hourly-lag "))
    # Due within the hour: in minutes, or in seconds in its last minute (a run at :59).
    assert re.search(r"period \d\d:\d\d due in \d+[ms]$", lag), lag
    plain = next(line for line in once(berlin, "status").stdout.splitlines()
                 if line.startswith("hourly-lag "))
    assert re.search(rf"{hour(0)}\+00:00 in \d+[ms]$", plain), plain  # a pipe's, as ever


# -- catch-up's progress ---------------------------------------------------------------------

CHATTY = ["sh", "-c", 'echo "processing $ONCE_PERIOD"; sleep 0.2; echo "wrote 12 rows"']


@sqlite_only
def test_catch_up_on_a_terminal_draws_its_bar_between_the_commands_lines(
        once_env: dict[str, str]) -> None:
    lines, status = drawn(once_env, 80, "catchup", "--job", "backfill", "--every", "day",
                          "--since", day(-4), "--until", day(-1), "--", *CHATTY)
    assert status == 0, lines
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    for n in range(-4, 0):  # the command's lines, whole, each on a line of its own
        assert f"processing {day(n)}" in lines, "\n".join(lines)
    assert lines.count("wrote 12 rows") == 4
    bars = [line for line in lines if line.startswith("once: backfill ") and "/4" in line]
    assert [line.split()[2] for line in bars] == [day(n) for n in range(-4, 0)]
    assert "ETA" not in bars[0] and all(re.search(r"ETA \d", bar) for bar in bars[1:])
    # each bar is followed by its own period's output, not drawn into it
    for bar in bars:
        assert lines[lines.index(bar) + 1] == f"processing {bar.split()[2]}"
    assert re.fullmatch(r"once: caught up 4 periods of backfill in [\d.]+s: 4 done",
                        [line for line in lines if line][-1]), lines


@sqlite_only
def test_catch_up_in_a_pipe_names_the_job_and_sums_up(once_env: dict[str, str]) -> None:
    result = run_once("catchup", "--job", "backfill", "--every", "day", "--since", day(-3),
                      "--until", day(-1), "--keep-going", "--", "sh", "-c",
                      f'[ "$ONCE_PERIOD" != {day(-2)} ]', env=once_env)
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[:3] == [
        f"once: backfill {day(-3)}: done (exit 0, {lines[0].split(', ')[1]}",
        f"once: backfill {day(-2)}: failed (exit 1, {lines[1].split(', ')[1]}",
        f"once: backfill {day(-1)}: done (exit 0, {lines[2].split(', ')[1]}"]
    assert re.fullmatch(r"once: catch-up of backfill: 3 of 3 periods in [\d.]+s: 2 done, "
                        r"1 failed", lines[3]), lines
    # stopped at a failure: what was not tried is said too; -q says nothing but errors
    again = run_once("rerun", "--job", "backfill", "--period", day(-3), "--", "false",
                     env=once_env)
    assert again.returncode == 1
    result = run_once("catchup", "--job", "backfill", "--every", "day", "--since", day(-6),
                      "--until", day(-1), "--", "false", env=once_env)
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].startswith(
        "once: catch-up of backfill: 1 of 5 periods in ")
    assert result.stderr.splitlines()[-1].endswith(": 1 failed; 4 not tried")
    quiet = run_once("catchup", "-q", "--job", "other", "--every", "day", "--since", day(-2),
                     "--until", day(-1), "--", "true", env=once_env)
    assert quiet.returncode == 0 and quiet.stderr == ""

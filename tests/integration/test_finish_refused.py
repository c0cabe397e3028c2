"""A finish the ledger cannot take as given (issue 24), by real `once` processes on real
servers: a tail over MySQL's max_allowed_packet, or too slow for PostgreSQL's
statement_timeout, or outside an old table's charset, is cut to what fits and the result is
recorded; a write refused for good is said as such at once, never as "unreachable"; and a
period whose result can never be recorded is not run again for ever (records.attempt_cap).
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from conftest import Server
from helpers import ONCE, run_once, wait_for
from ledger_sql import query
from once.run.relay import lead_trimmed, text
from private_mariadb import PACKET, PrivateMariadb

TAIL = 1024 * 1024  # --output-tail 1MiB, the most it takes
NOTE = re.compile(r"\[once: (\d+) bytes cut from the start of this tail: (.*)\]")

# 1.1 MB of output, then an end the stored tail must keep. "mixed" holds what the statement
# escapes (quotes, backslashes, CR, NUL, ^Z, newlines), bytes that are not UTF-8 (each becomes
# U+FFFD: three bytes stored for one written), and characters of two to four bytes.
WRITERS = {
    "ascii": "import os\n"
             "for i in range(110000):\n"
             "    os.write(1, b'line %06d\\n' % i)\n"
             "os.write(1, b'the end\\n')\n",
    "mixed": "import os\n"
             "chunk = b'q\\'uo\"te \\\\ cr\\r nul\\0 z\\x1a bad\\xff\\xfe\\x80 ' + "
             "'é€😀'.encode() + b'\\n'\n"
             "for i in range(30000):\n"
             "    os.write(1 + i % 2, chunk)\n"
             "os.write(1, b'the end\\n')\n",
}


def once_env(url: str, tmp_path: Path) -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env.update(ONCE_DATABASE_URL=url, XDG_STATE_HOME=str(tmp_path / "state"))
    return env


def writer(tmp_path: Path, kind: str) -> list[str]:
    script = tmp_path / f"{kind}.py"
    script.write_text(WRITERS[kind])
    return [sys.executable, str(script)]


def run(env: dict[str, str], *args: str, job: str = "big") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([ONCE, "run", "--job", job, "--every", "day", *args], env=env,
                          capture_output=True, timeout=180)


def stored_tail(written: bytes, size: int = TAIL) -> str:
    """The tail as once keeps it before any cut: the last --output-tail bytes, as text."""
    return text(lead_trimmed(written[-size:]))


def escaped_size(value: str) -> int:
    """The bytes a text takes in a statement as PyMySQL writes it."""
    import pymysql

    return len(pymysql.converters.escape_string(value).encode())


def cut_of(output: str) -> tuple[int, str, str]:
    """(bytes cut, why, what was kept) of a cut tail."""
    note, newline, kept = output.partition("\n")
    found = NOTE.fullmatch(note)
    assert found and newline, output[:300]
    return int(found[1]), found[2], kept


# -- MariaDB: max_allowed_packet 1 MiB -----------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_a_tail_over_max_allowed_packet_is_cut_to_what_fits(
        private_mariadb: PrivateMariadb, tmp_path: Path, kind: str) -> None:
    url = private_mariadb.new_database()
    env = once_env(url, tmp_path)
    command = writer(tmp_path, kind)
    direct = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            timeout=60).stdout
    result = subprocess.run([ONCE, "run", "--job", "big", "--every", "day", "--output-tail",
                             "1MiB", "--", *command], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, timeout=180)
    assert result.returncode == 0, result.stdout[-2000:]
    assert result.stdout == direct  # relayed unchanged: one pipe for both, no once: line
    assert query(url, "SELECT status, attempt FROM once_runs") == [("done", 1)]
    [(outcome, output)] = query(url, "SELECT outcome, output FROM once_attempts")
    assert outcome == "done"
    cut, why, kept = cut_of(output)
    assert why == f"the server takes at most {PACKET} bytes a statement (max_allowed_packet)"
    whole = stored_tail(direct)
    assert whole.endswith(kept) and kept.endswith("the end\n")
    assert cut == len(whole.encode()) - len(kept.encode())
    # Cut to what fits, not more: the statement's packet is within a few hundred bytes of it.
    assert PACKET - 2048 < escaped_size(output) < PACKET
    again = run(env, "--output-tail", "1MiB", "--", *command)
    assert again.returncode == 0 and again.stdout == b"", again.stderr
    assert len(query(url, "SELECT attempt FROM once_attempts")) == 1  # done once


def test_mariadb_tables_are_utf8mb4_whatever_the_servers_default(
        private_mariadb: PrivateMariadb, tmp_path: Path) -> None:
    # The private server's default is latin1, which refused every other character.
    url = private_mariadb.new_database()
    done = run_once("schema", env=once_env(url, tmp_path))
    assert done.returncode == 0, done.stderr
    name = url.rsplit("/", 1)[1]
    charsets = query(url, "SELECT table_name, table_collation FROM information_schema.tables "
                          f"WHERE table_schema = '{name}'")
    # once_runs, once_attempts, once_jobs, once_meta and once lead's three tables.
    assert len(charsets) == 7 and all(c.startswith("utf8mb4") for _, c in charsets), charsets


def test_a_tail_an_old_latin1_table_cannot_hold_gives_way_to_the_result(
        private_mariadb: PrivateMariadb, tmp_path: Path) -> None:
    # A ledger made through mariadb:// on a latin1 server before the tables said utf8mb4:
    # U+FFFD (and any character outside latin1) is refused (1366) at any length.
    url = private_mariadb.new_database()
    env = once_env(url, tmp_path)
    assert run_once("schema", env=env).returncode == 0
    query(url, "ALTER TABLE once_attempts CONVERT TO CHARACTER SET latin1")
    line = b"caf\xc3\xa9 \xff\n"
    written = line * 9000
    command = [sys.executable, "-c", f"import os; os.write(1, {line!r} * 9000)"]
    began = time.monotonic()
    result = run(env, "--", *command)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - began < 20  # no retry until the deadline
    assert query(url, "SELECT status FROM once_runs") == [("done",)]
    [(outcome, output)] = query(url, "SELECT outcome, output FROM once_attempts")
    assert outcome == "done"
    cut, why, kept = cut_of(output)
    assert kept == "" and cut == len(stored_tail(written, 16 * 1024).encode())  # all of it
    assert why.startswith("the ledger refused it whole") and "1366" in why


# -- PostgreSQL: a statement timeout on a large row ----------------------------------------------


def test_a_tail_too_slow_to_write_before_statement_timeout_is_cut(
        backend: object, ledger_url: str, tmp_path: Path) -> None:
    if not ledger_url.startswith("postgresql") or "options=" not in ledger_url:
        pytest.skip("PostgreSQL's statement_timeout")
    # The session's statement_timeout, as a role or a URL may set it, and a row that takes
    # longer than it to write when it is large (a trigger stands for the slow disk).
    url = ledger_url.replace("options=", "options=" + quote("-cstatement_timeout=1000 "))
    env = once_env(url, tmp_path)
    assert run_once("schema", env=env).returncode == 0
    query(url, """
        CREATE FUNCTION slow_output() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF length(NEW.output) > 100000 THEN PERFORM pg_sleep(10); END IF;
            RETURN NEW;
        END $$""")
    query(url, "CREATE TRIGGER slow_output BEFORE UPDATE ON once_attempts FOR EACH ROW "
               "EXECUTE FUNCTION slow_output()")
    command = writer(tmp_path, "ascii")
    result = run(env, "--output-tail", "1MiB", "--", *command)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    assert query(url, "SELECT status FROM once_runs") == [("done",)]
    [(output,)] = query(url, "SELECT output FROM once_attempts")
    _, why, kept = cut_of(output)
    assert why == "the ledger refused it whole (canceling statement due to statement timeout)"
    assert kept.endswith("line 109999\nthe end\n")
    assert 16 * 1024 - 200 < len(output.encode()) <= 16 * 1024


def test_a_tail_a_latin1_database_cannot_hold_gives_way_to_the_result(
        backend: Server, tmp_path: Path) -> None:
    if backend.dialect != "postgresql" or backend.name == "pgbouncer":
        pytest.skip("a PostgreSQL database of its own encoding")
    # psycopg speaks the database's encoding: U+FFFD has no LATIN1 equivalent (with another
    # client_encoding, the server says so: 22P05).
    name = "once_t_" + uuid.uuid4().hex[:12]
    with backend.admin() as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' "
                     "TEMPLATE template0")
    try:
        url = urlsplit(backend.admin_url)._replace(path="/" + name).geturl()
        result = run(once_env(url, tmp_path), "--", sys.executable, "-c",
                     "import os; os.write(1, b'ok \\xff\\n')")
        assert result.returncode == 0, result.stderr
        assert query(url, "SELECT status FROM once_runs") == [("done",)]
        [(output,)] = query(url, "SELECT output FROM once_attempts")
        cut, why, kept = cut_of(output)
        assert kept == "" and cut == len("ok \ufffd\n".encode())
        assert why.startswith("the ledger refused it whole ('latin-1' codec can't encode")
    finally:
        with backend.admin() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


# -- every backend: a write refused for good -----------------------------------------------------

_REFUSE = {
    "sqlite": ["CREATE TRIGGER refuse_finish BEFORE UPDATE ON once_attempts "
               "WHEN NEW.status <> 'running' BEGIN SELECT RAISE(ABORT, 'no finish here'); END"],
    "postgresql": ["CREATE FUNCTION refuse_finish() RETURNS trigger LANGUAGE plpgsql AS $$ "
                   "BEGIN RAISE EXCEPTION 'no finish here'; END $$",
                   "CREATE TRIGGER refuse_finish BEFORE UPDATE ON once_attempts FOR EACH ROW "
                   "WHEN (NEW.status <> 'running') EXECUTE FUNCTION refuse_finish()"],
    "mysql": ["CREATE TRIGGER refuse_finish BEFORE UPDATE ON once_attempts FOR EACH ROW "
              "BEGIN IF NEW.status <> 'running' THEN SIGNAL SQLSTATE '45000' "
              "SET MESSAGE_TEXT = 'no finish here'; END IF; END"],
}


def test_a_result_refused_for_good_is_said_at_once_and_not_run_for_ever(
        once_env: dict[str, str], ledger_url: str, tmp_path: Path) -> None:
    from once.ledger import parse_url

    dialect = parse_url(ledger_url).dialect
    assert run_once("schema", env=once_env).returncode == 0
    for statement in _REFUSE[dialect]:
        query(ledger_url, statement)
    runs = tmp_path / "runs"
    args = ["run", "-v", "--job", "stuck", "--every", "day", "--max-attempts", "1",
            "--stale-after", "1s", "--", "sh", "-c", f"echo ran >> {runs}"]

    def fire() -> subprocess.CompletedProcess[str] | None:
        """A fire that does more than skip the live (or not yet stale) attempt."""
        done = run_once(*args, env=once_env)
        return None if "skipped: held by" in done.stderr else done

    for attempt in (1, 2, 3):  # 3 x --max-attempts 1: the most a period gets
        began = time.monotonic()
        refused = wait_for(fire, timeout=60, what=f"attempt {attempt}")
        assert refused.returncode == 75, refused.stderr
        assert time.monotonic() - began < 20  # at once: not at the deadline plus 30 s
        [line] = [ln for ln in refused.stderr.splitlines() if "not recorded" in ln]
        assert "the ledger refused the write" in line and "no finish here" in line
        assert "unreachable" not in line and f"attempt {attempt} of at most 3" in line
    capped = wait_for(fire, timeout=60, what="the claim that records the period failed")
    assert capped.returncode == 0, capped.stderr
    assert "attempt 3 went stale without a result" in capped.stderr
    assert "recorded failed, not run again" in capped.stderr
    assert runs.read_text() == "ran\n" * 3
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("failed", 3)]
    later = run_once(*args, env=once_env)
    assert later.returncode == 0 and "no attempts left" in later.stderr
    assert runs.read_text() == "ran\n" * 3
    # `once rerun` still takes it, once the ledger takes results again.
    query(ledger_url, "DROP TRIGGER refuse_finish" + (" ON once_attempts"
                                                       if dialect == "postgresql" else ""))
    period = query(ledger_url, "SELECT period FROM once_runs")[0][0]
    rerun = run_once("rerun", "--job", "stuck", "--period", str(period), "--reason", "fixed",
                     "--", "sh", "-c", f"echo ran >> {runs}", env=once_env)
    assert rerun.returncode == 0, rerun.stderr
    assert query(ledger_url, "SELECT status, attempt FROM once_runs") == [("done", 4)]

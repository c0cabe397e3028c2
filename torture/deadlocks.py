"""Scenario 3, MariaDB duplicate-key deadlocks: three sessions on one key, one rolls back.

Each round, for a fresh period:

1. session A (the torture, plain SQL) inserts the period's once_runs row in an open
   transaction (with a heartbeat a day old, as a dead owner would leave it), and in "heavy"
   rounds a few more rows, so that InnoDB prefers to roll back someone else;
2. sessions B and C are two real `once catchup` processes for that period, started at once:
   one locks the job's row and waits for A's key (the duplicate-key check), the other waits
   for the job's row;
3. A asks for the job's row (SELECT ... FOR UPDATE): a cycle, A <-> the first once. InnoDB
   rolls one back with ER_LOCK_DEADLOCK (1213): A, or the once session, which retries its
   claim;
4. A rolls back (or, one round in three, commits: its row then stands, stale, to be taken
   over).

The round holds when exactly one of B and C ran the command, both exited 0, and the ledger
shows the period done by that one (attempt 1 after a rollback, attempt 2 after a commit).
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from common import ONCE, Backend, Config, Proc, Row, base_env, histogram, status_word

APPEND = 'echo "$ONCE_PERIOD $ONCE_FENCE $$" >> "$TORTURE_LOG"'
DEADLOCK = 1213


def deadlocks(config: Config, backend: Backend, outdir: Path) -> Row:
    rounds = config.count(24, 4)
    row = Row("MariaDB duplicate-key deadlocks, 3 sessions")
    outdir.mkdir(parents=True, exist_ok=True)
    url = backend.new_ledger()
    log = outdir / "deadlocks.log"
    env = {**base_env(url, outdir), "TORTURE_LOG": str(log)}
    job = "deadlock"
    argv = [ONCE, "catchup", "--job", job, "--every", "day"]
    warm = Proc([*argv, "--since", "2000-01-01", "--until", "2000-01-01", "--", "true"], env,
                outdir, "warm")
    if warm.wait(120) != 0:
        row.fail(f"the warm-up claim failed: {warm.stderr()[-300:]}")
        return row
    victims: list[str] = []
    codes: list[str] = []
    before = _deadlock_count(backend)
    for r in range(rounds):
        day = datetime(2001, 1, 1, tzinfo=UTC) + timedelta(days=r)
        key = day.strftime("%Y-%m-%d")
        heavy, commit = r % 2 == 0, r % 3 == 2
        problems, victim, procs = _round(backend, url, job, key, day, heavy, commit,
                                         [*argv, "--since", key, "--until", key, "--",
                                          "sh", "-c", APPEND], env, outdir, log)
        victims.append(victim)
        codes += [status_word(p.returncode) for p in procs]
        row.judge(problems, f"round {r} ({key}, {'heavy' if heavy else 'light'}, "
                            f"{'commit' if commit else 'rollback'})")
    after = _deadlock_count(backend)
    row.note(f"deadlock victims: {histogram(victims)}")
    if before is not None and after is not None:
        row.note(f"InnoDB deadlocks counted by the server: {after - before}")
    row.note(f"once exits: {histogram(codes)}")
    return row


def _deadlock_count(backend: Backend) -> int | None:
    try:
        rows = backend.query(backend.admin_url,  # type: ignore[attr-defined]
                             "SHOW GLOBAL STATUS LIKE 'Innodb_deadlocks'")
        return int(rows[0][1])
    except Exception:
        return None


def _waiting(backend: Backend, url: str) -> int:
    """Statements of `once` in the ledger's database that are still running (waiting for a
    lock: nothing else takes long here). InnoDB's own view (innodb_trx) lags behind."""
    from urllib.parse import urlsplit

    database = urlsplit(url).path.lstrip("/")
    admin = backend.admin_url  # type: ignore[attr-defined]
    rows = backend.query(admin, """
        SELECT count(*) FROM information_schema.processlist
        WHERE db = %s AND command = 'Query' AND info LIKE 'INSERT INTO once%%'""",
                         (database,))
    return int(rows[0][0])


def _round(backend: Backend, url: str, job: str, key: str, day: datetime, heavy: bool,
           commit: bool, argv: list[str], env: dict[str, str], outdir: Path,
           log: Path) -> tuple[list[str], str, list[Proc]]:
    problems: list[str] = []
    victim = "none"
    start, end = day.replace(tzinfo=None), (day + timedelta(days=1)).replace(tzinfo=None)
    insert = """
        INSERT INTO once_runs (job, period, status, attempt, fence, owner, period_start,
                               period_end, started_at, heartbeat_at)
        VALUES (%s, %s, 'running', 1, 0, 'intruder', %s, %s,
                UTC_TIMESTAMP(6) - INTERVAL 1 DAY, UTC_TIMESTAMP(6) - INTERVAL 1 DAY)"""
    with backend.session(url, autocommit=False) as a:  # type: ignore[attr-defined]
        cur = a.cursor()
        cur.execute(insert, (job, key, start, end))
        if heavy:  # more rows changed: InnoDB rolls back the other side of the cycle
            for i in range(8):
                cur.execute(insert, (job, f"{key}~ballast{i}", start, end))
        procs = [Proc(argv, env, outdir, "dl") for _ in range(2)]
        deadline = time.monotonic() + 6
        while _waiting(backend, url) < 2 and time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            time.sleep(0.02)
        waiting = _waiting(backend, url)
        if waiting < 2:
            problems.append(f"only {waiting} once sessions were waiting for the key")
        outcome: list[BaseException] = []

        def lock_job() -> None:
            try:
                a.cursor().execute("SELECT fence FROM once_jobs WHERE job = %s FOR UPDATE",
                                   (job,))
            except BaseException as exc:
                outcome.append(exc)

        asker = threading.Thread(target=lock_job, daemon=True)
        asker.start()
        asker.join(6)
        if asker.is_alive():
            problems.append("session A's lock request neither deadlocked nor was granted")
        elif outcome:
            code = outcome[0].args[0] if outcome[0].args else None
            victim = "A (the outsider)" if code == DEADLOCK else f"A failed: {outcome[0]}"
        else:
            victim = "once (retried)"
        if heavy:
            cur = a.cursor()
            cur.execute("DELETE FROM once_runs WHERE job = %s AND period LIKE %s",
                        (job, f"{key}~ballast%"))
        if commit and not outcome:
            a.commit()
        else:
            a.rollback()
    for proc in procs:
        if proc.wait(60) is None:
            proc.kill()
            problems.append(f"{proc.name} hung")
    ran = [line for line in (log.read_text().splitlines() if log.exists() else [])
           if line.split()[0] == key]
    if len(ran) != 1:
        problems.append(f"the command ran {len(ran)} times")
    for proc in procs:
        if proc.returncode != 0:
            problems.append(f"{proc.name} {status_word(proc.returncode)}: "
                            f"{proc.stderr().strip()[-200:]}")
        if "Traceback" in proc.stderr():
            problems.append(f"traceback in {proc.name}")
    committed = commit and not outcome
    rows = backend.query(url, "SELECT status, attempt FROM once_runs WHERE job = %s AND "
                              "period = %s", (job, key))
    expected = [("done", 2 if committed else 1)]
    if rows != expected:
        problems.append(f"ledger {rows}, expected {expected}")
    return problems, victim, procs

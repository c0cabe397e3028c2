"""Ledgers that older releases of once made, for the mixed-version tests (test_versions.py):
one per release (tests/versions.py), each with the environment of a `once` on it, and plain
SQL over what they hold. Its fixture `ledgers` is registered by tests/conftest.py.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from child_log import day_key
from helpers import ONCE, wait_for
from ledger_sql import placeholders, query, scalar
from versions import Release

if TYPE_CHECKING:
    from conftest import Server

NEW = 5  # the schema version of the once under test
DAY = ["--every", "day"]


@dataclass
class Ledger:
    """One older release's ledger (made by it) and the environment of a `once` on it, with
    a directory of its own for the commands' log, pid files and flocks (child_log.RUNNER)."""

    release: Release
    url: str
    env: dict[str, str]
    procs: list[subprocess.Popen[str]] = field(default_factory=list)

    @property
    def schema(self) -> int:
        return self.release.schema

    @property
    def name(self) -> str:
        return self.release.name

    def old(self, *args: str) -> subprocess.Popen[str]:
        """The older release's `once ARGS`, started."""
        return self._start(self.release.once, args)

    def new(self, *args: str) -> subprocess.Popen[str]:
        """The current `once ARGS`, started."""
        return self._start(ONCE, args)

    def _start(self, once: str, args: tuple[str, ...]) -> subprocess.Popen[str]:
        proc = subprocess.Popen([once, *args], env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        self.procs.append(proc)
        return proc

    def pid(self, job: str, attempt: int = 1) -> int:
        """The pid of the job's command (attempt), once it has started."""
        path = Path(self.env["DIR"]) / f"pid.{job}.{attempt}"
        try:
            return int(wait_for(lambda: path.exists() and path.read_text().strip(),
                                timeout=90, what=f"{self.name}: {job}'s command"))
        except AssertionError as exc:
            raise AssertionError(f"{exc}; {self.said()}") from None

    def said(self) -> str:
        """What the processes that have ended said, for a failure's message."""
        ended = [(p.args[1:3], p.returncode, p.communicate()[1][-400:])
                 for p in self.procs if p.poll() is not None]
        return f"ended: {ended}" if ended else "none ended"

    def let_finish(self, job: str) -> None:
        """The job's held command (RUNNER hold) ends its work."""
        (Path(self.env["DIR"]) / f"release.{job}").touch()

    def kill_left(self) -> None:
        """A failed test leaves no owner behind (its guard kills the command)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)


@pytest.fixture
def ledgers(backend: Server, tmp_path: Path, releases: dict[int, Release],
            once_env: dict[str, str]) -> Iterator[dict[int, Ledger]]:
    """An empty ledger (no tables yet) for each older release, by its schema version."""
    made, names = {}, []
    for schema, release in releases.items():
        if backend.dialect == "sqlite":
            url = f"sqlite:///{tmp_path}/ledger-{schema}.db"
        else:
            url, name = backend.new_database()
            names.append(name)
        directory = tmp_path / f"schema-{schema}"
        directory.mkdir()
        env = {**once_env, "ONCE_DATABASE_URL": url, "LOG": str(directory / "children.log"),
               "DIR": str(directory)}
        made[schema] = Ledger(release, url, env)
    yield made
    for ledger in made.values():
        ledger.kill_left()
    for name in names:
        backend.drop(name)


def finish(*procs: subprocess.Popen[str], timeout: float = 120) -> list[tuple[int, str, str]]:
    """Wait for processes started together: (status, stdout, stderr) of each."""
    said = [p.communicate(timeout=timeout) for p in procs]
    return [(p.returncode, out, err) for p, (out, err) in zip(procs, said, strict=True)]


def today(days_ago: int = 0) -> str:
    return day_key(days_ago)


def refusal(schema: int, stderr: str) -> None:
    """An older once's one line on an upgraded ledger: both versions named."""
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert re.fullmatch(rf"once: the ledger's schema is version {NEW}, newer than this once "
                        rf"knows \({schema}\): upgrade once(; nothing was run)?", lines[0]), stderr


# -- what the ledger holds -------------------------------------------------------------------


def version(url: str) -> int:
    return int(scalar(url, "SELECT value FROM once_meta WHERE name = 'schema_version'"))


# once_runs without heartbeat_at, which a live owner renews; once_jobs as a whole (`SELECT *`
# reads it whatever its fire counter is called).
_SNAPSHOT = {
    "once_runs": "SELECT job, period, status, attempt, fence, owner, period_start, period_end, "
                 "started_at, finished_at, exit_code, stale_after FROM once_runs "
                 "ORDER BY job, period",
    "once_jobs": "SELECT * FROM once_jobs ORDER BY job",
    "once_attempts": "SELECT * FROM once_attempts ORDER BY job, period, attempt",
    "once_meta": "SELECT * FROM once_meta ORDER BY name",
}


def snapshot(url: str) -> dict[str, list[tuple[object, ...]]]:
    """Every row of every table but the renewals, for "nothing was written"."""
    return {table: query(url, sql) for table, sql in _SNAPSHOT.items()}


def row(url: str, job: str, *columns: str) -> tuple[object, ...]:
    """The job's once_runs row (the tests use one period per job)."""
    found = query(url, placeholders(f"SELECT {', '.join(columns)} FROM once_runs WHERE job = ?",
                                    url), (job,))
    assert len(found) == 1, found
    return found[0]


def attempts(url: str, job: str) -> list[tuple[object, ...]]:
    return query(url, placeholders("SELECT attempt, status FROM once_attempts WHERE job = ? "
                                   "ORDER BY attempt", url), (job,))


def heartbeat_age(url: str, job: str) -> float:
    """Seconds since the job's row was renewed, by the database's clock."""
    age = {"sqlite": "(julianday('now') - julianday(heartbeat_at)) * 86400.0",
           "postgresql": "extract(epoch from clock_timestamp() - heartbeat_at)",
           "mysql": "TIMESTAMPDIFF(MICROSECOND, heartbeat_at, UTC_TIMESTAMP(6)) / 1e6"}
    return float(row(url, job, age[_dialect(url)])[0])  # type: ignore[arg-type]


def age_heartbeat(url: str, job: str, seconds: int) -> None:
    """Move the row's last renewal `seconds` back: time passing, without the wait."""
    back = {"sqlite": f"strftime('%Y-%m-%d %H:%M:%f', heartbeat_at, '-{seconds} seconds') "
                      f"|| '000'",
            "postgresql": f"heartbeat_at - interval '{seconds} seconds'",
            "mysql": f"heartbeat_at - INTERVAL {seconds} SECOND"}
    query(url, placeholders(f"UPDATE once_runs SET heartbeat_at = {back[_dialect(url)]} "
                            f"WHERE job = ?", url), (job,))


def _dialect(url: str) -> str:
    if url.startswith("sqlite"):
        return "sqlite"
    return "postgresql" if url.startswith("postgres") else "mysql"

"""The hot path's rule, as a test: `once run` never imports SQLAlchemy, rich, the reports or
the other commands, whether it claims and runs the period or skips it (docs/contributing.md
"Layout")."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import run_once

# What only reports, table creation and the other commands need.
FORBIDDEN = ("sqlalchemy", "rich", "once.report", "once.cli.runs", "once.cli.reports",
             "once.cli.ledger_commands", "once.cli.lead", "once.gaps",
             "once.ledger.schema", "once.ledger.tables", "once.ledger.upgrade",
             "once.ledger.prune", "once.ledger.history",
             "once.ledger.fleet", "once.ledger.rows", "once.ledger.dbapi",
             "once.ledger.engines", "once.cli.progress", "once._docs", "once.serve", "http.server")
# Nor, on a skip against SQLite, what only a won claim, a ping, a host in the URL or a zone
# other than UTC needs (psycopg loads some of these itself): @dataclass compiles its methods
# on every import, zoneinfo loads sysconfig.
SKIP_FORBIDDEN = ("dataclasses", "urllib.parse", "ipaddress", "zoneinfo", "sysconfig",
                  "once.run.wrapper", "once.run.machine", "once.run.lease", "once.run.attempt",
                  "once.run.notify", "subprocess")

# Runs once's entry point like the installed script, and writes the modules it loaded.
_PROBE = ("import atexit, sys\n"
          "out = sys.argv.pop(1)\n"
          "atexit.register(lambda: open(out, 'w').write('\\n'.join(sorted(sys.modules))))\n"
          "from once.cli.main import main\n"
          "main(sys.argv[1:])\n")


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN)


def _modules(env: dict[str, str], tmp_path: Path, *args: str) -> set[str]:
    out = tmp_path / "modules"
    result = subprocess.run([sys.executable, "-c", _PROBE, str(out), *args], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return set(out.read_text().split())


@pytest.mark.parametrize("fire", ["claimed", "skipped"])
def test_once_run_imports_nothing_of_the_report_path(once_env: dict[str, str],
                                                     tmp_path: Path, fire: str) -> None:
    # The first use creates the tables (that needs SQLAlchemy, once per ledger).
    assert run_once("run", "--job", "hot", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    lag = "1" if fire == "claimed" else "0"
    loaded = _modules(once_env, tmp_path, "run", "--job", "hot", "--every", "day", "--lag",
                      lag, "--", "true")
    assert "once.run.flow" in loaded  # the probe saw a real run
    assert not [m for m in loaded if _forbidden(m)]
    assert "once.run.backfill" not in loaded  # catch-up's loop: only with --catchup
    # The output relay is imported only by a run that won its claim.
    assert ("once.run.relay" in loaded) == (fire == "claimed")
    if fire == "skipped" and once_env["ONCE_DATABASE_URL"].startswith("sqlite"):
        assert not loaded & set(SKIP_FORBIDDEN)


def test_once_run_catchup_finds_gaps_without_sqlalchemy(once_env: dict[str, str],
                                                        tmp_path: Path) -> None:
    # A gap behind the latest done day: --catchup finds it with once.gaps and plain SQL.
    for lag in ("4", "1"):
        assert run_once("run", "--job", "hot", "--every", "day", "--lag", lag, "--", "true",
                        env=once_env).returncode == 0
    out = tmp_path / "made-up"
    loaded = _modules(once_env, tmp_path, "run", "--job", "hot", "--every", "day",
                      "--catchup", "5", "--", "sh", "-c", f'echo "$ONCE_PERIOD" >> {out}')
    assert len(out.read_text().split()) == 3  # D-3, D-2 and today
    assert "once.gaps" in loaded  # stdlib and once.periods only: allowed with --catchup
    assert not [m for m in loaded if m != "once.gaps" and _forbidden(m)]

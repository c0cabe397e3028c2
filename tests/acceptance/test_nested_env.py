"""`once` inside `once`: nothing the outer run gives its command or hooks changes how a nested
`once` behaves (docs/reference/run.md "The command's environment"). The real command, on a
SQLite ledger (the environment does not depend on the backend)."""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path

import click
import pytest

from helpers import ONCE, run_once
from once.cli.main import cli, load_commands
from once.run.child import EXPORTED, LEAD_EXPORTED

SRC = Path(__file__).resolve().parents[2] / "src" / "once"

# Writes the ONCE_* variables it was given, as JSON, to the file argv[1] names.
LEAF = """\
import json, os, sys
seen = {k: v for k, v in os.environ.items() if k.startswith("ONCE_") and k != "ONCE_DATABASE_URL"}
with open(sys.argv[1], "w") as out:
    json.dump(seen, out)
"""

# Writes what the outer run gave it to LABEL.outer.json, then runs a nested `once run` of
# job LABEL, without --tz, whose command writes LABEL.inner.json. argv: LABEL ONCE LEAF.
NESTED = """\
import subprocess, sys
label, once, leaf = sys.argv[1:]
subprocess.check_call([sys.executable, leaf, label + ".outer.json"])
sys.exit(subprocess.call([once, "run", "--job", label, "--every", "day", "--",
                          sys.executable, leaf, label + ".inner.json"]))
"""


@pytest.fixture
def scripts(tmp_path: Path) -> tuple[str, str]:
    """The paths of LEAF and NESTED."""
    leaf, nested = tmp_path / "leaf.py", tmp_path / "nested.py"
    leaf.write_text(LEAF)
    nested.write_text(NESTED)
    return str(leaf), str(nested)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    environment["ONCE_DATABASE_URL"] = f"sqlite:///{tmp_path}/ledger.db"
    environment["XDG_STATE_HOME"] = str(tmp_path / "state")
    return environment


def far_zone() -> str:
    """A zone whose date differs from UTC's now, with at least an hour to spare."""
    return "Etc/GMT+12" if datetime.now(UTC).hour < 11 else "Etc/GMT-14"


def utc_days() -> set[str]:
    return {datetime.now(UTC).date().isoformat()}


def read(path: Path) -> dict[str, str]:
    return dict(json.loads(path.read_text()))


def test_once_in_a_command_and_a_hook_claims_the_period_of_its_own_zone(
        env: dict[str, str], tmp_path: Path, scripts: tuple[str, str]) -> None:
    leaf, nested = scripts
    days = utc_days()
    hook = shlex.join([sys.executable, nested, str(tmp_path / "hook"), ONCE, leaf])
    outer = run_once("run", "--job", "outer", "--every", "day", "--tz", far_zone(), "--state",
                     "--shards", "2", "--on-success", hook, "--",
                     sys.executable, nested, str(tmp_path / "cmd"), ONCE, leaf, env=env)
    assert outer.returncode == 0, outer.stderr
    days |= utc_days()
    given = {**read(tmp_path / "cmd.outer.json"), **read(tmp_path / "hook.outer.json")}
    assert set(given) == set(EXPORTED), "the test must see every variable once exports"
    assert given["ONCE_PERIOD"] not in days  # the outer run's day is another one
    for label in ("cmd", "hook"):
        inner = read(tmp_path / f"{label}.inner.json")
        assert inner["ONCE_PERIOD"] in days, (label, inner)
        assert inner["ONCE_PERIOD_TZ"] == "UTC" and inner["ONCE_JOB"] == str(tmp_path / label)
        assert inner["ONCE_ATTEMPT"] == "1"
        assert set(inner) == {"ONCE_JOB", "ONCE_PERIOD", "ONCE_PERIOD_START",
                              "ONCE_PERIOD_END", "ONCE_PERIOD_TZ", "ONCE_ATTEMPT",
                              "ONCE_FENCE"}, (label, inner)


def test_a_leader_s_term_reaches_a_nested_once_run_s_command(
        env: dict[str, str], tmp_path: Path, scripts: tuple[str, str]) -> None:
    # No `once` reads ONCE_LEAD or ONCE_TERM: a `once run` in front of a leader's job passes
    # them on, so that the job fences its writes by the term.
    leaf, nested = scripts
    outer = run_once("lead", "--name", "beat", "--", sys.executable, nested,
                     str(tmp_path / "led"), ONCE, leaf, env=env)
    assert outer.returncode == 0, outer.stderr
    given = read(tmp_path / "led.outer.json")
    assert set(given) == set(LEAD_EXPORTED) and given["ONCE_TERM"] == "1"
    inner = read(tmp_path / "led.inner.json")
    assert {k: inner[k] for k in LEAD_EXPORTED} == given
    assert inner["ONCE_ATTEMPT"] == "1"


@pytest.mark.parametrize("name", EXPORTED)
def test_an_exported_variable_left_by_an_outer_run_changes_nothing(
        name: str, env: dict[str, str], tmp_path: Path, scripts: tuple[str, str]) -> None:
    days = utc_days()
    left = {"ONCE_PERIOD_TZ": far_zone(), "ONCE_SHARDS": "7", "ONCE_SHARD": "3",
            "ONCE_ATTEMPT": "9", "ONCE_FENCE": "99"}.get(name, f"outer-{name}")
    out = tmp_path / "seen.json"
    result = run_once("run", "--job", "inner", "--every", "day", "--", sys.executable,
                      scripts[0], str(out), env={**env, name: left})
    assert result.returncode == 0, result.stderr
    days |= utc_days()
    seen = read(out)
    assert seen["ONCE_PERIOD"] in days and seen["ONCE_JOB"] == "inner"
    assert seen.get(name) != left, f"{name} of an outer run reached the command"


def read_variables() -> set[str]:
    """Every environment variable `once` reads: each option's (explicit, or click's
    ONCE_<COMMAND>_<OPTION>) and every ONCE_* name the source reads from os.environ."""
    names: set[str] = set()
    root = click.Context(cli, info_name="once", auto_envvar_prefix="ONCE")
    for command_name, command in load_commands().items():
        ctx = click.Context(command, info_name=command_name, parent=root)
        for param in command.params:
            if not isinstance(param, click.Option):
                continue
            if param.envvar:
                envvar = param.envvar
                names.update([envvar] if isinstance(envvar, str) else envvar)
            elif param.allow_from_autoenv and param.name and ctx.auto_envvar_prefix:
                names.add(f"{ctx.auto_envvar_prefix}_{param.name.upper()}")
    pattern = re.compile(r"""(?:environ(?:\.get)?[\[(]|getenv\()\s*["'](ONCE_\w+)["']""")
    for source in SRC.rglob("*.py"):
        names.update(pattern.findall(source.read_text()))
    return names


def test_no_exported_variable_is_one_once_reads() -> None:
    read = read_variables()
    assert {"ONCE_TZ", "ONCE_DATABASE_URL", "ONCE_OWNER", "ONCE_RUN_STALE_AFTER",
            "ONCE_DATABASE_URL_FILE"} <= read  # the collection works
    assert not read & set(EXPORTED)

"""Shell completion through the generated scripts in completions/, in bash, zsh and fish.

Each test sources the committed script in a real shell, asks it to complete a command line
(bash: its completion function with COMP_WORDS; zsh: its completion function with zsh's
`compadd` and `_describe` standing in as printers, since completion widgets need a terminal;
fish: `complete -C`), and reads the candidates. The script calls the installed `once`, whose
click completion answers from the ledger (job names), zoneinfo (--tz) and the --every specs.

A shell that is not installed skips its tests, unless ONCE_TEST_SHELLS=required (CI: .ci/run
installs zsh and fish and sets it).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

COMPLETIONS = Path(__file__).resolve().parents[2] / "completions"
JOBS = ("nightly", "night-owl", "hourly")


def shell(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    if os.environ.get("ONCE_TEST_SHELLS") == "required":
        pytest.fail(f"ONCE_TEST_SHELLS=required, but there is no {name}")
    pytest.skip(f"no {name} (Debian: apt-get install {name}; CI requires it)")


def bash(line: list[str], env: dict[str, str]) -> list[str]:
    words = " ".join(shlex.quote(word) for word in line)
    script = (f"source {COMPLETIONS / 'once.bash'}; COMP_WORDS=({words}); "
              f"COMP_CWORD={len(line) - 1}; _once_completion once; "
              'printf "%s\\n" "${COMPREPLY[@]}"')
    return _lines([shell("bash"), "--norc", "-c", script], env)


def zsh(line: list[str], env: dict[str, str]) -> list[str]:
    words = " ".join(shlex.quote(word) for word in line)
    script = ("compdef() { :; }; "  # compinit's, for the script's registration
              "compadd() { print -l -- ${(P)${@[-1]}}; }; "  # compadd ... -a ARRAY
              "_describe() { print -l -- ${${(P)${@[-2]}}%%:*}; }; "  # _describe ... ARRAY -U
              f"source {COMPLETIONS / '_once'}; words=({words}); CURRENT={len(line)}; "
              "_once_completion")
    return _lines([shell("zsh"), "-f", "-c", script], env)


def fish(line: list[str], env: dict[str, str]) -> list[str]:
    words = " ".join(shlex.quote(word) if word else "" for word in line)  # "" ends in a space
    script = f"source {COMPLETIONS / 'once.fish'}; complete -C {shlex.quote(words)}"
    # fish prints CANDIDATE<TAB>DESCRIPTION
    return [row.split("\t")[0] for row in _lines([shell("fish"), "-N", "-c", script], env)]


def _lines(argv: list[str], env: dict[str, str]) -> list[str]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return [row for row in done.stdout.splitlines() if row]


SHELLS: dict[str, Callable[[list[str], dict[str, str]], list[str]]] = {
    "bash": bash, "zsh": zsh, "fish": fish}


@pytest.fixture(scope="module")
def ledger_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The shells' environment: the installed `once` first on PATH, a SQLite ledger with
    JOBS in it."""
    home = tmp_path_factory.mktemp("completion")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / "state"),
               XDG_CONFIG_HOME=str(home / "config"), XDG_DATA_HOME=str(home / "data"),
               ONCE_DATABASE_URL=f"sqlite:///{home}/ledger.db",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for job in JOBS:
        done = subprocess.run(["once", "run", "--job", job, "--every", "day", "--", "true"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    return env


@pytest.mark.parametrize("name", sorted(SHELLS))
@pytest.mark.parametrize("command", ["status", "history", "check", "state"])
def test_the_job_argument_completes_job_names(name: str, command: str,
                                              ledger_env: dict[str, str]) -> None:
    assert sorted(SHELLS[name](["once", command, "nigh"], ledger_env)) == [
        "night-owl", "nightly"]
    assert sorted(SHELLS[name](["once", command, ""], ledger_env)) == sorted(JOBS)


@pytest.mark.parametrize("name", sorted(SHELLS))
def test_jobs_already_named_are_not_offered_again(name: str,
                                                  ledger_env: dict[str, str]) -> None:
    assert SHELLS[name](["once", "check", "nightly", "nigh"], ledger_env) == ["night-owl"]
    assert SHELLS[name](["once", "status", "hourly", "nightly", "night"], ledger_env) == [
        "night-owl"]


@pytest.mark.parametrize("name", sorted(SHELLS))
def test_tz_completes_zone_names(name: str, ledger_env: dict[str, str]) -> None:
    zones = SHELLS[name](["once", "run", "--tz", "Europe/Be"], ledger_env)
    assert "Europe/Berlin" in zones and "Europe/Belgrade" in zones, zones
    assert all(zone.startswith("Europe/Be") for zone in zones), zones
    for command in (["catchup"], ["periods"], ["state", "j"]):
        assert SHELLS[name](["once", *command, "--tz", "America/New_Y"], ledger_env) == [
            "America/New_York"]
    # Case does not matter: the zone is offered as it is spelt.
    assert SHELLS[name](["once", "run", "--tz", "asia/tok"], ledger_env) == ["Asia/Tokyo"]


@pytest.mark.parametrize("name", sorted(SHELLS))
def test_every_completes_period_specs(name: str, ledger_env: dict[str, str]) -> None:
    assert SHELLS[name](["once", "periods", "--every", "qu"], ledger_env) == ["quarter"]
    assert sorted(SHELLS[name](["once", "run", "--every", "1"], ledger_env)) == [
        "10m", "12h", "12m", "15m"]
    assert len(SHELLS[name](["once", "catchup", "--every", ""], ledger_env)) == 23


def test_every_offered_spec_and_zone_is_accepted() -> None:
    from once.cli.complete import zone_names
    from once.periods import every_specs
    from once.schedules import schedule

    for spec in every_specs(every_spelling=True):
        schedule(spec, None, "UTC")
    zones = zone_names(None, None, "")  # type: ignore[arg-type]
    assert len(zones) > 300
    for zone in zones:
        schedule("day", None, zone)


@pytest.fixture(scope="module")
def lead_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A ledger with the job `nightly` and the lead name `night-shift` (a real `once lead`),
    and a job and a lead name that a shell would read (never offered: the scripts insert what
    they are given as it is, and entering the line would run `touch`)."""
    home = tmp_path_factory.mktemp("lead-completion")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / "state"),
               ONCE_DATABASE_URL=f"sqlite:///{home}/ledger.db",
               PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for argv in (["run", "--job", "nightly", "--every", "day"],
                 ["run", "--job", "night;touch${IFS}pwned", "--every", "day"],
                 ["lead", "--name", "night-shift"], ["lead", "--name", "night$(touch${IFS}pwned)"]):
        done = subprocess.run(["once", *argv, "--", "true"], env=env, capture_output=True,
                              text=True, timeout=60)
        assert done.returncode == 0, done.stderr
    return env


@pytest.mark.parametrize("name", sorted(SHELLS))
def test_lead_names_complete_where_a_lead_name_is_taken(name: str,
                                                        lead_env: dict[str, str]) -> None:
    complete = SHELLS[name]
    assert complete(["once", "lead", "--name", "nigh"], lead_env) == ["night-shift"]
    assert complete(["once", "history", "--lead", "nigh"], lead_env) == ["night-shift"]
    assert complete(["once", "status", "--leads", "nigh"], lead_env) == ["night-shift"]
    for command in ("status", "check", "history"):  # a job's or a lead name
        assert sorted(complete(["once", command, "nigh"], lead_env)) == [
            "night-shift", "nightly"]
    for command in ("logs", "state"):  # a job's alone
        assert complete(["once", command, "nigh"], lead_env) == ["nightly"]

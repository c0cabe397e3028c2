"""Where no ledger is named (no --db, ONCE_DATABASE_URL or ONCE_DATABASE_URL_FILE): in a
Kubernetes pod or a container every command that opens a ledger refuses (exit 2, one line
naming ONCE_DATABASE_URL, nothing run, no file created), since the default SQLite file would
be the container's own and every pod would run the job; elsewhere the default's first use
says where it created it (not under -q).

Each "machine" is a HOME of its own and a root (`_ONCE_SYSTEM_ROOT`) holding the marks of a
container or none, so that the suite holds on a machine that is itself a container or a pod
(tests/conftest.py clears both for every other test).
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

import once
from helpers import ONCE, release_together, run_once

DAY = ("--every", "day")
POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
CONTAINER_MARKS = {
    "docker": (".dockerenv", ""),
    "podman": ("run/.containerenv", 'engine="podman-4.9.3"\n'),
    "cgroup v1": ("proc/1/cgroup", "12:pids:/kubepods/besteffort/pod1f2e/0a1b\n"
                                   "1:name=systemd:/kubepods/besteffort/pod1f2e/0a1b\n"),
}
REFUSED = "no ledger named in "
Result = subprocess.CompletedProcess[str]


class Machine:
    """A machine of its own: HOME, a root with or without a container's marks, no ledger
    named unless a test names one."""

    def __init__(self, base: Path, **extra: str) -> None:
        self.home = base / "home"
        self.root = base / "root"
        self.home.mkdir(parents=True)
        self.root.mkdir()
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith("ONCE_") and k not in ("XDG_STATE_HOME", "HOME")}
        self.env.update(HOME=str(self.home), _ONCE_SYSTEM_ROOT=str(self.root), **extra)
        self.marker = base / "ran"

    @property
    def ledger(self) -> Path:
        return self.home / ".local" / "state" / "once" / "ledger.db"

    def mark(self, path: str, content: str) -> None:
        (self.root / path).parent.mkdir(parents=True, exist_ok=True)
        (self.root / path).write_text(content)

    def once(self, *args: str, env: dict[str, str] | None = None) -> Result:
        return run_once(*args, env={**self.env, **(env or {})})

    def claiming(self) -> list[tuple[str, ...]]:
        """run, catchup and rerun, each of which would touch the marker."""
        touch = ("--", "touch", str(self.marker))
        return [("run", "--job", "bill", *DAY, *touch),
                ("catchup", "--job", "bill", *DAY, "--since", "2026-01-01", *touch),
                ("rerun", "--job", "bill", "--period", "2026-01-01", *touch)]


@pytest.fixture
def machine(tmp_path: Path) -> Callable[..., Machine]:
    count = iter(range(100))
    return lambda **extra: Machine(tmp_path / f"m{next(count)}", **extra)


def refused(result: Result, where: str) -> None:
    """Exit 2, and one `once:` line that says where and names ONCE_DATABASE_URL."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("once: " + REFUSED + where), lines
    assert "ONCE_DATABASE_URL" in lines[0] and "--db" in lines[0], lines


# -- refused ---------------------------------------------------------------------------------


def test_two_pods_without_a_ledger_named_bill_nobody(machine: Callable[..., Machine]) -> None:
    # The deployment's finding: two pods, each its own HOME, the CronJob's env block missing.
    for pod in (machine(**POD), machine(**POD)):
        for command in pod.claiming():
            refused(pod.once(*command), "a Kubernetes pod (KUBERNETES_SERVICE_HOST is set)")
        assert not pod.marker.exists()
        assert not (pod.home / ".local").exists()  # no ledger, not even its directory


@pytest.mark.parametrize("runtime", sorted(CONTAINER_MARKS))
def test_a_container_without_a_ledger_named_runs_nothing(machine: Callable[..., Machine],
                                                         runtime: str) -> None:
    box = machine()
    box.mark(*CONTAINER_MARKS[runtime])
    shown = {"docker": "a container (/.dockerenv exists)",
             "podman": "a container (/run/.containerenv exists)",
             "cgroup v1": "a container (/proc/1/cgroup names kubepods)"}[runtime]
    for command in box.claiming():
        refused(box.once(*command), shown)
    assert not box.marker.exists() and not (box.home / ".local").exists()


def test_an_empty_url_names_no_ledger(machine: Callable[..., Machine]) -> None:
    # A Secret whose key is empty: ONCE_DATABASE_URL set, but to nothing.
    pod = machine(**POD, ONCE_DATABASE_URL="")
    refused(pod.once(*pod.claiming()[0]), "a Kubernetes pod")
    assert not pod.marker.exists()


@pytest.mark.slow
def test_reports_and_the_other_commands_refuse_too(machine: Callable[..., Machine]) -> None:
    # A report of the pod's own ledger would show an empty fleet (once serve's /healthz: ok)
    # and hide the missing env block: every command that opens a ledger says it instead.
    pod = machine(**POD)
    for command in (("status",), ("status", "--timeline"), ("check",), ("history", "bill"),
                    ("logs", "bill"), ("metrics",), ("state", "bill"),
                    ("state", "bill", "--set", "x", *DAY), ("schema",),
                    ("prune", "--older-than", "90d"), ("doctor",),
                    ("serve", "--listen", "127.0.0.1:0")):
        refused(pod.once(*command), "a Kubernetes pod")
    assert not (pod.home / ".local").exists()
    # The DDL touches no ledger: printed for the default's dialect, SQLite.
    ddl = pod.once("schema", "--sql")
    assert ddl.returncode == 0 and "CREATE TABLE" in ddl.stdout, ddl.stderr


def test_a_machine_that_is_no_container_keeps_its_default(
        machine: Callable[..., Machine]) -> None:
    # A cgroup v2 PID 1 (0::/) shows nothing: the default ledger, as before.
    host = machine()
    host.mark("proc/1/cgroup", "0::/init.scope\n")
    result = host.once(*host.claiming()[0])
    assert result.returncode == 0, result.stderr
    assert host.marker.exists() and host.ledger.is_file()


# -- named on purpose ------------------------------------------------------------------------


def test_a_ledger_named_in_a_pod_is_used(once_env: dict[str, str], ledger_url: str,
                                         tmp_path: Path) -> None:
    # On every backend: ONCE_DATABASE_URL (the CronJob's Secret) in a pod that is also a
    # Docker container.
    root = tmp_path / "root"
    root.mkdir()
    (root / ".dockerenv").touch()
    env = {**once_env, **POD, "_ONCE_SYSTEM_ROOT": str(root)}
    marker = tmp_path / "ran"
    result = run_once("run", "--job", "bill", *DAY, "--", "touch", str(marker), env=env)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert marker.exists()
    skipped = run_once("run", "--job", "bill", *DAY, "--", "false", env=env)
    assert skipped.returncode == 0, skipped.stderr  # the shared ledger has it done
    listed = run_once("status", "--json", env=env)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["job"] == "bill"


def test_a_local_ledger_named_on_purpose_is_the_user_s_choice(
        machine: Callable[..., Machine], tmp_path: Path) -> None:
    pod = machine(**POD)
    volume = tmp_path / "volume"
    volume.mkdir()
    url_file = tmp_path / "url"
    url_file.write_text(f"sqlite:///{volume}/by-file.db\n")
    named = [({}, ("--db", f"sqlite:///{volume}/by-option.db")),
             ({"ONCE_DATABASE_URL": f"sqlite:///{volume}/by-variable.db"}, ()),
             ({"ONCE_DATABASE_URL_FILE": str(url_file)}, ())]
    for env, option in named:
        pod.marker.unlink(missing_ok=True)
        result = pod.once("run", "--job", "bill", *DAY, *option, "--", "touch",
                          str(pod.marker), env=env)
        assert result.returncode == 0 and result.stderr == "", result.stderr
        assert pod.marker.exists()
    assert sorted(p.name for p in volume.glob("*.db")) == [
        "by-file.db", "by-option.db", "by-variable.db"]
    # Even the default's own path, named: no notice either way, and it is used.
    default = pod.once("run", "--job", "bill", *DAY, "--db", f"sqlite:///{pod.ledger}", "--",
                       "true")
    assert default.returncode == 0 and pod.ledger.is_file(), default.stderr


# -- the first use of the default, said ------------------------------------------------------


@pytest.mark.slow
def test_the_default_s_first_use_is_said_once(machine: Callable[..., Machine]) -> None:
    host = machine()
    first = host.once("run", "--job", "bill", *DAY, "--", "true")
    assert first.returncode == 0, first.stderr
    assert first.stderr.splitlines() == [
        f"once: created the ledger {host.ledger}: no --db, ONCE_DATABASE_URL or "
        f"ONCE_DATABASE_URL_FILE named one, so it is this machine's own"]
    assert (os.stat(host.ledger).st_mode & 0o777) == 0o600
    for command in [*host.claiming()[:2], ("status",), ("schema",)]:
        again = host.once(*command)
        assert "created the ledger" not in again.stderr, again.stderr


def test_the_notice_is_not_said_under_quiet_and_is_json_with_log_format(
        machine: Callable[..., Machine]) -> None:
    quiet = machine()
    result = quiet.once("run", "-q", "--job", "bill", *DAY, "--", "true")
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert quiet.ledger.is_file()
    logged = machine()
    result = logged.once("catchup", "--job", "bill", *DAY, "--since", "2026-01-01",
                         "--log-format", "json", "--dry-run")
    assert result.returncode == 0, result.stderr
    (record,) = [json.loads(line) for line in result.stderr.splitlines()]
    assert record["event"] == "ledger-created" and str(logged.ledger) in record["message"]
    schema = machine()
    made = schema.once("schema")
    assert made.returncode == 0 and made.stderr.startswith(
        f"once: created the ledger {schema.ledger}:"), made.stderr


@pytest.mark.slow
def test_of_many_first_uses_at_once_one_says_it(machine: Callable[..., Machine],
                                                tmp_path: Path) -> None:
    host = machine()
    results = release_together([(ONCE, "run", "--job", f"j{i}", *DAY, "--", "true")
                                for i in range(8)], tmp_path / "gate", host.env)
    assert [r.returncode for r in results] == [0] * 8, [r.stderr for r in results]
    notices = [r.stderr for r in results if "created the ledger" in r.stderr]
    assert len(notices) == 1, [r.stderr for r in results]


# -- the Python API --------------------------------------------------------------------------


def test_the_python_api_refuses_too_and_takes_a_named_ledger(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    with pytest.raises(once.InputError) as caught, once.claim("bill", every="day"):
        pytest.fail("claimed without a ledger")
    message = str(caught.value)
    assert message.startswith(REFUSED + "a Kubernetes pod") and "db=" in message, message
    assert not (tmp_path / "home").exists()
    with once.claim("bill", every="day", db=f"sqlite:///{tmp_path}/named.db") as run:
        assert run.won


# -- the README's first run, in a container ----------------------------------------------------


def _readme_first_run() -> list[list[str]]:
    """The `once ...` lines of the README's first code block under "Install and run"."""
    import shlex

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("## Install and run", 1)[1].split("\n\n    ", 1)[1].split("\n\n")[0]
    lines = [line.strip().split("#")[0] for line in block.splitlines()]
    return [shlex.split(line) for line in lines if line.startswith("once ")]


def _minute() -> str:
    from datetime import UTC, datetime

    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M")


@pytest.mark.parametrize("kind", ["docker", "pod", "none"])
def test_the_readme_s_first_run_works_in_a_container(machine: Callable[..., Machine],
                                                    tmp_path: Path, kind: str) -> None:
    commands = _readme_first_run()
    assert len(commands) == 2, commands
    where = machine(**POD) if kind == "pod" else machine()
    if kind == "docker":
        where.mark(".dockerenv", "")
    for attempt in range(3):
        # The README's job is a minute's: two fires that straddle a minute's end (a loaded
        # machine) claim two periods and both run. Tried again in a fresh directory then.
        workdir = tmp_path / f"work-{kind}-{attempt}"
        workdir.mkdir()
        began = _minute()
        first, second = (subprocess.run([ONCE, *argv[1:]], env=where.env, cwd=workdir,
                                        capture_output=True, text=True, timeout=60)
                         for argv in commands)
        if _minute() == began:
            break
    assert first.returncode == 0 and first.stdout == "hello\n", first.stderr
    assert second.returncode == 0 and second.stdout == "", second.stderr  # skipped
    assert (workdir / "once.db").is_file()


@pytest.mark.parametrize("path", ["./x.db", "x.sqlite", "sub/../y.db"])
def test_a_plain_path_names_a_sqlite_file(machine: Callable[..., Machine], tmp_path: Path,
                                           path: str) -> None:
    pod = machine(**POD)
    workdir = tmp_path / "work"
    (workdir / "sub").mkdir(parents=True)
    done = subprocess.run([ONCE, "run", "--db", path, "--job", "bill", *DAY, "--", "true"],
                          env=pod.env, cwd=workdir, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (workdir / os.path.normpath(path)).is_file()


@pytest.mark.parametrize(("value", "says"), [
    ("DIR", "a directory, not a SQLite file; name a file in it"),
    ("host=h password=hunter2 dbname=x", "expected a file's path (./once.db)"),
    ("postgres:/h/db", "it has no '://'"),
])
def test_what_is_no_ledger_is_exit_2_naming_why(machine: Callable[..., Machine],
                                                tmp_path: Path, value: str, says: str) -> None:
    value = str(tmp_path) if value == "DIR" else value
    done = machine().once("run", "--db", value, "--job", "bill", *DAY, "--", "true")
    assert done.returncode == 2, done.stderr
    assert len(done.stderr.splitlines()) == 1 and says in done.stderr, done.stderr
    assert "hunter2" not in done.stderr

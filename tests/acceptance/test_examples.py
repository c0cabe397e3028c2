"""The examples in examples/ use only options that exist, and the backfill walkthrough runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml_free_cronjob as k8s

from once.cli import cli, load_commands

load_commands()  # every command, not only `run`

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def once_invocations() -> list[tuple[str, list[str]]]:
    """Every `once …` command line written in the examples, split as the shell would."""
    found: list[tuple[str, list[str]]] = []
    for path in sorted(EXAMPLES.rglob("*")):
        if not path.is_file() or path.name in ("Dockerfile", "cronjob.yaml", "serve.yaml"):
            continue
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0] if path.suffix != ".service" else line
            for piece in re.split(r"\|\||&&|[|>;]", line):
                words = shlex.split(piece.replace("ExecStart=", ""))
                for i, word in enumerate(words[:-1]):
                    if word.endswith("once") and words[i + 1] in cli.commands:
                        found.append((f"{path.name}: {piece.strip()}", words[i + 1:]))
                        break
    for name in ("cronjob.yaml", "serve.yaml"):
        found.append((name, k8s.command(EXAMPLES / "kubernetes" / name)[1:]))
    return found


@pytest.mark.parametrize(("where", "args"), once_invocations(), ids=lambda v: str(v)[:60])
def test_every_example_parses(where: str, args: list[str]) -> None:
    command = cli.commands[args[0]]
    with command.make_context(args[0], list(args[1:])) as ctx:  # raises on a bad option
        assert ctx.params is not None, where


def test_examples_cover_cron_kubernetes_systemd_and_backfill() -> None:
    names = {p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*") if p.is_file()}
    assert {"crontab", "kubernetes/cronjob.yaml", "kubernetes/Dockerfile",
            "systemd/nightly-report.service", "systemd/nightly-report.timer",
            "backfill.sh"} <= names
    assert "Persistent=true" in (EXAMPLES / "systemd" / "nightly-report.timer").read_text()
    manifest = (EXAMPLES / "kubernetes" / "cronjob.yaml").read_text()
    assert "concurrencyPolicy: Forbid" in manifest and "ONCE_OWNER" in manifest
    assert "secretKeyRef" in manifest and "terminationGracePeriodSeconds" in manifest


def test_backfill_walkthrough_runs(tmp_path: Path) -> None:
    script = (EXAMPLES / "backfill.sh").read_text().replace("/opt/reports/daily.sh", "true")
    (tmp_path / "backfill.sh").write_text(script)
    bin_dir = Path(os.environ.get("VIRTUAL_ENV", "")) / "bin"
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path),
           "PATH": f"{bin_dir}:{Path(__import__('sys').executable).parent}:{os.environ['PATH']}"}
    env.pop("ONCE_DATABASE_URL", None)
    done = subprocess.run(["sh", str(tmp_path / "backfill.sh")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "late bank file" in done.stdout
    assert done.stdout.count("2026-11-0") >= 7


def test_the_serve_manifest_reads_the_cronjobs_ledger_secret() -> None:
    serve = (EXAMPLES / "kubernetes" / "serve.yaml").read_text()
    cronjob = (EXAMPLES / "kubernetes" / "cronjob.yaml").read_text()
    assert k8s.command(EXAMPLES / "kubernetes" / "serve.yaml")[:2] == ["once", "serve"]
    for kind in ("kind: Deployment", "kind: Service", "kind: ServiceMonitor"):
        assert kind in serve
    secret = "secretKeyRef:\n                  name: once-ledger\n                  key: url"
    assert "name: once-ledger" in cronjob and secret in serve
    assert "path: /healthz" in serve and "path: /metrics" in serve

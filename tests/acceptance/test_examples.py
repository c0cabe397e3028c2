"""The examples in examples/ use only options that exist, and the backfill walkthrough runs."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest
import yaml_free_cronjob as k8s

from once._docs import prose
from once.cli.main import cli, load_commands

load_commands()  # every command, not only `run`

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
README = EXAMPLES.parent / "README.md"
DOCS = EXAMPLES.parent / "docs"


def markdown_pages() -> list[Path]:
    """The README and every page of the docs site written by hand or generated."""
    return [README, *sorted(DOCS.rglob("*.md"))]


def code_blocks(path: Path) -> list[tuple[int, list[str]]]:
    """(last line, lines) of each literal block of a page: indented by four spaces (as the
    README and the pages moved from it write them) or fenced with ```."""
    found: list[tuple[int, list[str]]] = []
    block: list[str] = []
    fenced = False
    for n, line in enumerate([*path.read_text().splitlines(), "end"], 1):
        if line.startswith("```"):
            if fenced:
                found.append((n, block))
                block = []
            fenced = not fenced
            continue
        if fenced:
            block.append(line)
            continue
        if line.startswith("    ") or (block and not line.strip()):
            block.append(line[4:])
            continue
        if block:
            found.append((n - 1, block))
        block = []
    return found


def once_invocations() -> list[tuple[str, list[str]]]:
    """Every `once …` command line written in the examples, split as the shell would."""
    found: list[tuple[str, list[str]]] = []
    for path in sorted(EXAMPLES.rglob("*")):
        if not path.is_file() or path.name in ("Dockerfile", *MANIFESTS):
            continue
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0] if path.suffix != ".service" else line
            for piece in re.split(r"\|\||&&|[|>;]", line):
                words = shlex.split(piece.replace("ExecStart=", ""))
                for i, word in enumerate(words[:-1]):
                    if word.endswith("once") and words[i + 1] in cli.commands:
                        found.append((f"{path.name}: {piece.strip()}", words[i + 1:]))
                        break
    for name in MANIFESTS:
        found.append((name, k8s.command(EXAMPLES / "kubernetes" / name)[1:]))
    return found


# Kubernetes manifests: their command is a YAML list, read by yaml_free_cronjob.
MANIFESTS = ("cronjob.yaml", "serve.yaml", "leader.yaml")


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


def test_every_leader_example_keeps_its_promise_and_has_time_to_stop() -> None:
    """`once lead`'s settings fit (its own check, run before anything is sent), and the
    supervisor waits longer than --kill-after after its SIGTERM: once forwards it, kills the
    command --kill-after later, then releases the lease."""
    from once.run.lead import kill_after_for, lease_problem

    leads = [(where, args) for where, args in once_invocations() if args[0] == "lead"]
    where_of = {where.split(":")[0] for where, _ in leads}
    assert where_of >= {"leader.yaml", "scheduler.service", "compose.yaml"}, where_of
    waits = {
        "leader.yaml": r"terminationGracePeriodSeconds: (\d+)",
        "scheduler.service": r"TimeoutStopSec=(\d+)",
        "compose.yaml": r"stop_grace_period: (\d+)s",
    }
    for where, args in leads:
        command = cli.commands["lead"]
        with command.make_context("lead", list(args[1:])) as ctx:
            lease = ctx.params["lease"]
            kill_after = ctx.params["kill_after"]
        assert lease_problem(lease, kill_after) == "", where
        name = where.split(":")[0]
        text = next(p for p in EXAMPLES.rglob(name)).read_text()
        match = re.search(waits[name], text)
        assert match, (where, "no stop timeout")
        assert int(match.group(1)) >= kill_after_for(lease, kill_after) + 10, where


# -- crontabs as cron runs them ----------------------------------------------------------------

CRON_LINE = re.compile(r"^(?:[\d*/,-]+\s+){5}(?P<command>.*)$")
CRON_PATH = "/usr/bin:/bin"  # Debian cron's


def crontabs() -> list[tuple[str, list[str]]]:
    """(where, lines) of every crontab shown: examples/crontab, each code block of the README
    and of the docs site, and each man page example holding a cron line."""
    found = [("examples/crontab", (EXAMPLES / "crontab").read_text().splitlines())]
    for path in markdown_pages():
        for n, block in code_blocks(path):
            if any(CRON_LINE.match(row) for row in block):
                where = path.relative_to(EXAMPLES.parent)
                found.append((f"{where}, the block ending at line {n}", block))
    for n, (_text, example) in enumerate(prose.EXAMPLES, 1):
        if any(CRON_LINE.match(row) for row in example.splitlines()):
            found.append((f"man page example {n}", example.splitlines()))
    return found


def test_every_crontab_finds_once_and_its_commands_under_cron() -> None:
    """Cron's PATH is /usr/bin:/bin and its working directory $HOME: a bare `once` needs a
    PATH= line naming where pip puts it, and a relative command is not found. A `%` on a
    command line is a newline to cron."""
    shown = crontabs()
    assert len(shown) >= 8, [where for where, _ in shown]
    for where, lines in shown:
        path = CRON_PATH
        for line in lines:
            if line.startswith("PATH="):
                path = line.partition("=")[2]
            match = CRON_LINE.match(line)
            if not match:
                continue
            command = match.group("command")
            if re.search(r"(?:^|[\s(;|&])once\s", command):  # a bare once, $(once ...) too
                assert "/usr/local/bin" in path.split(":"), (where, line)
            words = shlex.split(command.replace("\\%", "%"))
            for i, word in enumerate(words):
                if word == "--" and i + 1 < len(words):
                    assert words[i + 1].startswith(("/", "$HOME/")), (where, line)
            assert "%" not in command.replace("\\%", ""), (where, line)


def test_the_every_few_minutes_idiom_is_quiet_under_cron() -> None:
    """A failed-out day warns on every fire: without -q, cron mails it every five minutes."""
    for where, lines in crontabs():
        for line in lines:
            match = CRON_LINE.match(line)
            if match and line.startswith("*/") and "once run" in line and "--every day" in line:
                assert " -q " in match.group("command"), (where, line)


# -- the pages' command lines ------------------------------------------------------------------

PROMPT = re.compile(r"^(?:\$ )?(?:[A-Z_]+=\S+ )*once (\S+)")


def page_commands() -> list[tuple[str, list[str]]]:
    """Every `once COMMAND ...` line of a code block in the README and the docs (a `$ `
    prompt, `NAME=value` prefixes and `\\` continuations allowed), split as the shell would;
    lines with a placeholder (`[...]`, `<...>`, `…`, `|` alternatives, an option's value in
    one capital letter: `--period P`) are synopses, not examples."""
    found = []
    for path in markdown_pages():
        for n, block in code_blocks(path):
            text = "\n".join(block).replace("\\\n", " ")
            for row in text.splitlines():
                cron = CRON_LINE.match(row)
                row = cron.group("command") if cron else row
                row = re.sub(r"^(?:out=\$\(|sleep \$\S+ && |flock \S+ )", "", row.strip())
                match = PROMPT.match(row.strip())
                if not match or match.group(1) not in cli.commands:
                    continue
                if re.search(r"\[|\]|<[A-Za-z]|…|\.\.\.|\bSPEC\b|\bJOB\b|\bURL\b|"
                             r"\s--[a-z-]+ [A-Z]\b", row):  # --period P: a placeholder too
                    continue
                row = re.sub(r"\)(?=\s*(\|\||&&|;|$))", "", row)  # the end of a $(...)
                row = re.sub(r"\s[12]?>\s*\S+", "", row)  # redirections
                words = shlex.split(row.strip().removeprefix("$ "), comments=True)
                words = words[next(i for i, w in enumerate(words) if w == "once") + 1:]
                for stop in ("||", "&&", ";", "|"):
                    if stop in words:
                        words = words[: words.index(stop)]
                words = [w for w in words if not w.startswith((">", "2>"))]
                found.append((f"{path.relative_to(EXAMPLES.parent)}:{n}: {row.strip()}", words))
    return found


def test_the_pages_show_commands() -> None:
    assert len(page_commands()) >= 25
    assert len(transcripts()) >= 1


@pytest.mark.parametrize(("where", "args"), page_commands(), ids=lambda v: str(v)[:70])
def test_every_command_line_of_the_pages_parses(where: str, args: list[str]) -> None:
    command = cli.commands[args[0]]
    with command.make_context(args[0], list(args[1:])) as ctx:  # raises on a bad option
        assert ctx.params is not None, where


def transcripts() -> list[tuple[str, str, str]]:
    """(where, command, output) of each `$ once periods ...` transcript of the pages: what
    once periods prints depends on nothing but its arguments, so it runs here."""
    found = []
    for path in markdown_pages():
        for n, block in code_blocks(path):
            if block and block[0].startswith("$ once periods "):
                rest = [row for row in block[1:] if row.strip()]
                if not any(row.startswith("$ ") for row in rest):
                    found.append((f"{path.relative_to(EXAMPLES.parent)}:{n}", block[0][2:],
                                  "\n".join(rest)))
    return found


@pytest.mark.parametrize(("where", "command", "shown"), transcripts(), ids=lambda v: str(v)[:50])
def test_every_periods_transcript_prints_what_it_shows(where: str, command: str,
                                                        shown: str) -> None:
    import sys

    words = shlex.split(command)
    done = subprocess.run([sys.executable, "-m", "once", *words[1:]], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, (where, done.stderr)
    assert done.stdout.rstrip("\n") == shown, where


def test_the_image_leaves_out_the_clones_virtualenv_and_history() -> None:
    # A clone that ran `make test` holds .venv (hundreds of MB), .git and site/: the example
    # image copies the clone, so both ignore files must leave them out (issue 36).
    root = Path(__file__).resolve().parents[2]
    for ignore, prefix in ((root / ".dockerignore", ""),
                           (root / "examples" / "kubernetes" / "Dockerfile.dockerignore",
                            "once/")):
        lines = set(ignore.read_text().splitlines())
        for name in (".venv/", ".git/", "site/", "test-artifacts/"):
            assert prefix + name in lines, (ignore, name)

"""The docs site (docs/, mkdocs.yml) cannot drift from the code: the generated reference is
current, everything the code has is in it, everything the hand-written pages name exists,
the JSON documents and metrics the commands really print are the ones documented, the
site builds with --strict and no link of the built HTML is broken. "run make man" refreshes
docs/reference/."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any, get_type_hints

import pytest

from helpers import run_either, wait_for
from once._docs import columns, environment, exits, markdown
from once._docs.options import commands, envvars, load_cli
from once.report import documents
from once.report.metrics import JOB_LABEL, LABELS, METRICS

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
REFERENCE = DOCS / "reference"
STALE = "run make man"
GENERATED = set(markdown.pages())
CLI = load_cli()


def hand_pages() -> dict[str, str]:
    """The pages written by hand (docs/ but the generated reference) and the README."""
    found = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8")
             for p in sorted(DOCS.rglob("*.md"))
             if not (p.parent == REFERENCE and p.name in GENERATED)}
    found["README.md"] = (ROOT / "README.md").read_text(encoding="utf-8")
    return found


def reference() -> str:
    return "\n".join((REFERENCE / name).read_text(encoding="utf-8") for name in sorted(GENERATED))


def all_options() -> set[str]:
    found = {"--help", "-h", "--version", "-V"}
    for cmd in commands(CLI):
        for p in cmd.options:
            found.update(getattr(p, "opts", []))
            found.update(getattr(p, "secondary_opts", []))
    return found


def all_envvars() -> set[str]:
    found = {name for name, _ in (*environment.CHILD_ENV, *environment.ENV_FIXED)}
    for cmd in commands(CLI):
        for opt in cmd.options:
            found.update(envvars(opt, cmd.ctx))
    return found


EXIT_STATUSES = {status for _, _, rows in exits.EXIT_STATUS for status, _ in rows
                 if status.isdigit()} | {"0", "1", "2", "3", "75"}


# -- current -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_reference_page_is_current(name: str) -> None:
    path = REFERENCE / name
    assert path.exists(), f"docs/reference/{name} is missing: {STALE}"
    assert path.read_text(encoding="utf-8") == markdown.pages()[name], (
        f"docs/reference/{name} differs from what the code makes now: {STALE}")


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for path in DOCS.rglob("*.md"):
        assert path.relative_to(DOCS).as_posix() in nav, f"{path} is in no nav entry of mkdocs.yml"


# -- code -> docs ------------------------------------------------------------------------------


def test_the_reference_has_every_command_option_variable_and_status() -> None:
    text = reference()
    for cmd in commands(CLI):
        assert f"## once {cmd.name}\n" in text, cmd.name
    for opt in sorted(all_options()):
        assert f"`{opt}`" in text, f"{opt} is not in docs/reference: {STALE}"
    for var in sorted(all_envvars()):
        assert f"`{var}`" in text, f"{var} is not in docs/reference: {STALE}"
    statuses = (REFERENCE / "exit-status.md").read_text(encoding="utf-8")
    for status in ("0", "1", "2", "3", "69", "70", "75", "124"):
        assert f"| {status} |" in statuses or f" {status} " in statuses, status


def test_the_reference_has_every_metric_column_and_json_key() -> None:
    metrics = (REFERENCE / "metrics.md").read_text(encoding="utf-8")
    for name, kind, _ in METRICS:
        assert f"| `{name}` | {kind} |" in metrics, name
    from once.ledger.tables import metadata

    tables = (REFERENCE / "tables.md").read_text(encoding="utf-8")
    for table in metadata.tables.values():
        assert f"## {table.name}\n" in tables, table.name
        assert set(columns.COLUMNS[table.name]) == {c.name for c in table.columns}, (
            f"once._docs.columns names other columns of {table.name} than the schema has")
        for col in table.columns:
            assert f"| `{col.name}` |" in tables, f"{table.name}.{col.name}"
    assert set(columns.TABLES) == set(metadata.tables)
    text = (REFERENCE / "json.md").read_text(encoding="utf-8")
    for _, kind in documents.DOCUMENTS:
        for key in get_type_hints(kind):
            assert f"| `{key}` |" in text, f"{kind.__name__}.{key}"


# -- docs -> code ------------------------------------------------------------------------------

# Options of other tools that the pages show (mkdocs, git, node_exporter, pip, faketime, ...).
FOREIGN_OPTIONS = {"--collector", "--strict", "--unshallow", "--user", "--where", "--day"}


def test_every_option_the_pages_name_exists() -> None:
    known = all_options() | FOREIGN_OPTIONS
    for where, text in hand_pages().items():
        named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))
        assert named <= known, f"{where} names options no command has: {sorted(named - known)}"


def test_every_variable_the_pages_name_exists() -> None:
    known = all_envvars()
    for where, text in hand_pages().items():
        named = set(re.findall(r"(?<![A-Za-z0-9_])ONCE_[A-Z][A-Z_]*[A-Z]", text))
        named = {n for n in named  # the suite's, .ci's and make bench's own knobs
                 if not n.startswith(("ONCE_TEST_", "ONCE_PGBOUNCER_", "ONCE_BENCH_"))}
        assert named <= known, f"{where} names variables nothing reads: {sorted(named - known)}"


def test_every_metric_table_and_index_the_pages_name_exists() -> None:
    from once.ledger.pg_claim import stored_claim
    from once.ledger.tables import metadata

    known = {name for name, _, _ in METRICS} | set(metadata.tables) | {"once_job"}
    known |= {str(i.name) for t in metadata.tables.values() for i in t.indexes}
    known |= {str(c.name) for t in metadata.tables.values() for c in t.constraints
              if isinstance(c.name, str)}  # once_attempts_claim_id, MySQL's CHECK
    known.add(stored_claim().name.rpartition("_")[0])  # PostgreSQL's once_claim_HASH
    for where, text in hand_pages().items():
        named = set(re.findall(r"(?<![\w.])once_[a-z_]+[a-z]", text))
        assert named <= known, f"{where} names metrics or tables that are gone: {named - known}"


def test_every_exit_status_the_pages_name_is_documented() -> None:
    for where, text in hand_pages().items():
        named = set(re.findall(r"\bexits? (?:with )?(\d+)\b", text))
        named = {n for n in named if not 128 < int(n) <= 128 + 64}  # 128+N: signal N
        assert named <= EXIT_STATUSES, f"{where}: exit {sorted(named - EXIT_STATUSES)}?"


# -- what the commands really print ------------------------------------------------------------


def once(env: dict[str, str], *args: str, check: bool = True) -> str:
    """A run or catch-up as a process; a report in this process (helpers.run_either)."""
    done = run_either(*args, env=env, timeout=120)
    assert not check or done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A SQLite ledger with done, missing, failed, failed-out and running periods."""
    import os

    tmp = tmp_path_factory.mktemp("fleet")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ONCE_")}
    env.update(XDG_STATE_HOME=str(tmp / "state"), ONCE_DATABASE_URL=f"sqlite:///{tmp}/l.db")
    once(env, "catchup", "--job", "daily", "--every", "day", "--since", "2026-01-01",
         "--until", "2026-01-03", "--", "true")
    once(env, "catchup", "--job", "daily", "--every", "day", "--since", "2026-02-01",
         "--until", "2026-02-01", "--", "true")  # January 4 to 31 missing: a range line
    once(env, "run", "--job", "weekly", "--every", "week", "--max-attempts", "1", "--",
         "sh", "-c", "echo it broke; exit 3", check=False)
    once(env, "lead", "--name", "beat", "--", "true")  # a lead name: one term, released
    marker = tmp / "running"
    proc = subprocess.Popen([sys.executable, "-m", "once", "run", "--job", "hourly",
                             "--every", "hour", "--", "sh", "-c", f"touch {marker}; sleep 60"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: marker.exists() or proc.poll() is not None, what="the hourly command")
        assert marker.exists(), "the hourly job's command never started"
        out = {
            "status": once(env, "status", "--json"),
            "timeline": once(env, "status", "daily", "--json", "--timeline"),
            "check": once(env, "check", "--json", check=False),
            "history": once(env, "history", "weekly", "--json"),
            "leads": once(env, "status", "--leads", "--json"),
            "terms": once(env, "history", "--lead", "beat", "--json"),
            "logs": once(env, "logs", "weekly", "--json"),
            "metrics": once(env, "metrics"),
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    return out


def _check_keys(kind: Any, obj: dict[str, Any], where: str) -> None:
    hints = get_type_hints(kind)
    required = kind.__required_keys__
    assert set(obj) <= set(hints), f"{where}: undocumented keys {sorted(set(obj) - set(hints))}"
    assert required <= set(obj), f"{where}: documented keys missing {sorted(required - set(obj))}"
    for key, value in obj.items():
        inner = [t for t in markdown._typed_dicts(hints[key])]
        for item in value if isinstance(value, list) else [value]:
            if inner and isinstance(item, dict):
                _check_keys(inner[0], item, f"{where}.{key}")


def test_the_json_documents_are_the_documented_ones(fleet: dict[str, str]) -> None:
    jobs = json.loads(fleet["status"])
    assert {j["job"] for j in jobs} == {"daily", "weekly", "hourly"}
    assert any(j["running"] for j in jobs) and any(j["failed_periods"] for j in jobs)
    for job in jobs + json.loads(fleet["timeline"]):
        _check_keys(documents.StatusJob, job, "once status --json")
    assert json.loads(fleet["timeline"])[0]["timeline"]
    found = json.loads(fleet["check"])
    assert {f["problem"] for f in found} >= {"missing", "failed-out"}
    assert any("count" in f for f in found)
    for finding in found:
        _check_keys(documents.CheckFinding, finding, "once check --json")
    for entry in json.loads(fleet["history"]):
        _check_keys(documents.HistoryEntry, entry, "once history --json")
    _check_keys(documents.LogsEntry, json.loads(fleet["logs"]), "once logs --json")
    [lead] = json.loads(fleet["leads"])
    _check_keys(documents.StatusLead, lead, "once status --leads --json")
    [term] = json.loads(fleet["terms"])
    _check_keys(documents.LeadTerm, term, "once history --lead NAME --json")


def test_the_metrics_have_the_documented_labels(fleet: dict[str, str]) -> None:
    seen: dict[str, set[tuple[str, ...]]] = {}
    for row in fleet["metrics"].splitlines():
        match = re.match(r"^(once_\w+)\{(.*)\} ", row)
        if match:
            labels = tuple(re.findall(r'(\w+)="', match.group(2)))
            seen.setdefault(match.group(1), set()).add(labels)
    assert set(seen) == {name for name, _, _ in METRICS}
    for name, found in seen.items():
        assert found == {LABELS.get(name, JOB_LABEL)}, name


# -- the built site ----------------------------------------------------------------------------


class Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if found.get("id"):
            self.ids.add(str(found["id"]))
        for name in ("href", "src"):
            if found.get(name):
                self.hrefs.append(str(found[name]))


@pytest.mark.slow  # a whole mkdocs build (make check builds it too, strict)
def test_the_site_builds_strict_without_a_broken_link(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet",
                           "-d", str(site)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={**__import__("os").environ,
                                            "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr
    pages = {}
    for path in site.rglob("*.html"):
        parser = Links()
        parser.feed(path.read_text(encoding="utf-8"))
        pages[path] = parser
    assert len(pages) > 20
    broken = []
    for path, parser in pages.items():
        for href in parser.hrefs:
            if re.match(r"^[a-z]+:|^//", href) or path.name == "404.html":
                continue
            target, _, anchor = href.partition("#")
            dest = (path.parent / target).resolve() if target else path
            if dest.is_dir():
                dest = dest / "index.html"
            if not dest.exists():
                broken.append(f"{path.relative_to(site)}: {href}")
            elif anchor and dest.suffix == ".html" and dest in pages and (
                    anchor not in pages[dest].ids):
                broken.append(f"{path.relative_to(site)}: {href} (no such anchor)")
    assert not broken, broken

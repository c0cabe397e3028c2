"""The layout's rules (docs/contributing.md "Layout"), as a test over the import graph of src/once.

Read from the source with ast, nothing imported: every `import` and `from ... import` of every
module, at its top or inside a function (a lazy import is still a dependency). The hot path's
rule at run time (what `once run` really loads) is tests/acceptance/test_hot_path.py. No
module imports one that imports it back, however far round (test_no_import_cycle): there the
imports under `if TYPE_CHECKING:` are left out, as only a type checker reads them (a record and
the backend it holds may name each other in annotations).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_LINES = 500

# Modules that hold no rule of the tool: what they may import is not a layering question.
LEAVES = {"once.limits", "once.escape", "once.outcomes", "once.deadlines", "once.frozen",
          "once.messages", "once.secrets"}
DRIVERS = {"sqlite3", "psycopg", "pymysql"}
# What a report or once serve may take from SQLAlchemy outside once.ledger: connections and
# their errors, never a statement builder (select, insert, text, func...).
SQLALCHEMY_PLUMBING = {"Connection", "Engine", "create_engine", "event", "SQLAlchemyError",
                       "NullPool"}
# A statement starts with its verb (prose in a docstring may mention one further in).
STATEMENT = re.compile(r"\s*(SELECT|INSERT|DELETE|UPDATE|CREATE|ALTER|WITH|PRAGMA)\s")


@dataclass(frozen=True)
class Import:
    module: str  # the imported module, absolute
    names: tuple[str, ...]  # for `from module import a, b`; () for `import module`
    top: bool  # at module level (paid at import time), or inside a function
    typing_only: bool = False  # under `if TYPE_CHECKING:`: read by a type checker, never run


def _name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def modules() -> dict[str, Path]:
    return {_name(p): p for p in sorted((SRC / "once").rglob("*.py"))}


@cache
def imports(module: str) -> tuple[Import, ...]:
    path = modules()[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    top = set(map(id, tree.body))
    typing = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
              and "TYPE_CHECKING" in ast.unparse(node.test)
              for statement in node.body for inner in ast.walk(statement)}
    found: list[Import] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [Import(a.name, (), id(node) in top, id(node) in typing)
                      for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]
                                + ([base] if base else []))
            found.append(Import(base, tuple(a.name for a in node.names), id(node) in top,
                                id(node) in typing))
    return tuple(found)


def _once_imports(module: str, typing: bool = True) -> set[str]:
    """The modules of once that `module` imports (a `from once.run import x` names once.run.x);
    without `typing`, only those it imports when it runs."""
    found = set()
    for imp in imports(module):
        if imp.typing_only and not typing:
            continue
        if imp.module == "once" or _in(imp.module, "once"):
            # `from once.run import guard` names the module once.run.guard, not the package.
            named = {f"{imp.module}.{n}" for n in imp.names if f"{imp.module}.{n}" in modules()}
            found |= named or {imp.module}
    return found


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_graph_is_read() -> None:
    # A rule over an empty graph would pass: the reader must see what is surely there.
    assert {"once.periods", "once.cli", "once.run.flow", "once.ledger", "once.report"} <= set(
        modules())
    assert "once.ledger" in _once_imports("once.run.flow")
    assert any(i.module == "sqlalchemy" for i in imports("once.ledger.schema"))


# -- no cycle ----------------------------------------------------------------------------------


def import_graph() -> dict[str, set[str]]:
    """Each module of once and those it imports when it runs: at its top or inside a function
    (a lazy import is a dependency all the same), not those under `if TYPE_CHECKING:`."""
    return {module: _once_imports(module, typing=False) - {module} for module in modules()}


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The graph's cycles: each set of two or more modules that all reach one another (its
    strongly connected components, Tarjan's), each sorted, in order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for after in graph.get(node, ()):
            if after not in index:
                visit(after)
                low[node] = min(low[node], low[after])
            elif after in stack:
                low[node] = min(low[node], index[after])
        if low[node] == index[node]:
            component = stack[stack.index(node):]
            del stack[stack.index(node):]
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_cycle_finder_finds_every_cycle_and_nothing_else() -> None:
    # The test of test_no_import_cycle's finder: a knot of three, a pair, and modules that
    # only lead into them or out of them.
    graph = {"a": {"b"}, "b": {"c", "d"}, "c": {"a"}, "d": set(), "e": {"f", "d"},
             "f": {"e"}, "g": {"a", "e"}}
    assert cycles(graph) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_import_graph_counts_lazy_imports_and_leaves_out_typing_ones() -> None:
    graph = import_graph()
    assert "once.run.backfill" in graph["once.cli.main"]  # inside `run`: only with --catchup
    assert "once.run.keeper" in _once_imports("once.run.flow")
    assert "once.run.keeper" not in graph["once.run.flow"]  # under TYPE_CHECKING alone
    # One lazy import back, as flow had backfill's before: the finder names the pair.
    knotted = {**graph, "once.run.flow": graph["once.run.flow"] | {"once.run.backfill"}}
    assert ["once.run.backfill", "once.run.flow"] in cycles(knotted)


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles (a module imports one that imports it back, at its top " \
        "or inside a function): " + "; ".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize("module", ["once.periods", "once.units", "once.cron", "once.schedules"])
def test_time_is_pure(module: str) -> None:
    # Periods, units, cron and schedules: the stdlib, zoneinfo, cronsim, the input limits and
    # the records' base, nothing of once that knows a database, a process or a terminal.
    allowed = {"once.periods", "once.units", "once.cron", "once.schedules", "once.limits",
               "once.frozen"}
    assert _once_imports(module) <= allowed
    third_party = {i.module.split(".")[0] for i in imports(module)} - {"once"}
    assert not third_party & {"sqlalchemy", "rich", "click", *DRIVERS}


@pytest.mark.parametrize("module", sorted(LEAVES))
def test_leaves_import_no_part(module: str) -> None:
    assert _once_imports(module) <= LEAVES


@pytest.mark.parametrize("module", sorted(set(modules()) - {"once.ledger"}))
def test_sql_lives_in_the_ledger(module: str) -> None:
    if _in(module, "once.ledger"):
        return
    for imp in imports(module):
        root = imp.module.split(".")[0]
        assert root not in DRIVERS, (
            f"{module} imports the driver {imp.module}: connections belong to once.ledger")
        if root == "sqlalchemy":
            builders = set(imp.names) - SQLALCHEMY_PLUMBING
            assert imp.names and not builders, (
                f"{module} imports {sorted(builders) or imp.module} from SQLAlchemy: "
                "statements are built in once.ledger (history, engines, schema, prune)")
    tree = ast.parse(modules()[module].read_text())
    held = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and STATEMENT.match(n.value)]
    assert not held, f"{module} holds SQL text: {held[0][:60]!r}"


BELOW_THE_LEDGER = {"once.gaps", "once.stored", "once.periods", "once.units", "once.cron",
                    "once.schedules", *LEAVES}


@pytest.mark.parametrize("module", sorted(m for m in modules() if _in(m, "once.ledger")))
def test_the_ledger_imports_no_part_above_it(module: str) -> None:
    # No report, runner or command: what a gap is, prune is handed by its caller.
    above = {m for m in _once_imports(module) if not _in(m, "once.ledger")} - BELOW_THE_LEDGER
    assert not above, f"{module} imports {sorted(above)}"


# The ledger's backends hang off the flow they share: the registry (dialects) and each
# backend's own modules import it, never the reverse; the shared flow takes its backend from
# the target (Target.backend). docs/contributing.md "The ledger package".
LEDGER_SHARED = ("once.ledger.base", "once.ledger.url", "once.ledger.connect",
                 "once.ledger.dialect", "once.ledger.tables", "once.ledger.schema",
                 "once.ledger.upgrade", "once.ledger.watchdog", "once.ledger.records",
                 "once.ledger.errors", "once.ledger.gap_rows", "once.ledger.rows",
                 "once.ledger.dbapi")
LEDGER_BACKENDS = ("once.ledger", "once.ledger.dialects", "once.ledger.sqlite",
                   "once.ledger.postgres", "once.ledger.pg_claim", "once.ledger.mysql")


@pytest.mark.parametrize("module", LEDGER_SHARED)
def test_the_shared_ledger_flow_imports_no_backend(module: str) -> None:
    backends = _once_imports(module) & set(LEDGER_BACKENDS)  # annotations' imports too
    assert not backends, (f"{module} imports {sorted(backends)}: it takes its backend from "
                          "the target (Target.backend) or its caller")


@pytest.mark.parametrize("module", ["once.gaps", "once.stored"])
def test_row_meaning_needs_only_time(module: str) -> None:
    assert _once_imports(module) <= {"once.gaps", "once.stored", "once.periods", "once.units",
                                     "once.schedules", *LEAVES}


@pytest.mark.parametrize("module", ["once.cli", "once.cli.main", "once.cli.options",
                                    "once.cli.runs", "once.cli.reports", "once.cli.complete"])
def test_the_cli_holds_no_sql(module: str) -> None:
    roots = {i.module.split(".")[0] for i in imports(module)}
    assert not roots & {"sqlalchemy", *DRIVERS}
    assert not any(_in(m, "once.ledger.history") or _in(m, "once.ledger.schema")
                   for m in _once_imports(module) if m != "once.ledger")


HOT = ("once.cli", "once.cli.main", "once.cli.options", "once.api", "once.run.flow",
       "once.run.wrapper", "once.run.machine", "once.run.guard", "once.run.launch",
       "once.run.lease", "once.run.relay", "once.run.child", "once.run.attempt", "once.run.notify",
       "once.messages", "once.periods", "once.units", "once.schedules", "once.stored",
       "once.gaps",
       "once.ledger", "once.ledger.base", "once.ledger.url", "once.ledger.records",
       "once.ledger.dialect", "once.ledger.dialects", "once.ledger.errors", "once.ledger.sqlite",
       "once.ledger.postgres", "once.ledger.pg_claim", "once.ledger.mysql",
       "once.ledger.connect", "once.ledger.watchdog", "once.ledger.gap_rows")
# once.ledger.dbapi holds annotations alone: imported under TYPE_CHECKING, never run.
COLD = ("sqlalchemy", "rich", "once.report", "once.ledger.schema", "once.ledger.tables",
        "once.ledger.upgrade",
        "once.ledger.history", "once.ledger.fleet", "once.ledger.rows", "once.ledger.dbapi",
        "once.ledger.prune", "once.ledger.engines", "once.serve", "once._docs", "once.cli.runs",
        "once.cli.reports", "once.cli.ledger_commands", "once.cli.lead")


@pytest.mark.parametrize("module", [m for m in HOT if m in modules()] + ["once.cli"])
def test_the_hot_path_imports_no_report_at_its_top(module: str) -> None:
    # A module `once run` loads may reach the report path only lazily, inside the function
    # of the rare case that needs it (e.g. table creation on first use).
    for imp in imports(module):
        target = imp.module if imp.module != "once" else None
        names = [target] if target else [f"once.{n}" for n in imp.names]
        for name in names:
            if imp.top:
                assert not any(_in(name, cold) for cold in COLD), (
                    f"{module} imports {name} at its top: `once run` would pay for it")


def test_every_module_is_small() -> None:
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    assert not {m: n for m, n in sizes.items() if n > MAX_LINES}


# docs/contributing.md "Layout", top to bottom: a part imports only its layer and those below.
LAYERS = (
    ("once.cli",),
    ("once.report", "once.serve"),
    ("once.api",),
    ("once.run",),
    ("once.ledger",),
    ("once.gaps", "once.stored"),
    ("once.schedules", "once.periods", "once.units", "once.cron"),
    tuple(sorted(LEAVES)),
)
# Inside once.run: run and catch-up compose the parts that start and watch one command.
RUN_LAYERS = (
    ("once.run.flow", "once.run.backfill", "once.run.lead"),
    ("once.run.wrapper", "once.run.guard", "once.run.launch", "once.run.keeper", "once.run.lease",
     "once.run.relay", "once.run.child", "once.run.attempt", "once.run.notify", "once.run.skips",
     "once.run.stops"),
    ("once.run.machine",),  # the wrapper's rules: pure, below its shell
)


def _layer(module: str) -> int | None:
    return next((i for i, parts in enumerate(LAYERS)
                 if any(_in(module, part) for part in parts)), None)


@pytest.mark.parametrize("module", sorted(m for m in modules()
                                          if m not in ("once", "once.__main__")
                                          and not _in(m, "once._docs")))
def test_a_part_imports_no_layer_above_its_own(module: str) -> None:
    mine = _layer(module)
    assert mine is not None, f"{module} is in no layer of docs/contributing.md 'Layout'"
    up = [m for m in _once_imports(module) - {"once"} if (_layer(m) or 0) < mine]
    assert not up, f"{module} imports {up}, above it in docs/contributing.md 'Layout'"


@pytest.mark.parametrize("module", sorted(m for m in modules() if _in(m, "once.run")
                                          and m != "once.run"))
def test_the_run_path_starts_one_command_below_run_and_catch_up(module: str) -> None:
    def inner(name: str) -> int | None:
        return next((i for i, parts in enumerate(RUN_LAYERS) if name in parts), None)
    mine = inner(module)
    assert mine is not None, f"{module} is in no layer of once.run (RUN_LAYERS)"
    up = [m for m in _once_imports(module) if _in(m, "once.run") and (inner(m) or 0) < mine]
    assert not up, f"{module} imports {up}: run and catch-up compose the parts, not the reverse"


def test_every_module_sits_in_a_package_of_its_layer() -> None:
    # The layers are packages, not only a list: a new module at the top of src/once is one of
    # the public face (api) or a pure part below the ledger.
    top = {m for m in modules() if m.count(".") == 1 and not m.startswith("once._")}
    assert top - {"once.__main__"} <= {
        "once.cli", "once.report", "once.serve", "once.api", "once.run", "once.ledger",
        "once.gaps", "once.stored", "once.periods", "once.units", "once.cron", "once.schedules",
        *LEAVES}


def test_no_two_test_modules_share_a_name() -> None:
    # The test directories are no packages: pytest imports each module by its basename, and
    # refuses to collect a second of the same name (the whole suite then fails at collection).
    tests = Path(__file__).resolve().parents[1]
    seen: dict[str, Path] = {}
    for path in sorted(tests.rglob("test_*.py")):
        assert path.name not in seen, f"{path} and {seen[path.name]} share a name"
        seen[path.name] = path

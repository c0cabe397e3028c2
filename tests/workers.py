"""The suite under pytest-xdist: `make test` runs `-n 4 --dist loadgroup` (TEST_WORKERS), since
its tests mostly wait on clocks, processes and servers. Registered by tests/conftest.py.

- Servers: the controller starts and checks the servers the suite starts itself (the embedded
  PostgreSQL, the Galera cluster) at its session start, before any worker exists
  (tests/conftest.py), and hands them to every worker (pytest_configure_node: `SHARED`), which
  adopts them instead of starting its own; the controller stops them after the last worker.
- Groups: a session- or module-scoped fixture is set up once per worker that runs a test taking
  it, and that worker owns it. The tests that share one run on one worker, one group each
  (`groups`): by ONE_WORKER for a harness of the whole session (the Galera cluster is the
  controller's, but a test kills and brings back its nodes: two at once would kill each
  other's; the older releases are built once, under a lock each worker would wait on), by
  module for one a test module defines (the failover pairs, whose primaries its tests crash and
  promote; an older build; the docs site a browser test builds).
  xdist's own loadgroup carries a group in the test's id, which pytest 9 no longer lets it
  change (pytest-xdist issue 1386): each worker writes the groups it collected to a file the
  controller named (`GROUPS`), and the controller's scheduler (`Grouped`) reads them.
- Order: every worker sorts the slow tests first (a long test dealt last is the run's tail);
  the groups, largest first, go out before single tests.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

# Keys of workerinput: the controller's servers, and the file of the groups.
SHARED = "once_servers"
GROUPS = "once_groups"

ONE_WORKER = {"galera": "galera", "releases": "releases"}

_groups_dir: Path | None = None  # the controller's: where the workers write the groups


def groups(item: pytest.Item) -> set[str]:
    """The groups of a test: one for each shared harness it takes."""
    found = {ONE_WORKER[name] for name in item.fixturenames if name in ONE_WORKER}
    info = getattr(item, "_fixtureinfo", None)
    for defs in (info.name2fixturedefs.values() if info is not None else ()):
        where = defs[-1].baseid.partition("::")[0]  # "" for a plugin's, "tests" for conftest's
        if defs[-1].scope in ("module", "session") and where.endswith(".py"):
            found.add(Path(where).stem)
    return found


def _groups_file() -> Path:
    global _groups_dir
    if _groups_dir is None:
        _groups_dir = Path(tempfile.mkdtemp(prefix="once-xdist-"))
    return _groups_dir / "groups.json"


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """The controller, before it starts a worker: the servers it adopts (the controller's
    session start has started and checked them), and where it writes its groups."""
    from conftest import shared_servers

    node.workerinput[SHARED] = shared_servers()
    node.workerinput[GROUPS] = str(_groups_file())


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Grouped(LoadScopeScheduling):
        """--dist loadgroup with the groups the workers wrote: a group's tests are one unit of
        work, dealt to one worker; any other test is a unit of its own."""

        _of: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._of is None:  # every worker has collected: the file is whole
                try:
                    self._of = json.loads(_groups_file().read_text())
                except (OSError, ValueError):
                    self._of = {}
            return self._of.get(nodeid, nodeid)

    return Grouped(config, log)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if hasattr(config, "workerinput"):  # every worker sorts alike: the collections must match
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)


@pytest.hookimpl(tryfirst=True)  # before the worker sends its collection to the controller
def pytest_collection_finish(session: pytest.Session) -> None:
    where = getattr(session.config, "workerinput", {}).get(GROUPS)
    if where is None:
        return
    found = {item.nodeid: "@" + "+".join(sorted(names)) for item in session.items
             if (names := groups(item))}
    staged = Path(f"{where}.{os.getpid()}")
    staged.write_text(json.dumps(found))
    os.replace(staged, where)  # every worker writes the same: whole, whichever lands last


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _groups_dir is not None and not hasattr(session.config, "workerinput"):
        shutil.rmtree(_groups_dir, ignore_errors=True)

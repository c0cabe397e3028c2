"""Older releases of once, by commit, each installed in a virtualenv of its own: what a fleet
runs beside the current `once` while it is upgraded one host at a time.

A release is this repository's own tree at a commit (`git archive`), installed the way a user
installs it (`pip install DIR`, not editable), its dependencies pinned to the versions of the
environment that runs the tests (pip's cache has them: no surprise release, little network).
The venvs are cached between runs outside the work tree, in
`${XDG_CACHE_HOME:-~/.cache}/once-test/versions/` (`ONCE_TEST_VERSIONS_CACHE` elsewhere), one
per full commit hash and Python version, and published atomically: a venv is built in a
directory of its own (`.build-KEY-RANDOM`) and becomes the cached one only when a symlink
named KEY is renamed onto it, after its `once --version` has answered. A build that is killed
leaves a directory no symlink names, removed by the next build of that key (under the key's
flock, which also keeps two sessions from building the same release at once).

A commit that the repository does not have (a shallow clone) fails the tests that need it,
with a message that says so: they never skip.

The session fixture `releases` (registered by tests/conftest.py) builds every release in
RELEASES, the cold ones side by side. torture/rolling.py builds them with `build_all`.
"""

from __future__ import annotations

import fcntl
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The older releases a fleet may still run, by the ledger schema version they know: the last
# commit of main before each schema bump (CHANGELOG.md: 3 stored the owner's promise in
# once_runs.stale_after, 4 the output in once_attempts.output, 5 renamed once_jobs.fires).
RELEASES: dict[int, str] = {
    2: "106a16de97a4d416beaa61fd962f119e98c0d093",
    3: "586a1eb4e17a3735c554819113ee0509f9a37a23",
    4: "555ff1319f10ff6d32e29051250a67ce76a0ff87",
}


class BuildError(Exception):
    """A release could not be built: the message says why and what to do."""


@dataclass(frozen=True)
class Release:
    """One older once, installed: `argv` starts it (its own `once` script)."""

    schema: int
    commit: str
    venv: Path

    @property
    def once(self) -> str:
        return str(self.venv / "bin" / "once")

    @property
    def name(self) -> str:
        return f"schema {self.schema} ({self.commit[:7]})"


def cache_root() -> Path:
    explicit = os.environ.get("ONCE_TEST_VERSIONS_CACHE")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "once-test" / "versions"


def build_all(schemas: list[int] | None = None) -> dict[int, Release]:
    """Every release asked for (all of RELEASES by default), built if not cached."""
    wanted = sorted(RELEASES) if schemas is None else schemas
    with ThreadPoolExecutor(max_workers=len(wanted) or 1) as pool:
        venvs = list(pool.map(lambda s: build(RELEASES[s]), wanted))
    return {s: Release(s, RELEASES[s], v) for s, v in zip(wanted, venvs, strict=True)}


def build(commit: str) -> Path:
    """The venv of once at `commit` (a full hash), from the cache or built now."""
    _require_commit(commit)
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    key = f"{commit}-py{sys.version_info.major}.{sys.version_info.minor}"
    link = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the kernel lets go if this process dies
        if _usable(link):
            return link
        for leftover in root.glob(f".build-{key}-*"):  # killed builds: nothing names them
            shutil.rmtree(leftover, ignore_errors=True)
        building = root / f".build-{key}-{uuid.uuid4().hex[:8]}"
        try:
            _install(commit, building)
        except BaseException:
            shutil.rmtree(building, ignore_errors=True)
            raise
        staged = root / f".link-{key}-{uuid.uuid4().hex[:8]}"
        staged.symlink_to(building.name)
        os.replace(staged, link)  # atomic: the old link or the new one, never half a venv
    return link


def _usable(link: Path) -> bool:
    """A published venv whose interpreter is still there (the Python it was made with may
    have been removed or upgraded since)."""
    try:
        config = (link / "pyvenv.cfg").read_text()
    except OSError:
        return False
    home = next((line.partition("=")[2].strip() for line in config.splitlines()
                 if line.partition("=")[0].strip() == "home"), "")
    return (link / "bin" / "once").exists() and (link / "bin" / "python").exists() and \
        bool(home) and Path(home).is_dir()


def _require_commit(commit: str) -> None:
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"],
                           capture_output=True, text=True)
    if found.returncode == 0:
        return
    shallow = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--is-shallow-repository"],
                             capture_output=True, text=True).stdout.strip() == "true"
    why = ("this clone is shallow: `git fetch --unshallow` brings the history" if shallow
           else f"is {REPO} a clone of once with its history? "
                f"({found.stderr.strip() or 'git found no such commit'})")
    raise BuildError(f"the older once at commit {commit} is not in this repository, so the "
                     f"mixed-version tests cannot build it: {why}")


def _install(commit: str, venv: Path) -> None:
    """A venv at `venv` with once at `commit` installed from an archive of its tree."""
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="once-release-") as work:
        source = Path(work) / "src"
        archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(source, filter="data")
        pins = Path(work) / "pins.txt"
        pins.write_text(_pins())
        _step([sys.executable, "-m", "venv", str(venv)], commit)
        _step([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
               "--disable-pip-version-check", "--no-input", "-c", str(pins), str(source)],
              commit)
    answer = _step([str(venv / "bin" / "once"), "--version"], commit)
    print(f"built once {commit[:7]} ({answer.strip()}) in {venv} in "
          f"{time.monotonic() - began:.0f}s", file=sys.stderr)


def _pins() -> str:
    """The versions of this environment's packages, as pip constraints: an older once gets
    the same drivers and libraries as the current one (none of them is once itself)."""
    lines = set()
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name.lower() not in ("once-cli", "pip", "setuptools", "wheel"):
            lines.add(f"{name}=={dist.version}")
    return "\n".join(sorted(lines)) + "\n"


def _step(argv: list[str], commit: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        said = [line for line in (done.stderr + done.stdout).splitlines()
                if not line.startswith("WARNING:")]
        raise BuildError(f"building the older once at {commit[:7]} failed: "
                         f"{' '.join(argv[:4])} exited {done.returncode}: "
                         + " | ".join(said[-8:]))
    return done.stdout


# -- pytest ----------------------------------------------------------------------------------

try:
    import pytest
except ImportError:  # torture/ uses build_all without pytest
    pass
else:
    @pytest.fixture(scope="session")
    def releases() -> dict[int, Release]:
        """Every older release of RELEASES, by schema version (built once per session)."""
        try:
            return build_all()
        except BuildError as exc:
            failure = str(exc)
        pytest.fail(failure, pytrace=False)  # outside the except: one message, no chain

"""The command once runs is the file execvp would run, also where exec may run what the real
uid may not: a `once` under systemd's User= with AmbientCapabilities=CAP_DAC_OVERRIDE (here
capsh's). The guard's PATH search before the fork once judged files with os.access (the
real uid, no capabilities) and ran a file further down PATH (an outside attacker's finding).
Root and capsh (Debian's libcap2-bin) are needed to drop to nobody with the capability."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import ONCE

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("capsh") is None,
                                reason="needs root and capsh to run once as nobody with a "
                                       "capability")


def _tree(root: Path) -> str:
    """PATH of A and B, each with a `cmd` that says which: A's is root's, mode 0700."""
    for name, mode in (("A", 0o700), ("B", 0o755)):
        (root / name).mkdir()
        (root / name / "cmd").write_text(f"#!/bin/sh\necho {name}\n")
        (root / name / "cmd").chmod(mode)
    (root / "db").mkdir()
    shutil.chown(root / "db", "nobody")
    for directory in (root, root / "A", root / "B"):
        directory.chmod(0o755)
    return f"{root / 'A'}:{root / 'B'}"


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory every user can search all the way down (pytest's tmp_path is under a
    directory only root may: os.access would then find neither file, the search be left to
    execvpe, and the test pass on the fault)."""
    root = Path(tempfile.mkdtemp(dir="/tmp"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _as_nobody_with_dac_override(script: str, path: str, home: Path) -> str:
    done = subprocess.run(
        ["capsh", "--caps=cap_dac_override+eip cap_setuid,cap_setgid+ep", "--keep=1",
         "--user=nobody", "--addamb=cap_dac_override", "--", "-c",
         f"PATH={path} HOME={home} ONCE_DATABASE_URL={home / 'ledger.db'}; "
         f"export PATH HOME ONCE_DATABASE_URL; {script}"],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("command", ["run --job j --every day",
                                     "catchup --job k --every day --since 2026-01-01 "
                                     "--until 2026-01-03"])
def test_the_file_execvp_runs_is_the_one_once_runs(open_dir: Path, command: str) -> None:
    tmp_path = open_dir
    path = _tree(tmp_path)
    python = Path(ONCE).with_name("python")
    execvp = _as_nobody_with_dac_override(
        f"{python} -c 'import os; os.execvp(\"cmd\", [\"cmd\"])'", path, tmp_path / "db")
    assert execvp.split() == ["A"]  # the capability lets exec run root's 0700 file
    ran = _as_nobody_with_dac_override(f"{ONCE} {command} -- cmd", path, tmp_path / "db")
    assert set(ran.split()) == {"A"}, ran

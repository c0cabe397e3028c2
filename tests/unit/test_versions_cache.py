"""The cache of older builds (tests/versions.py): a build that dies leaves nothing that counts
as cached, and a commit the repository lacks is a failure that says so. pip is not run here:
`_install` is replaced by a stand-in that makes the files a venv is judged by."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import versions

COMMIT = versions.RELEASES[4]
KEY = f"{COMMIT}-py{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ONCE_TEST_VERSIONS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _fake_venv(_commit: str, venv: Path) -> None:
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "once").touch()
    (venv / "bin" / "python").touch()
    (venv / "pyvenv.cfg").write_text(f"home = {Path(sys.executable).resolve().parent}\n")


def test_a_killed_build_is_not_cached_and_is_cleared(cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    half = cache / f".build-{KEY}-deadbeef"  # what a build killed mid-pip leaves
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").touch()
    built: list[Path] = []
    monkeypatch.setattr(versions, "_install", lambda c, v: (built.append(v), _fake_venv(c, v)))
    venv = versions.build(COMMIT)
    assert built, "the half-built venv was taken as cached"
    assert venv == cache / KEY and venv.is_symlink() and venv.resolve() == built[0]
    assert not half.exists()
    again = versions.build(COMMIT)  # cached now: no second build
    assert again == venv and len(built) == 1


def test_a_failed_build_publishes_nothing(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def dies(commit: str, venv: Path) -> None:
        _fake_venv(commit, venv)
        raise versions.BuildError("pip died")

    monkeypatch.setattr(versions, "_install", dies)
    with pytest.raises(versions.BuildError):
        versions.build(COMMIT)
    assert not (cache / KEY).exists()
    assert not list(cache.glob(".build-*"))


def test_a_venv_whose_python_is_gone_is_rebuilt(cache: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(versions, "_install", _fake_venv)
    venv = versions.build(COMMIT)
    (venv / "pyvenv.cfg").write_text("home = /nonexistent/python/bin\n")
    rebuilt = versions.build(COMMIT)
    assert (rebuilt / "pyvenv.cfg").read_text() != "home = /nonexistent/python/bin\n"


def test_a_commit_not_in_the_repository_fails_naming_it(cache: Path) -> None:
    missing = "0123456789abcdef0123456789abcdef01234567"
    with pytest.raises(versions.BuildError, match=f"commit {missing} is not in this repository"):
        versions.build(missing)
    assert not cache.exists() or not list(cache.iterdir())

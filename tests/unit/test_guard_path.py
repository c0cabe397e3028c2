"""The guard's PATH search, made before the command's fork (once.run.launch.found_on_path): it
must pick the file os.execvpe would run, and where that file's exec fails, execvpe's own
search decides (it goes on to the next directory). Real files and a real command, started
as the guard starts it (launch.start)."""

from __future__ import annotations

import os
from pathlib import Path

from once.run import launch


def _tree(root: Path) -> dict[str, str]:
    """PATH of five directories, each with its own kind of `cmd`: none, a file without the
    execute bit, a directory, an executable that cannot be run (no format exec knows), and
    an executable script that says which it is."""
    (root / "none").mkdir()
    (root / "plain").mkdir()
    (root / "plain" / "cmd").write_text("#!/bin/sh\necho plain\n")
    (root / "plain" / "cmd").chmod(0o644)
    (root / "dir" / "cmd").mkdir(parents=True)
    (root / "junk").mkdir()
    (root / "junk" / "cmd").write_bytes(b"\x7fELF not really")
    (root / "junk" / "cmd").chmod(0o755)
    (root / "good").mkdir()
    (root / "good" / "cmd").write_text("#!/bin/sh\necho good\n")
    (root / "good" / "cmd").chmod(0o755)
    path = os.pathsep.join(str(root / d) for d in ("none", "plain", "dir", "junk", "good"))
    return {"PATH": path}


def _ran(command: list[str], env: dict[str, str]) -> str:
    """What the command wrote, started as the guard starts it."""
    read, write = os.pipe()
    try:
        pid = launch.start(command, env, {1: write}, os.getpid())
    finally:
        os.close(write)
    with os.fdopen(read, "rb") as out:
        said = out.read().decode()
    os.waitpid(pid, 0)
    return said.strip()


def test_the_first_file_on_path_is_found_whatever_it_is(tmp_path: Path) -> None:
    env = _tree(tmp_path)
    # Missing is passed over; not executable is not judged here (exec decides, with the
    # effective ids and capabilities that os.access leaves out): execvpe's search takes over.
    assert launch.found_on_path("cmd", env) == str(tmp_path / "plain" / "cmd")
    (tmp_path / "plain" / "cmd").unlink()
    (tmp_path / "plain" / "cmd").symlink_to(tmp_path / "gone")  # dangling: missing, to exec
    assert launch.found_on_path("cmd", env) == str(tmp_path / "dir" / "cmd")
    (tmp_path / "dir" / "cmd").rmdir()
    assert launch.found_on_path("cmd", env) == str(tmp_path / "junk" / "cmd")
    assert launch.found_on_path("nothing-of-that-name", env) is None
    assert launch.found_on_path("./cmd", env) is None  # a slash: run as it is, no search
    assert launch.found_on_path("", env) is None


def test_a_found_file_whose_exec_fails_leaves_it_to_execvpe(tmp_path: Path) -> None:
    # plain/cmd is found, its exec fails (EACCES), and execvpe goes on past the directory and
    # junk/cmd (ENOEXEC) to good/cmd, as it did before the search moved out of the child.
    env = _tree(tmp_path)
    assert _ran(["cmd"], env) == "good"


def test_a_command_not_found_fails_with_execvpe_error(tmp_path: Path) -> None:
    env = {"PATH": str(tmp_path)}
    try:
        _ran(["no-such-command"], env)
    except OSError as exc:
        assert exc.errno == 2  # ENOENT, the search's own
    else:
        raise AssertionError("a missing command started")


_CLOSED_STDIO = """
import os
os.close(0); os.close(1)
from once.run import launch
said = launch.start_watcher()
launch.watch_group(said); launch.watch_done(said); os.close(said)
launch.reap_watchers()
os.write(2, f"{said}\\n".encode())
"""


def test_a_watcher_s_pipe_is_never_a_command_s_stdout() -> None:
    # Started with stdin and stdout closed, once's pipes took 0 and 1: the guard's watcher's
    # would then be what a command inherits as its stdout, and read its lines as the guard's.
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _CLOSED_STDIO], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr
    assert int(done.stderr) > 2, done.stderr

"""A Ctrl-C that no command takes as a stop of its own ends `once` with 130 and one line,
`once: interrupted`, as docs/reference/exit-status.md says: while Python loads the command line
(it printed a KeyboardInterrupt traceback and died of the signal), and while a report works
(it printed a blank line alone).

The `once` script's own entry (once.cli.main, as the console script calls it) in a real
process, which sends itself SIGINT the moment it imports a module named by the test: an
import hook, not a sleep, puts the signal in its window.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

# The console script's code, behind a finder that sends SIGINT when AT is first imported.
SCRIPT = """
import os, signal, sys
AT = sys.argv[1]
class SigintAt:
    def find_spec(self, name, path=None, target=None):
        if name == AT:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, SigintAt())
sys.argv = ["once", *sys.argv[2:]]
from once.cli import main
sys.exit(main())
"""


def interrupted_at(module: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "ONCE_DATABASE_URL": f"sqlite:///{tmp_path / 'l.db'}",
           "HOME": str(tmp_path)}
    return subprocess.run([sys.executable, "-c", SCRIPT, module, *args], env=env, text=True,
                          capture_output=True, timeout=60, check=False)


@pytest.mark.parametrize("module", ["click", "once.cli.options"])
def test_ctrl_c_while_once_loads_is_one_line_and_130(tmp_path: Path, module: str) -> None:
    done = interrupted_at(module, tmp_path, "status")
    assert (done.returncode, done.stderr) == (130, "\nonce: interrupted\n"), done.stderr
    assert done.stdout == ""


def test_ctrl_c_while_a_report_reads_is_one_line_and_130(tmp_path: Path) -> None:
    # `once status` imports once.report inside its command: click's handling of the
    # interrupt, then once's line.
    done = interrupted_at("once.report", tmp_path, "status")
    assert (done.returncode, done.stderr) == (130, "\nonce: interrupted\n"), done.stderr

"""SQLAlchemy's own log records never reach once's stderr.

`make torture`, connections killed server-side on MariaDB: a first use's connection was
killed while SQLAlchemy rolled it back on its way back to the pool; SQLAlchemy logged that
("Exception during reset or similar") and, with no handler configured, Python's last resort
printed the traceback on the wrapper's stderr. Errors that matter reach once as exceptions.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# A process of its own: pytest's log capture would stand in for Python's last resort.
SCRIPT = """
import importlib, logging, sys
importlib.import_module(sys.argv[1])  # a module that builds engines of its own
try:
    raise OSError("Lost connection to MySQL server during query")
except OSError:
    logging.getLogger("sqlalchemy.pool.impl.NullPool").error(
        "Exception during reset or similar", exc_info=True)
"""


# The reports build theirs through once.ledger.engines (once status and check: none at all).
@pytest.mark.parametrize("module", ["once.ledger.schema", "once.ledger.engines",
                                    "once.serve.data"])
def test_a_failed_reset_logged_by_sqlalchemy_prints_nothing(module: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, module],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr

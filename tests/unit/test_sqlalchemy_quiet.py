"""SQLAlchemy's own log records never reach once's stderr.

`make torture`, connections killed server-side on MariaDB: a first use's connection was
killed while SQLAlchemy rolled it back on its way back to the pool; SQLAlchemy logged that
("Exception during reset or similar") and, with no handler configured, Python's last resort
printed the traceback on the wrapper's stderr. Errors that matter reach once as exceptions.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# A process of its own: pytest's log capture would stand in for Python's last resort.
SCRIPT = """
import logging, sys
from once import schema
from once.ledger import parse_url
schema.engine(parse_url(sys.argv[1])).dispose()
try:
    raise OSError("Lost connection to MySQL server during query")
except OSError:
    logging.getLogger("sqlalchemy.pool.impl.NullPool").error(
        "Exception during reset or similar", exc_info=True)
"""


def test_a_failed_reset_logged_by_sqlalchemy_prints_nothing(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, f"sqlite:///{tmp_path}/ledger.db"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "", done.stderr

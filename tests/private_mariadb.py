"""A private MariaDB server, started from Debian's mariadb-server binaries on a loopback port
and a data directory of its own, with a small max_allowed_packet (1 MiB, MySQL 5.5's default,
still found on managed servers) and the upstream default charset (latin1): the settings of the
shared server (16 MiB, utf8mb4) hide what they do to `once`. For test_finish_refused.py, and
with options of its own (the binary log, a server id) for a primary and its replica
(test_doctor_replication.py: `mariadb_binaries`, then PrivateMariadb(*binaries, *options)).

Its fixture, registered by tests/conftest.py: `private_mariadb` (one server a test module).
Without the binaries it skips, unless ONCE_TEST_BACKENDS names mariadb: then it fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import suppress
from pathlib import Path

import pytest

from helpers import ARTIFACTS, wait_for
from ledger_sql import server_rows
from procs import stopped
from replicas import free_port

PACKET = 1024 * 1024  # max_allowed_packet


class PrivateMariadb:
    def __init__(self, mariadbd: str, install: str, *options: str) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="once-mariadb-"))
        data = self.root / "data"
        # As root the server runs as `mysql`, which must own its directory.
        user = ["--user=mysql"] if os.geteuid() == 0 else []
        if user:
            shutil.chown(self.root, "mysql", "mysql")
        subprocess.run([install, "--no-defaults", f"--datadir={data}", *user,
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
        self.port = free_port()
        self.log = self.root / "error.log"
        self.proc = subprocess.Popen(
            [mariadbd, "--no-defaults", *user, f"--datadir={data}", f"--port={self.port}",
             "--bind-address=127.0.0.1", f"--socket={self.root}/socket",
             f"--pid-file={self.root}/pid", f"--log-error={self.log}",
             *(() if any(o.startswith("--log-bin") for o in options) else ("--skip-log-bin",)),
             "--skip-name-resolve", "--innodb-buffer-pool-size=16M",
             f"--max-allowed-packet={PACKET}", *options],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"mariadb://root@127.0.0.1:{self.port}"
        wait_for(self._up, timeout=60, what=f"the private MariaDB on port {self.port}")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"mariadbd exited {self.proc.returncode}: "
                               f"{self.log.read_text()[-2000:]}")
        try:
            self.execute("SELECT 1")
        except Exception:
            return False
        return True

    def execute(self, sql: str, database: str | None = None) -> list[tuple[object, ...]]:
        return server_rows(self.port, sql, database)

    def new_database(self) -> str:
        """A fresh, empty database on it: its URL."""
        name = "once_t_" + uuid.uuid4().hex[:12]
        self.execute(f"CREATE DATABASE {name}")
        return f"{self.url}/{name}"

    def stop(self) -> None:
        if self.proc.poll() is not None:  # it died under the tests (mariadbd crashed once
            self._keep_log()              # in CI, a null pointer): its log tells why
        stopped(self.proc)
        shutil.rmtree(self.root, ignore_errors=True)

    def _keep_log(self) -> None:
        """The error log of a server that died, in ONCE_TEST_ARTIFACTS (default:
        test-artifacts/), as private-mariadb-PORT.log."""
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        with suppress(OSError):
            shutil.copyfile(self.log, ARTIFACTS / f"private-mariadb-{self.port}.log")


def mariadb_binaries() -> tuple[str, str]:
    """(mariadbd, mariadb-install-db); the test skips without them, or fails where
    ONCE_TEST_BACKENDS names mariadb."""
    from conftest import BACKENDS

    mariadbd = shutil.which("mariadbd") or shutil.which("mariadbd", path="/usr/sbin")
    install = shutil.which("mariadb-install-db")
    if not (mariadbd and install):
        if "mariadb" in BACKENDS:
            pytest.fail("mariadbd and mariadb-install-db are needed for a private MariaDB")
        pytest.skip("no mariadbd and mariadb-install-db (Debian's mariadb-server)")
    return mariadbd, install


@pytest.fixture(scope="module")
def private_mariadb() -> Iterator[PrivateMariadb]:
    server = PrivateMariadb(*mariadb_binaries())
    yield server
    server.stop()

"""once doctor on real servers: the facts it reads, and a finding that each can be made to
show without touching the shared servers' global settings."""

from __future__ import annotations

import json
import sqlite3
from typing import Any
from urllib.parse import quote

from helpers import run_once


def test_doctor_reads_every_server_and_says_ok(backend: Any, once_env: dict[str, str]) -> None:
    assert run_once("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    result = run_once("doctor", "--json", env=once_env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["status"] == "OK"
    topics = {f["topic"] for f in report["findings"]}
    expected = {"sqlite": {"ledger", "filesystem", "journal"},
                "postgresql": {"session", "durability", "replication"},
                "mysql": {"session", "durability", "limits"}}[backend.dialect]
    assert expected <= topics


def test_doctor_warns_of_what_can_lose_a_claim(backend: Any, ledger_url: str,
                                               once_env: dict[str, str]) -> None:
    assert run_once("run", "--job", "j", "--every", "day", "--", "true",
                    env=once_env).returncode == 0
    env, args = dict(once_env), ["doctor"]
    if backend.dialect == "sqlite":
        sqlite3.connect(ledger_url.removeprefix("sqlite:///")).execute(
            "PRAGMA journal_mode=DELETE").close()
        expected = "WARNING journal journal_mode = delete"
    elif backend.dialect == "postgresql":  # this session's setting only
        env["ONCE_DATABASE_URL"] = ledger_url.replace(
            "options=", "options=" + quote("-csynchronous_commit=off "), 1)
        expected = "WARNING durability synchronous_commit = off"
    else:  # the packet limit is global: here it is judged against the largest tail
        args += ["--output-tail", "1MiB"]
        expected = "OK limits max_allowed_packet"
    result = run_once(*args, env=env)
    assert expected in result.stdout, result.stdout + result.stderr
    assert result.returncode == (0 if expected.startswith("OK") else 1)
    assert result.stdout.splitlines()[0].startswith(expected.split()[0])  # worst first

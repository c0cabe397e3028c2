"""A real `once serve` process on an ephemeral port, and plain HTTP requests to it."""

from __future__ import annotations

import http.client
import signal
import subprocess
from dataclasses import dataclass
from typing import Any

from helpers import ONCE


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    @property
    def type(self) -> str:
        return self.headers.get("Content-Type", "")

    @property
    def text(self) -> str:
        return self.body.decode("utf-8")


class Served:
    """`once serve --listen 127.0.0.1:0 ARGS`: the port is read from its first stderr line."""

    def __init__(self, *args: str, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen([ONCE, "serve", "--listen", "127.0.0.1:0", *args],
                                     env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        assert self.proc.stderr is not None
        self.first_line = self.proc.stderr.readline()  # printed once it listens
        assert "serving http://127.0.0.1:" in self.first_line, (
            self.first_line + self.proc.stderr.read())
        self.port = int(self.first_line.split("http://127.0.0.1:")[1].split("/")[0])
        self.url = f"http://127.0.0.1:{self.port}"

    def get(self, path: str, headers: dict[str, str] | None = None, method: str = "GET",
            timeout: float = 30.0) -> Answer:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            conn.request(method, path, headers=headers or {})
            response = conn.getresponse()
            return Answer(response.status, response.headers, response.read())
        finally:
            conn.close()

    def stop(self, timeout: float = 30.0) -> tuple[int, str]:
        """SIGTERM; its exit status and the rest of its stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, self.first_line + err


def samples(exposition: str) -> set[tuple[str, tuple[tuple[str, str], ...], float]]:
    """Every sample of a Prometheus text exposition, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    return {(s.name, tuple(sorted(s.labels.items())), s.value)
            for family in text_string_to_metric_families(exposition) for s in family.samples}


def families(exposition: str) -> dict[str, Any]:
    from prometheus_client.parser import text_string_to_metric_families

    return {f.name: f.type for f in text_string_to_metric_families(exposition)}

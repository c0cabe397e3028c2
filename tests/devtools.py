"""Headless Chromium driven over the DevTools protocol, with the standard library alone: a
page opened at a given viewport (a phone's or a desktop's), JavaScript evaluated in it (the
page's own Content-Security-Policy does not apply to DevTools), and full-page screenshots.

Only what the browser test needs of the protocol: a WebSocket client for text frames (RFC
6455: masked frames out, unmasked in, no extensions) and Runtime/Page/Emulation commands.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import struct
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from procs import stopped


class Browser:
    """One headless Chromium with one page, until close()."""

    def __init__(self, chromium: str, profile: Path) -> None:
        self.proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--disable-extensions", f"--user-data-dir={profile}",
             "--remote-debugging-port=0", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        assert self.proc.stderr is not None
        deadline = time.monotonic() + 60
        port = None
        while port is None and time.monotonic() < deadline:
            line = self.proc.stderr.readline()
            found = re.search(r"DevTools listening on ws://127\.0\.0\.1:(\d+)/", line)
            port = int(found.group(1)) if found else None
            if not line and self.proc.poll() is not None:
                raise AssertionError("chromium ended before it listened")
        assert port is not None, "chromium never said where DevTools listens"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30) as r:
            pages = [t for t in json.load(r) if t["type"] == "page"]
        self.ws = _WebSocket(pages[0]["webSocketDebuggerUrl"])
        self.next_id = 0
        self.call("Page.enable")
        self.call("Runtime.enable")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        """Send a command; its result (events that come first are dropped)."""
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.receive())
            if message.get("id") == self.next_id:
                assert "error" not in message, (method, message["error"])
                return dict(message.get("result", {}))

    def open(self, url: str, width: int, height: int = 900, mobile: bool = False) -> None:
        """Load url in a viewport width x height CSS pixels (a phone's: mobile, 2x)."""
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=2 if mobile else 1, mobile=mobile)
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + 60
        while self.evaluate("document.readyState") != "complete":
            assert time.monotonic() < deadline, f"{url} never finished loading"
            time.sleep(0.05)

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def screenshot(self, path: Path) -> None:
        """The whole page, as tall as it is, into path (PNG)."""
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        self.ws.close()
        stopped(self.proc)


class _WebSocket:
    """A WebSocket client of text frames."""

    def __init__(self, url: str) -> None:
        found = re.fullmatch(r"ws://([^/:]+):(\d+)(/.*)", url)
        assert found, url
        host, port, path = found.group(1), int(found.group(2)), found.group(3)
        self.sock = socket.create_connection((host, port), timeout=60)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket"
                           f"\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            assert chunk, "DevTools closed the connection during the handshake"
            head += chunk
        assert head.startswith(b"HTTP/1.1 101"), head

    def send(self, text: str) -> None:
        data = text.encode()
        mask = os.urandom(4)
        size = len(data)
        if size < 126:
            frame = struct.pack("!BB", 0x81, 0x80 | size)
        elif size < 1 << 16:
            frame = struct.pack("!BBH", 0x81, 0x80 | 126, size)
        else:
            frame = struct.pack("!BBQ", 0x81, 0x80 | 127, size)
        self.sock.sendall(frame + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def receive(self) -> str:
        """The next whole text message (fragments joined)."""
        parts = []
        while True:
            first, second = self._exactly(2)
            size = second & 0x7F
            if size == 126:
                size = struct.unpack("!H", self._exactly(2))[0]
            elif size == 127:
                size = struct.unpack("!Q", self._exactly(8))[0]
            parts.append(self._exactly(size))
            if first & 0x80:  # FIN
                return b"".join(parts).decode()

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "DevTools closed the connection"
            data += chunk
        return data

    def close(self) -> None:
        self.sock.close()

"""A minimal headless-Chromium driver over the DevTools protocol (no chromedriver here).

Streamlit renders client-side over a websocket, so ``--dump-dom`` returns the empty
shell before the script has run; instead we keep the page open, poll a JavaScript
condition in real time, then read the DOM and take a screenshot.
"""
from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect as ws_connect

from infra.runtime import free_port, wait_until

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars"]


class Chromium:
    """One headless Chromium showing ``url``; use as a context manager."""

    def __init__(self, url: str, profile_dir: Path, width: int = 1400, height: int = 1600) -> None:
        self.port = free_port()
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={profile_dir}", f"--remote-debugging-port={self.port}",
             "--remote-allow-origins=*", f"--window-size={width},{height}", url],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        self._ids = itertools.count(1)
        wait_until(lambda: bool(self._page_ws_url()), timeout_s=30, what="chromium devtools", proc=self.proc)
        self.ws = ws_connect(self._page_ws_url(), max_size=64 * 1024 * 1024, open_timeout=10)

    def _page_ws_url(self) -> str | None:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/json/list", timeout=2) as response:
            targets = json.load(response)
        pages = [t for t in targets if t.get("type") == "page"]
        return pages[0]["webSocketDebuggerUrl"] if pages else None

    def send(self, method: str, **params) -> dict:
        call_id = next(self._ids)
        self.ws.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:  # skip events until our reply arrives
            reply = json.loads(self.ws.recv(timeout=60))
            if reply.get("id") == call_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float) -> None:
        """Poll a JavaScript boolean expression until true (real time, not virtual)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.evaluate(expression):
                return
            time.sleep(0.5)
        raise TimeoutError(f"page never satisfied {expression!r} within {timeout_s:.0f}s")

    def dom(self) -> str:
        return self.evaluate("document.documentElement.outerHTML")

    def screenshot(self, path: Path) -> Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.ws.close()
        finally:  # the whole group: renderer and GPU helpers too
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            except ProcessLookupError:
                pass

    def __enter__(self) -> "Chromium":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

"""A real headless Chromium driven over the Chrome DevTools Protocol (no extra packages).

`headless_chromium()` starts Debian's `chromium` with no network beyond loopback (a proxy on a
closed port: anything the page tried to fetch from the internet would fail) and yields a `Cdp`
session on its first page. Tests skip cleanly when no Chromium is installed.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
BROWSER_TIMEOUT_SECONDS = 60.0
# Where screenshots are kept beyond the test's tmp dir (CI sets it; see .ci/run).
ARTIFACTS_ENV = "AGENT_ENGINE_TEST_ARTIFACTS"


def chromium_path() -> str | None:
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


def require_chromium() -> str:
    found = chromium_path()
    if found is None:
        pytest.skip(
            "no Chromium: `apt-get install chromium`, then run `.venv/bin/pytest -m browser`"
        )
    return found


class Cdp:
    """Just enough of the Chrome DevTools Protocol: navigate, evaluate, wait, screenshot."""

    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.next_id = 0

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        ident = self.next_id
        await self.connection.send(json.dumps({"id": ident, "method": method, "params": params}))
        while True:
            message = json.loads(await self.connection.recv())
            if message.get("id") == ident:
                if "error" in message:
                    raise RuntimeError(message["error"])
                result: dict[str, Any] = message["result"]
                return result

    async def evaluate(self, expression: str) -> Any:
        result = await self.call(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, within_seconds: float = 30.0) -> Any:
        """Poll until truthy; an exception (the page still loading) counts as not yet."""
        deadline = time.monotonic() + within_seconds
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            try:
                value = await self.evaluate(expression)
            except RuntimeError as exc:
                last_error, value = exc, None
            if value:
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression} (last error: {last_error})")

    async def screenshot(self, path: Path) -> Path:
        shot = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        await asyncio.to_thread(_write, path, base64.b64decode(shot["data"]))
        return path


def _write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def keep_artifact(path: Path) -> None:
    """Copy a test artifact (a screenshot) to $AGENT_ENGINE_TEST_ARTIFACTS when set."""
    target = os.environ.get(ARTIFACTS_ENV)
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, Path(target) / path.name)


@asynccontextmanager
async def headless_chromium(*, width: int = 1400, height: int = 1000) -> AsyncIterator[Cdp]:
    chromium = require_chromium()
    # Chromium's helper processes may still write to the profile for a moment after the browser
    # is gone: its whole session is killed below, and a straggling file does not fail the test.
    with tempfile.TemporaryDirectory(prefix="ae-chromium-", ignore_cleanup_errors=True) as profile:
        process = await asyncio.create_subprocess_exec(
            chromium,
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            # No internet: anything not on loopback goes to a closed port and fails.
            "--proxy-server=http://127.0.0.1:9",
            "--remote-debugging-port=0",
            f"--user-data-dir={profile}",
            "about:blank",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + BROWSER_TIMEOUT_SECONDS
            while not port_file.exists() or not port_file.read_text().strip():
                assert process.returncode is None, "chromium exited"
                assert time.monotonic() < deadline, "chromium did not open its debugging port"
                await asyncio.sleep(0.1)
            port = port_file.read_text().split()[0]
            async with httpx.AsyncClient() as client:
                targets = (await client.get(f"http://127.0.0.1:{port}/json/list")).json()
            page = next(t for t in targets if t["type"] == "page")
            async with websockets.connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
                cdp = Cdp(ws)
                await cdp.call("Page.enable")
                yield cdp
        finally:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), BROWSER_TIMEOUT_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # the renderer and other helpers

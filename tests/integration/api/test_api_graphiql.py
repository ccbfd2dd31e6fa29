"""GraphiQL served by the app (offline), health and readiness, and a real headless browser."""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
import websockets

from tests.integration.api.support import Api

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
BROWSER_TIMEOUT_SECONDS = 60.0


async def test_graphiql_page_and_its_assets_are_served_locally(api: Api) -> None:
    page = await api.client.get(f"{api.url}/graphql", headers={"Accept": "text/html"})
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    html = page.text
    assert "isHeadersEditorEnabled: true" in html
    assert "https://" not in html and "http://" not in html.replace("http(s)", "")
    for asset in (
        "graphiql.min.js",
        "graphiql.min.css",
        "react.production.min.js",
        "react-dom.production.min.js",
    ):
        assert f"/static/{asset}" in html
        response = await api.client.get(
            f"{api.url}/static/{asset}", headers={"Accept-Encoding": "gzip"}
        )
        assert response.status_code == 200, asset
        assert len(response.content) > 1000
        # The bundle travels compressed (GraphQL answers do not: not worth their CPU).
        assert response.headers["content-encoding"] == "gzip", asset


async def test_graphql_get_query_still_works(api: Api) -> None:
    response = await api.client.get(
        f"{api.url}/graphql",
        params={"query": "{ __typename }"},
        headers={"Accept": "application/json"},
    )
    assert response.json() == {"data": {"__typename": "Query"}}


async def test_health_and_readiness(api: Api) -> None:
    health = await api.client.get(f"{api.url}/healthz")
    assert health.status_code == 200
    ready = await api.client.get(f"{api.url}/readyz")
    assert ready.status_code == 200
    assert ready.json()["database"] == "ok"


def _chromium() -> str | None:
    for candidate in CHROMIUM_CANDIDATES:
        if Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


class Cdp:
    """Just enough of the Chrome DevTools Protocol: evaluate JavaScript in the page."""

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
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return result["result"].get("value")

    async def wait_for(self, expression: str, within_seconds: float = 30.0) -> Any:
        deadline = time.monotonic() + within_seconds
        while time.monotonic() < deadline:
            value = await self.evaluate(expression)
            if value:
                return value
            await asyncio.sleep(0.2)
        raise AssertionError(f"timed out waiting for {expression}")


@pytest.mark.browser
async def test_graphiql_renders_in_headless_chromium_and_runs_a_query(api: Api) -> None:
    chromium = _chromium()
    if chromium is None:
        pytest.skip(
            "no Chromium: `apt-get install chromium`, then run "
            "`.venv/bin/pytest -m browser tests/integration/api/test_api_graphiql.py`"
        )
    token = api.token(61, name="Browser User", admin=True)
    query = "query FromBrowser { viewer { isAdmin user { displayName } } }"
    params = urlencode({"q": query, "headers": json.dumps({"Authorization": f"Bearer {token}"})})
    with tempfile.TemporaryDirectory(prefix="ae-chromium-") as profile:
        process = await asyncio.create_subprocess_exec(
            *[
                chromium,
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                # No internet: anything not on loopback goes to a closed port and fails.
                "--proxy-server=http://127.0.0.1:9",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                "about:blank",
            ],
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
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
                await cdp.call("Page.navigate", url=f"{api.url}/graphql?{params}")
                await cdp.wait_for("!!document.querySelector('.graphiql-container')")
                await cdp.wait_for("!!document.querySelector('.graphiql-execute-button')")
                await cdp.evaluate("document.querySelector('.graphiql-execute-button').click()")
                result = await cdp.wait_for(
                    "(() => { const r = document.querySelector('.result-window');"
                    " const t = r ? r.innerText : '';"
                    " return t.includes('Browser User') ? t : null })()"
                )
                assert '"isAdmin": true' in result
        finally:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), BROWSER_TIMEOUT_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()

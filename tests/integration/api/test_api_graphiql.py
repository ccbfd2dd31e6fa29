"""GraphiQL served by the app (offline), health and readiness, and a real headless browser."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from tests.integration.api.support import Api
from tests.support.browser import headless_chromium


async def test_graphiql_page_and_its_assets_are_served_locally(api: Api) -> None:
    page = await api.http.get(f"{api.url}/graphql", headers={"Accept": "text/html"})
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
        response = await api.http.get(
            f"{api.url}/static/{asset}", headers={"Accept-Encoding": "gzip"}
        )
        assert response.status_code == 200, asset
        assert len(response.content) > 1000
        # The bundle travels compressed (GraphQL answers do not: not worth their CPU).
        assert response.headers["content-encoding"] == "gzip", asset


async def test_graphql_get_query_still_works(api: Api) -> None:
    response = await api.http.get(
        f"{api.url}/graphql",
        params={"query": "{ __typename }"},
        headers={"Accept": "application/json"},
    )
    assert response.json() == {"data": {"__typename": "Query"}}


async def test_health_and_readiness(api: Api) -> None:
    health = await api.http.get(f"{api.url}/healthz")
    assert health.status_code == 200
    ready = await api.http.get(f"{api.url}/readyz")
    assert ready.status_code == 200
    assert ready.json()["database"] == "ok"


@pytest.mark.browser
async def test_graphiql_renders_in_headless_chromium_and_runs_a_query(api: Api) -> None:
    token = api.token(61, name="Browser User", admin=True)
    query = "query FromBrowser { viewer { isAdmin user { displayName } } }"
    params = urlencode({"q": query, "headers": json.dumps({"Authorization": f"Bearer {token}"})})
    async with headless_chromium() as cdp:
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

"""`GET /oauth/callback`: where an authorization server sends the owner's browser back.

The answer is a small HTML page saying what happened ("Connected — you can close this tab", or
what went wrong and what to do), or, with AGENT_ENGINE_CONNECT_RETURN_URL, a redirect there with
`outcome` (connected, denied, bad_state, used_state, expired_state, issuer_mismatch, code_refused,
source_gone, error) and `source`. Nothing a browser sends makes it answer 500: an unexpected
failure is logged and shown as a page. The page carries no code, state or token, and is not
cached; the Referrer-Policy keeps the callback's query out of any later request.
"""

from __future__ import annotations

import html
import logging
from urllib.parse import urlencode, urlsplit

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from agent_engine.api.state import state_of
from agent_engine.oauth.flow import Outcome, complete_connection

log = logging.getLogger(__name__)

HEADERS = {
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
    "X-Content-Type-Options": "nosniff",
}

PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>body{{font-family:system-ui,sans-serif;max-width:36rem;margin:4rem auto;padding:0 1rem}}
h1{{font-size:1.4rem}}</style></head>
<body><h1>{title}</h1><p>{message}</p></body></html>
"""


def page(outcome: Outcome) -> HTMLResponse:
    if outcome.ok:
        title = "Connected — you can close this tab"
        who = f" as {outcome.account}" if outcome.account else ""
        message = f"Your account{who} is connected to {outcome.source_name}."
    else:
        title = "Not connected"
        message = outcome.message
    body = PAGE.format(title=html.escape(title), message=html.escape(message))
    return HTMLResponse(body, status_code=200 if outcome.ok else 400, headers=HEADERS)


async def oauth_callback(request: Request) -> Response:
    state = state_of(request)
    settings = state["settings"]
    keys = settings.token_keyring()
    if keys is None:
        outcome = Outcome(
            False,
            "The engine has no token keys (AGENT_ENGINE_TOKEN_KEYS): an administrator must set"
            " them before accounts can be connected.",
        )
    else:
        params = {k: request.query_params[k] for k in request.query_params}
        try:
            outcome = await complete_connection(
                state["engine"], params, keys=keys, seconds=settings.oauth_timeout_seconds
            )
        except Exception:
            log.exception("oauth callback failed")
            outcome = Outcome(False, "Something went wrong on the engine's side; start again.")
    if settings.connect_return_url:
        query = {"outcome": outcome.code}
        if outcome.source_name:
            query["source"] = outcome.source_name
        target = settings.connect_return_url
        joiner = "&" if urlsplit(target).query else "?"
        return RedirectResponse(f"{target}{joiner}{urlencode(query)}", 303, headers=HEADERS)
    return page(outcome)

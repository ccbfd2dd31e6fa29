"""The dashboard's link to a run's trace: `AGENT_ENGINE_TRACE_URL_TEMPLATE` (settings.py checks it:
http(s), with `{trace_id}`) put on the page's `<body>` as a data attribute the script reads."""

from __future__ import annotations

from html import escape

BODY_TAG = "<body>"


def with_trace_url(page: str, template: str | None) -> str:
    """`page` with the template on its body (`data-trace-url-template`), escaped; unchanged
    without one."""
    if not template:
        return page
    return page.replace(
        BODY_TAG, f'<body data-trace-url-template="{escape(template, quote=True)}">', 1
    )

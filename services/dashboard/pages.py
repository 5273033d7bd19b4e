"""Server-rendered pages that must work without the web bundle: login, 404,
errors, and the page shown when the UI was not built."""

from __future__ import annotations

import html

from fastapi.responses import HTMLResponse

STYLE = """
body{font:15px/1.5 system-ui,sans-serif;background:#f6f7f9;color:#1d2330;margin:0}
main{max-width:560px;margin:12vh auto;background:#fff;border:1px solid #dde1e7;border-radius:8px;padding:28px 32px}
h1{font-size:20px;margin:0 0 12px}code{background:#eef1f5;padding:1px 5px;border-radius:4px}
input{font:inherit;padding:6px 8px;width:70%;border:1px solid #bcc3cd;border-radius:4px}
button{font:inherit;padding:6px 14px;border:0;border-radius:4px;background:#2f6fde;color:#fff;cursor:pointer}
.err{color:#b3261e}a{color:#2f6fde}
"""


def _page(title: str, body: str, status: int) -> HTMLResponse:
    doc = (
        f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)} · harnessrl</title>"
        f"<meta name=viewport content='width=device-width,initial-scale=1'><style>{STYLE}</style></head>"
        f"<body><main>{body}</main></body></html>"
    )
    return HTMLResponse(doc, status_code=status)


def login(next_path: str, why: str, status: int = 401) -> HTMLResponse:
    body = (
        "<h1>harnessrl dashboard</h1>"
        f"<p class=err>{html.escape(why)}</p>"
        "<form method=post action='/login'>"
        f"<input type=hidden name=next value='{html.escape(next_path, quote=True)}'>"
        "<input type=password name=token placeholder='dashboard token' autofocus> <button>Sign in</button></form>"
        "<p>The token is printed by <code>harnessrl dashboard serve</code> or set as "
        "<code>[dashboard] auth_token</code>.</p>"
    )
    return _page("sign in", body, status)


def not_found(message: str) -> HTMLResponse:
    body = f"<h1>Not found</h1><p>{html.escape(message)}</p><p><a href='/'>All runs</a></p>"
    return _page("not found", body, 404)


def error(status: int, message: str) -> HTMLResponse:
    body = f"<h1>Error {status}</h1><p>{html.escape(message)}</p><p><a href='/'>All runs</a></p>"
    return _page("error", body, status)


def not_built(web_dir: str) -> HTMLResponse:
    body = (
        "<h1>The web UI is not built</h1>"
        f"<p>No <code>index.html</code> in <code>{html.escape(web_dir)}</code>. Run "
        "<code>scripts/build_web.sh</code> (setup does), then reload.</p>"
        "<p>The JSON API under <code>/api/</code> works without it.</p>"
    )
    return _page("not built", body, 503)

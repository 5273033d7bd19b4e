"""Token protection of every page and API route but ``/healthz`` and the login page.

A browser gives the token once (the login form, or ``?token=`` in a link the
CLI prints) and gets an HttpOnly, SameSite=Strict cookie holding an HMAC of it,
never the token itself. API clients may send ``Authorization: Bearer``. A wrong
or missing token is 401 (JSON for ``/api``, the login page otherwise).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from fastapi import Request, Response
from fastapi.responses import JSONResponse, RedirectResponse

from services.dashboard import pages

COOKIE = "harnessrl_dashboard"
OPEN_PATHS = ("/healthz", "/login")


class TokenAuth:
    def __init__(self, token: str | None) -> None:
        self._token = token
        key = (token or "").encode()
        self._session = hmac.new(key, b"harnessrl-dashboard-session", hashlib.sha256).hexdigest() if token else ""

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def check_token(self, given: str) -> bool:
        return self._token is not None and hmac.compare_digest(given.encode(), self._token.encode())

    def authenticated(self, request: Request) -> bool:
        if self._token is None:
            return True
        cookie = request.cookies.get(COOKIE, "")
        if cookie and hmac.compare_digest(cookie, self._session):
            return True
        header = request.headers.get("authorization", "")
        return header.startswith("Bearer ") and self.check_token(header[7:])

    def set_cookie(self, response: Response) -> Response:
        response.set_cookie(COOKIE, self._session, httponly=True, samesite="strict", path="/")
        return response

    async def middleware(self, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        path = request.url.path
        if self._token is None or path in OPEN_PATHS:
            return await call_next(request)
        given = request.query_params.get("token")
        if given is not None:
            if not self.check_token(given):
                return _deny(request, "wrong token")
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = path + (f"?{urlencode(rest)}" if rest else "")
            return self.set_cookie(RedirectResponse(target, status_code=303))
        if self.authenticated(request):
            return await call_next(request)
        return _deny(request, "sign in with the dashboard's token")


def _deny(request: Request, why: str) -> Response:
    if request.url.path.startswith("/api/"):
        return JSONResponse({"error": f"unauthenticated: {why}"}, status_code=401)
    return pages.login(request.url.path, why, status=401)

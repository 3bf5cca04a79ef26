"""What every request passes before it reaches a route: the bearer token (compared in
constant time with every configured token; a read-only token may only read) and the bound on
the body's size, enforced before the body is parsed. A refused request is logged without its
token."""

from __future__ import annotations

import hmac
import logging
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.responses import HTMLResponse, JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rollserve.errors import (
    ForbiddenError,
    InvalidInputError,
    RequestTooLargeError,
    RollserveError,
    UnauthorizedError,
)
from rollserve.server.ui.pages import sign_in_page
from rollserve.settings import Settings

log = logging.getLogger(__name__)

# Open without a token: probes, the API's own description, and the viewer's sign-in page.
OPEN_PATHS = frozenset({"/healthz", "/readyz", "/openapi.json", "/docs", "/redoc", "/ui/login"})
# A running job's gateway: its per-job key in the path is the secret (agents send their own
# API key, which the gateway ignores).
OPEN_PREFIXES = ("/v1/gateway/",)
READING = frozenset({"GET", "HEAD", "OPTIONS"})
# The web viewer's session: the token, in an HttpOnly cookie set by /ui/login. It is taken for
# reading only, so that no other site can make a browser write with it.
COOKIE = "rollserve_token"


@dataclass(frozen=True)
class _Token:
    name: str
    secret: bytes
    read_only: bool


def tokens(settings: Settings) -> list[_Token]:
    """The tokens a server accepts (none: the API is open)."""
    found = [_Token(t.name, t.secret().encode(), t.read_only) for t in settings.api_tokens]
    if settings.api_token is not None:
        found.append(_Token("api_token", settings.api_token.encode(), False))
    names = [t.name for t in found]
    if len(set(names)) != len(names):
        raise InvalidInputError(f"api_tokens: names must differ, got {names}")
    return found


def matching(known: list[_Token], offered: bytes) -> _Token | None:
    """The token ``offered`` is. Every token is compared, in constant time: how long it takes
    says nothing of which one matched, or how much of one."""
    found: _Token | None = None
    for token in known:
        if hmac.compare_digest(offered, token.secret):
            found = token
    return found


class Guard:
    """ASGI middleware in front of the whole app."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.tokens = tokens(settings)
        self.max_bytes = int(settings.max_request_mb * 1024 * 1024)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        try:
            scope.setdefault("state", {})["token"] = self._authorize(scope, headers)
            body = await self._body(headers, receive)
        except RollserveError as exc:
            client = scope.get("client") or ("?", 0)
            log.warning(
                "refused %s %s from %s: %s", scope["method"], scope["path"], client[0], exc.message
            )
            page = scope["path"] == "/ui" or scope["path"].startswith("/ui/")
            if page and isinstance(exc, UnauthorizedError) and scope["method"] in READING:
                await HTMLResponse(sign_in_page(exc.message), exc.http_status)(scope, receive, send)
                return
            await JSONResponse(exc.to_dict(), exc.http_status)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: a disconnect (a long-poll's client left)

        await self.app(scope, replay, send)

    def _authorize(self, scope: Scope, headers: Headers) -> str | None:
        """The name of the request's token (None when the API is open or the path is)."""
        path = scope["path"]
        if not self.tokens or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return None
        given = headers.get("authorization", "")
        scheme, _, value = given.partition(" ")
        offered = value.strip().encode() if scheme.lower() == "bearer" else b""
        if not given and scope["method"] in READING:
            given = cookie = _cookie(headers, COOKIE)
            offered = cookie.encode()
        match = matching(self.tokens, offered)
        if match is None:
            reason = "a valid bearer token is required" if given else "no bearer token given"
            raise UnauthorizedError(reason)
        if match.read_only and scope["method"] not in READING:
            raise ForbiddenError(
                f"token {match.name!r} is read-only: {scope['method']} {scope['path']} needs "
                "a token that may write",
                token=match.name,
            )
        return match.name

    async def _body(self, headers: Headers, receive: Receive) -> bytes:
        """The whole body, refused as soon as it is known to pass the bound."""
        declared = headers.get("content-length")
        if declared is not None:
            if not declared.isdigit():
                raise InvalidInputError(f"Content-Length {declared!r} is not a number")
            if int(declared) > self.max_bytes:
                raise self._too_large(int(declared))
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left before sending it all
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                raise self._too_large(size)
            chunks.append(chunk)
            more = message.get("more_body", False)
        return b"".join(chunks)

    def _too_large(self, size: int) -> RequestTooLargeError:
        return RequestTooLargeError(
            f"the request body has {size} bytes or more; this server takes at most "
            f"{self.max_bytes} (max_request_mb)",
            bound=self.max_bytes,
        )


def _cookie(headers: Headers, name: str) -> str:
    return cookie_parser(headers.get("cookie", "")).get(name, "")

"""The viewer's routes: the page at ``/ui/``, its assets at ``/ui/static/``, and the sign-in
that keeps a token in an HttpOnly cookie (the guard takes that cookie for reading only)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs

from fastapi import APIRouter, FastAPI, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles

from rollserve.server.guard import COOKIE, matching, tokens
from rollserve.server.ui.pages import sign_in_page
from rollserve.settings import Settings

STATIC = Path(__file__).parent / "static"
_SESSION_S = 7 * 24 * 3600


def mount_ui(app: FastAPI, settings: Settings | None) -> None:
    """Serve the viewer from ``app``; ``settings`` None: a viewer without tokens (offline)."""
    known = tokens(settings) if settings is not None else []
    router = APIRouter(include_in_schema=False)

    @router.get("/ui")
    async def bare() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    @router.get("/ui/")
    async def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    @router.get("/ui/login")
    async def sign_in_form() -> HTMLResponse:
        return HTMLResponse(sign_in_page())

    @router.post("/ui/login")
    async def sign_in(request: Request) -> Response:
        form = parse_qs((await request.body()).decode(errors="replace"))
        offered = (form.get("token") or [""])[0].strip()
        if known and matching(known, offered.encode()) is None:
            return HTMLResponse(sign_in_page("that token is not one this server accepts"), 401)
        answer = RedirectResponse("/ui/", status_code=303)
        answer.set_cookie(
            COOKIE,
            offered,
            max_age=_SESSION_S,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    @router.get("/ui/logout")
    async def sign_out() -> Response:
        answer = RedirectResponse("/ui/login", status_code=303)
        answer.delete_cookie(COOKIE, path="/")
        return answer

    app.include_router(router)
    app.mount("/ui/static", StaticFiles(directory=STATIC), name="ui-static")

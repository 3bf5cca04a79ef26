"""A container registry (Docker Registry HTTP API v2, read-only) serving OCI layout directories
in a background thread: a stand-in for a cluster's local registry mirror, for tests and for
serving images built with :func:`rollserve.testing.oci.build_image` to other nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Self

from fastapi import FastAPI, Header, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from rollserve.testing.threaded import ThreadedServer

_MANIFEST = "application/vnd.oci.image.manifest.v1+json"


class LocalRegistry:
    """Serves ``repositories`` (name → OCI layout directory, as ``build_image(fmt="oci")``
    writes). With ``token`` set, it answers 401 with a bearer challenge until a client
    fetched that token from its ``/token`` realm, as Docker Hub does."""

    def __init__(self, repositories: dict[str, Path], token: str | None = None) -> None:
        self.repositories = repositories
        self.token = token
        self.port = 0
        self.requests: list[str] = []  # paths asked for, in order
        self._runner = ThreadedServer("local-registry")

    @property
    def host(self) -> str:
        """``127.0.0.1:PORT``, the registry part of an image reference."""
        return f"127.0.0.1:{self.port}"

    def _app(self) -> FastAPI:
        app = FastAPI()

        def denied(authorization: str | None) -> Response | None:
            if self.token is None or authorization == f"Bearer {self.token}":
                return None
            realm = f'Bearer realm="http://{self.host}/token",service="local",scope="pull"'
            return JSONResponse(
                {"errors": [{"code": "UNAUTHORIZED"}]},
                status_code=401,
                headers={"WWW-Authenticate": realm},
            )

        @app.get("/token")
        def token() -> dict[str, str | None]:
            return {"token": self.token}

        @app.get("/v2/")
        def root(authorization: str | None = Header(None)) -> Response:
            return denied(authorization) or JSONResponse({})

        @app.get("/v2/{name:path}/manifests/{reference}")
        def manifest(
            name: str, reference: str, request: Request, authorization: str | None = Header(None)
        ) -> Response:
            self.requests.append(request.url.path)
            refused = denied(authorization)
            if refused is not None:
                return refused
            layout = self.repositories.get(name)
            if layout is None:
                return JSONResponse({"errors": [{"code": "NAME_UNKNOWN"}]}, status_code=404)
            digest = reference if reference.startswith("sha256:") else None
            if digest is None:
                index = json.loads((layout / "index.json").read_text())
                for entry in index.get("manifests", []):
                    tag = (entry.get("annotations") or {}).get("org.opencontainers.image.ref.name")
                    if tag == reference:
                        digest = entry["digest"]
            blob = layout / "blobs" / "sha256" / (digest or "").removeprefix("sha256:")
            if digest is None or not blob.is_file():
                return JSONResponse({"errors": [{"code": "MANIFEST_UNKNOWN"}]}, status_code=404)
            data = blob.read_bytes()
            media = json.loads(data).get("mediaType", _MANIFEST)
            return Response(data, media_type=media, headers={"Docker-Content-Digest": digest})

        @app.get("/v2/{name:path}/blobs/{digest}")
        def blob(
            name: str, digest: str, request: Request, authorization: str | None = Header(None)
        ) -> Response:
            self.requests.append(request.url.path)
            refused = denied(authorization)
            if refused is not None:
                return refused
            layout = self.repositories.get(name)
            path = layout / "blobs" / "sha256" / digest.removeprefix("sha256:") if layout else None
            if path is None or not path.is_file():
                return JSONResponse({"errors": [{"code": "BLOB_UNKNOWN"}]}, status_code=404)
            return FileResponse(path, media_type="application/octet-stream")

        return app

    def start(self) -> Self:
        """Serve in a background thread; returns once the port accepts connections."""
        self.port = self._runner.start(self._app())
        return self

    def stop(self) -> None:
        self._runner.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

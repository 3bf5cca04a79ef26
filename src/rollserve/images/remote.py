"""``docker://REF``: images pulled from a container registry over the Docker Registry HTTP API
v2 (the OCI distribution protocol), anonymously or with the registry's bearer-token challenge;
docker.io images come from ``registry_mirror`` when one is set (a cluster's local mirror)."""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import httpx

from rollserve.errors import ImageConversionError, ImageCorruptError, ImageNotFoundError
from rollserve.images.base import Located
from rollserve.images.oci import INDEX_TYPES, Layer, Manifest, OciOpened, host_platform

DOCKER_HUB = "registry-1.docker.io"
_ACCEPT = ", ".join(
    [
        "application/vnd.oci.image.index.v1+json",
        "application/vnd.oci.image.manifest.v1+json",
        "application/vnd.docker.distribution.manifest.list.v2+json",
        "application/vnd.docker.distribution.manifest.v2+json",
    ]
)
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")


@dataclass(frozen=True)
class Reference:
    """A parsed ``docker://[REGISTRY/]NAME[:TAG][@DIGEST]``."""

    registry: str
    name: str
    reference: str  # a tag or a digest

    @classmethod
    def parse(cls, ref: str) -> Reference:
        rest = ref.removeprefix("docker://")
        digest = None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
        first, _, remainder = rest.partition("/")
        if remainder and ("." in first or ":" in first or first == "localhost"):
            registry, path = first, remainder
        else:
            registry, path = "docker.io", rest
        tag = "latest"
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
        if not path or not re.fullmatch(r"[a-z0-9]+(?:[._/-][a-z0-9]+)*", path):
            raise ImageNotFoundError(f"{ref!r} is not a valid image reference", image=ref)
        if registry == "docker.io" and "/" not in path:
            path = f"library/{path}"
        return cls(registry=registry, name=path, reference=digest or tag)


class RegistryClient:
    """One registry's v2 API, with its bearer-token dance."""

    def __init__(self, base_url: str, timeout_s: float) -> None:
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(timeout=timeout_s, follow_redirects=True)
        self.token: str | None = None

    def close(self) -> None:
        self.http.close()

    def get(self, path: str, accept: str | None = None, stream: bool = False) -> httpx.Response:
        url = f"{self.base_url}/v2/{path}"
        for _ in range(2):
            headers = {"Accept": accept} if accept else {}
            if self.token:
                headers["Authorization"] = f"Bearer {self.token}"
            request = self.http.build_request("GET", url, headers=headers)
            response = self.http.send(request, stream=stream)
            if response.status_code != 401 or self.token is not None:
                return response
            challenge = response.headers.get("www-authenticate", "")
            response.close()
            self.token = self._token(challenge)
        return response

    def _token(self, challenge: str) -> str:
        if not challenge.lower().startswith("bearer"):
            raise ImageConversionError(f"{self.base_url} asks for credentials ({challenge})")
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", None)
        if realm is None:
            raise ImageConversionError(f"{self.base_url}: a token challenge without a realm")
        response = self.http.get(realm, params=params)
        if response.status_code != 200:
            raise ImageConversionError(f"{realm} refused a token: HTTP {response.status_code}")
        body = response.json()
        return str(body.get("token") or body.get("access_token"))


class RegistryBlobs:
    """A registry's blobs of one repository; each is fetched whole into ``scratch`` before it
    is read, so a download cut short fails before anything of it is applied."""

    def __init__(self, client: RegistryClient, reference: Reference, scratch: Path, name: str):
        self.client = client
        self.reference = reference
        self.scratch = scratch
        self.name = name

    def open(self, location: str) -> IO[bytes]:
        self.scratch.mkdir(parents=True, exist_ok=True)
        out = tempfile.TemporaryFile(dir=self.scratch, prefix="blob-")  # noqa: SIM115 (the caller closes it)
        response = self.client.get(f"{self.reference.name}/blobs/{location}", stream=True)
        try:
            _check(response, self.name, f"blob {location}")
            for chunk in response.iter_bytes(1 << 20):
                out.write(chunk)
        except httpx.HTTPError as exc:
            out.close()
            raise ImageConversionError(f"{self.name}: pulling {location} failed: {exc}") from exc
        except BaseException:
            out.close()
            raise
        finally:
            response.close()
        out.seek(0)
        return out

    def exists(self, location: str) -> bool:
        return True


def _check(response: httpx.Response, name: str, what: str) -> None:
    if response.status_code == 404:
        raise ImageNotFoundError(f"{name}: the registry has no {what}", image=name)
    if response.status_code != 200:
        raise ImageConversionError(
            f"{name}: the registry answered HTTP {response.status_code} for {what}", image=name
        )


def _json(response: httpx.Response, name: str) -> tuple[dict[str, Any], str]:
    raw = response.content
    try:
        return json.loads(raw), "sha256:" + hashlib.sha256(raw).hexdigest()
    except json.JSONDecodeError as exc:
        raise ImageCorruptError(f"{name}: the registry sent invalid JSON: {exc}") from exc


class RegistrySource:
    """Images named ``docker://[REGISTRY/]NAME[:TAG][@DIGEST]``."""

    name = "docker"

    def __init__(
        self,
        scratch: Path,
        mirror: str | None = None,
        insecure: list[str] | None = None,
        timeout_s: float = 300.0,
    ) -> None:
        self.scratch = scratch  # where layers are downloaded to, whole, before unpacking
        self.mirror = mirror
        self.insecure = set(insecure or [])
        self.timeout_s = timeout_s

    def claims(self, ref: str) -> bool:
        return ref.startswith("docker://")

    def locate(self, ref: str) -> Located:
        Reference.parse(ref)
        return Located(stamp=ref)  # a tag moves only when pulled again (rollserve images pull)

    def base_url(self, reference: Reference) -> str:
        if reference.registry == "docker.io":
            return self.mirror or f"https://{DOCKER_HUB}"
        host = reference.registry
        plain = host in self.insecure or host.split(":")[0] in _LOCAL_HOSTS
        return f"{'http' if plain else 'https'}://{host}"

    @contextmanager
    def open(self, ref: str) -> Iterator[OciOpened]:
        reference = Reference.parse(ref)
        client = RegistryClient(self.base_url(reference), self.timeout_s)
        try:
            manifest = self._manifest(client, reference, reference.reference, ref)
            yield OciOpened(RegistryBlobs(client, reference, self.scratch, ref), manifest, ref)
        except httpx.HTTPError as exc:
            raise ImageConversionError(
                f"cannot reach the registry of {ref} ({client.base_url}): {exc}", image=ref
            ) from exc
        finally:
            client.close()

    def _manifest(
        self, client: RegistryClient, reference: Reference, which: str, ref: str
    ) -> Manifest:
        response = client.get(f"{reference.name}/manifests/{which}", accept=_ACCEPT)
        _check(response, ref, f"manifest {which}")
        document, digest = _json(response, ref)
        if document.get("mediaType") in INDEX_TYPES or "manifests" in document:
            want = host_platform()
            for entry in document.get("manifests") or []:
                plat = entry.get("platform") or {}
                if (plat.get("os"), plat.get("architecture")) == want:
                    return self._manifest(client, reference, str(entry["digest"]), ref)
            raise ImageNotFoundError(f"{ref} has no image for {want[0]}/{want[1]}", image=ref)
        config_digest = str((document.get("config") or {}).get("digest", ""))
        config_response = client.get(f"{reference.name}/blobs/{config_digest}")
        _check(config_response, ref, f"config {config_digest}")
        config, got = _json(config_response, ref)
        if got != config_digest:
            raise ImageCorruptError(f"{ref}: config {config_digest} hashes to {got}", image=ref)
        layers = [
            Layer(digest=str(entry["digest"]), location=str(entry["digest"]))
            for entry in document.get("layers") or []
        ]
        return Manifest(digest=digest, config=config, layers=layers)

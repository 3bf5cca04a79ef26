"""The one error tree of rollserve: every error has a stable code and an HTTP status."""

from __future__ import annotations

from typing import Any, ClassVar


class RollserveError(Exception):
    """Base of every error rollserve raises on purpose."""

    code: ClassVar[str] = "rollserve_error"
    http_status: ClassVar[int] = 500

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict[str, Any]:
        """The JSON error body: ``{"error": {code, message, details}}``."""
        return {"error": {"code": self.code, "message": self.message, "details": self.details}}


# --- bad input: the caller can fix it -------------------------------------------------------


class InvalidInputError(RollserveError):
    """The request names something wrong; the message says what."""

    code = "invalid_input"
    http_status = 422


class UnknownNameError(InvalidInputError):
    """A plug-in name (backend, handler, agent) that is not registered."""

    code = "unknown_name"
    http_status = 400

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"unknown {kind} {name!r}; known: {listed}", kind=kind, name=name, known=sorted(known)
        )


class ImageNotFoundError(InvalidInputError):
    """A sandbox image (root filesystem, SIF file, sandbox directory) that does not exist."""

    code = "image_not_found"


class TemplateNotFoundError(InvalidInputError):
    """A workspace template directory that does not exist."""

    code = "template_not_found"


class InvalidCommandError(InvalidInputError):
    """A command that cannot be run at all (a NUL byte, an empty argv)."""

    code = "invalid_command"


class SandboxPathError(InvalidInputError):
    """A file path that cannot be read or written in the sandbox."""

    code = "sandbox_path"


# --- states the caller ran into ---------------------------------------------------------------


class SandboxClosedError(RollserveError):
    """The sandbox was closed (by its owner or by its wall-time limit) before the call."""

    code = "sandbox_closed"
    http_status = 409


class ShellExitedError(RollserveError):
    """The shell exited on its own (the command ran ``exit``); the sandbox itself is fine."""

    code = "shell_exited"
    http_status = 409


class ShellBusyError(RollserveError):
    """A shell call was made while another command of the same session is still pending."""

    code = "shell_busy"
    http_status = 409


class RemoteError(RollserveError):
    """An error a rollserve server answered with (its code and status are kept)."""

    def __init__(self, status: int, code: str, message: str, **details: Any) -> None:
        super().__init__(message, **details)
        self.status = status
        self.remote_code = code

    def __str__(self) -> str:
        return f"[{self.remote_code}] HTTP {self.status}: {self.message}"


class UnauthorizedError(RollserveError):
    """The API needs a valid bearer token."""

    code = "unauthorized"
    http_status = 401


class ForbiddenError(RollserveError):
    """The token is valid but may not do this (a read-only token that writes)."""

    code = "forbidden"
    http_status = 403


class RequestTooLargeError(RollserveError):
    """A request body over the server's bound (``max_request_mb``)."""

    code = "request_too_large"
    http_status = 413


class NotFoundError(RollserveError):
    """Nothing of that kind has this id."""

    code = "not_found"
    http_status = 404


class JobNotFoundError(NotFoundError):
    """No job has this id (or it outlived the result retention)."""

    code = "job_not_found"


class BackendNotFoundError(NotFoundError):
    """No inference backend is registered under this id."""

    code = "backend_not_found"


class QueueFullError(RollserveError):
    """The queue is at its bound: nothing is accepted that would not be kept."""

    code = "queue_full"
    http_status = 429


class JobConflictError(RollserveError):
    """A job id that already names a different request."""

    code = "job_conflict"
    http_status = 409


class LeaseLostError(RollserveError):
    """A worker's lease on a job expired or was taken over: it must drop the job."""

    code = "lease_lost"
    http_status = 409


class StaleRolloutError(RollserveError):
    """A rollout would exceed its job's bound on policy staleness: the job ends ``stale``,
    unevaluated, for the trainer to drop or resubmit."""

    code = "stale"
    http_status = 409


# --- infrastructure failures: retried, never turned into a reward -----------------------------


class InfrastructureError(RollserveError):
    """A failure of rollserve's own machinery, not of the agent."""

    code = "infrastructure"
    http_status = 503


class LayerLostError(InfrastructureError):
    """What a run kept for its evaluation is gone (its layer: another node's, a lost data
    directory; its output): the job runs again from the start."""

    code = "layer_lost"


class BackendUnavailableError(InfrastructureError):
    """A backend cannot serve: an inference server that does not answer, times out or answers
    something malformed (the call fails over), or a sandbox backend that cannot run on this
    host (a missing binary or kernel feature)."""

    code = "backend_unavailable"


class BackendRequestError(InfrastructureError):
    """An inference backend refused a well-formed request (its answer is in the message)."""

    code = "backend_request_refused"

    @property
    def final(self) -> bool:
        """A 4xx that the same request would meet again (not a timeout, a conflict or a rate
        limit): no retry."""
        status = self.details.get("status")
        return (
            isinstance(status, int) and 400 <= status < 500 and status not in (408, 409, 425, 429)
        )


class SandboxStartError(InfrastructureError):
    """A sandbox or its shell failed to start."""

    code = "sandbox_start_failed"


class ImageConversionError(InfrastructureError):
    """An image could not be made runnable (unpacked into the image cache, pulled)."""

    code = "image_conversion_failed"


class ImageCorruptError(ImageConversionError):
    """An image's archive, manifest or layers are unreadable or fail their digests."""

    code = "image_corrupt"


class ImageCacheFullError(ImageConversionError):
    """The image cache has no room for an image (its size bound, or its disk)."""

    code = "image_cache_full"


class SandboxDiedError(InfrastructureError):
    """The sandbox's processes died underneath a running command."""

    code = "sandbox_died"


class StoreUnavailableError(InfrastructureError):
    """The job store does not answer (a database restarting, a network partition)."""

    code = "store_unavailable"


class StoreSchemaError(RollserveError):
    """The job store's schema is newer than this rollserve knows: upgrade rollserve."""

    code = "store_schema"
    http_status = 500

"""The one settings object; the only module that reads the environment (``ROLLSERVE_*``)."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import tomllib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from rollserve.errors import InvalidInputError


def _default_data_dir() -> Path:
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "rollserve"


def _default_host_binds() -> list[Path]:
    # The interpreter that runs rollserve may live outside /usr (pyenv, conda): bind its
    # prefix so that Python inside a host-image sandbox (and task venvs) has an interpreter.
    prefix = Path(sys.base_prefix).resolve()
    usr = Path("/usr")
    return [] if prefix == usr or usr in prefix.parents else [prefix]


class ApiToken(BaseModel):
    """A named bearer token: one per trainer, team or dashboard. A ``read_only`` one may read
    (GET) but not submit, cancel, register or pause."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=100)
    token: SecretStr | None = Field(None, description="the token itself")
    token_file: Path | None = Field(None, description="or a file that holds it (a secret mount)")
    read_only: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> ApiToken:
        if (self.token is None) == (self.token_file is None):
            raise ValueError(f"token {self.name!r}: give exactly one of token and token_file")
        return self

    def secret(self) -> str:
        """The token, read from its file when it has one."""
        if self.token is not None:
            value = self.token.get_secret_value()
        else:
            assert self.token_file is not None
            try:
                value = self.token_file.read_text().strip()
            except OSError as exc:
                raise InvalidInputError(
                    f"token {self.name!r}: cannot read {self.token_file}: {exc.strerror}"
                ) from None
        if len(value) < 16:
            raise InvalidInputError(f"token {self.name!r} is shorter than 16 characters")
        return value


class Settings(BaseSettings):
    """Everything configurable about a rollserve process, read once at the edge."""

    model_config = SettingsConfigDict(env_prefix="ROLLSERVE_", extra="forbid")

    data_dir: Path = Field(
        default_factory=_default_data_dir, description="SQLite store and sandbox state live here"
    )
    store_url: str | None = Field(
        None,
        description="the job store: sqlite://PATH (default: DATA_DIR/jobs.db) or "
        "postgresql://USER@HOST:PORT/DB; the scheme picks the store",
    )
    store_password: SecretStr | None = Field(
        None, description="the PostgreSQL password, if not in store_url (never logged)"
    )
    store_password_file: Path | None = Field(
        None, description="a file holding the PostgreSQL password (e.g. a mounted secret)"
    )
    store_pool_size: int = Field(
        10, ge=1, description="connections a node keeps to a PostgreSQL store at most"
    )
    node_id: str | None = Field(
        None, description="this node's stable name in the fleet (default: the host name)"
    )
    default_sandbox_backend: str = "bwrap"
    tools_dir: Path = Field(
        Path("/opt/rollserve"),
        description="where scripts/install-apptainer.sh puts Apptainer and images",
    )
    images_dir: Path | None = Field(
        None, description="named sandbox images; default TOOLS_DIR/images"
    )
    image_cache_dir: Path | None = Field(
        None, description="converted images (content-addressed); default TOOLS_DIR/image-cache"
    )
    image_cache_max_gb: float = Field(
        200.0, gt=0, description="the image cache's size bound; least recently used go first"
    )
    image_workspace: Literal["auto", "overlay", "copy"] = Field(
        "auto",
        description="how a workspace inside an image is made writable per sandbox: an overlay "
        "mount (needs root), a private copy, or the overlay where it can be mounted",
    )
    registry_mirror: str | None = Field(
        None, description="pull docker.io images (docker://) from this registry URL instead"
    )
    registry_insecure: list[str] = Field(
        default_factory=list, description="registries (host:port) reached over plain HTTP"
    )
    registry_timeout_s: float = Field(300.0, gt=0, description="one registry request at most")
    bwrap_binary: str = "bwrap"
    bwrap_host_binds: list[Path] = Field(
        default_factory=_default_host_binds, description="extra read-only binds for the host image"
    )
    apptainer_binary: str | None = Field(
        None, description="apptainer or singularity executable; default: search PATH for both"
    )
    apptainer_userns: bool = Field(True, description="pass --userns (no setuid starter needed)")
    cgroup_root: Path = Path("/sys/fs/cgroup")
    sandbox_start_timeout_s: float = 60.0
    # The pipeline: each stage has its own pool, and active-time limits (queueing never counts).
    init_workers: int = Field(8, ge=1)
    run_workers: int = Field(64, ge=1)
    eval_workers: int = Field(8, ge=1)
    max_queued: int = Field(10_000, ge=1, description="unfinished jobs accepted at most")
    init_timeout_s: float = Field(300.0, gt=0)
    run_timeout_s: float = Field(3600.0, gt=0)
    eval_timeout_s: float = Field(1800.0, gt=0)
    evaluate_timed_out_runs: bool = True
    max_attempts: int = Field(3, ge=1, description="tries of a job hit by infrastructure failures")
    retry_backoff_s: float = Field(1.0, ge=0)
    lease_s: float = Field(30.0, gt=0, description="a worker's hold on a job between heartbeats")
    api_token: str | None = Field(None, description="bearer token required on all but health")
    api_tokens: list[ApiToken] = Field(
        default_factory=list,
        description="named tokens besides api_token; read_only ones may only read",
    )
    max_request_mb: float = Field(
        64.0, gt=0, description="larger request bodies are refused (413) before they are read"
    )
    max_batch_jobs: int = Field(10_000, ge=1, description="jobs one batch submit may carry")
    ssl_certfile: Path | None = Field(None, description="serve HTTPS with this certificate")
    ssl_keyfile: Path | None = Field(None, description="and this private key")
    # Inference backends and the router.
    llm_request_timeout_s: float = Field(600.0, gt=0, description="one model call at most")
    llm_health_interval_s: float = Field(5.0, gt=0, description="backend health checks")
    llm_wait_s: float = Field(
        300.0, ge=0, description="a turn waits this long for a usable backend, then fails"
    )
    llm_drain_s: float = Field(60.0, ge=0, description="a removed backend's requests may finish")
    llm_failover_attempts: int = Field(3, ge=1, description="backends one turn may try")
    llm_abort_resumes: int = Field(
        10, ge=0, description="times one turn's aborted generation is resumed before it fails"
    )
    # The gateway: each running job's OpenAI-compatible endpoint, for agents rollserve runs
    # unchanged (the external agent in the sandbox, harnesses beside it).
    gateway_socket: Path | None = Field(
        None,
        description="the gateway's Unix socket, bound into sandboxes of external agents; "
        "default DATA_DIR/gateway.sock (a short path under /tmp where that one is too long)",
    )
    gateway_sandbox_port: int = Field(
        8377,
        ge=1,
        le=65535,
        description="the loopback port an external agent reaches the gateway on, inside its "
        "sandbox's own network namespace",
    )
    gateway_relay_cc: str = Field(
        "cc", description="the C compiler that builds the relay (static, once per data dir)"
    )
    result_retention_s: float = Field(7 * 24 * 3600.0, gt=0)
    ci: bool = Field(
        False,
        validation_alias=AliasChoices("CI", "ROLLSERVE_CI"),
        description="running in CI: an unavailable sandbox backend fails the tests",
    )

    @model_validator(mode="after")
    def _tls_pair(self) -> Settings:
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError("ssl_certfile and ssl_keyfile go together: give both or neither")
        return self

    @property
    def state_dir(self) -> Path:
        """One directory per live sandbox; what a crashed process left is reaped from here."""
        return self.data_dir / "sandboxes"

    @property
    def gateway_socket_path(self) -> Path:
        """Where the node's gateway listens (a Unix socket path has at most 107 bytes)."""
        if self.gateway_socket is not None:
            return self.gateway_socket
        default = self.data_dir / "gateway.sock"
        if len(str(default.absolute())) <= 100:
            return default
        digest = hashlib.sha256(str(self.data_dir.absolute()).encode()).hexdigest()[:16]
        return Path(tempfile.gettempdir()) / f"rollserve-{digest}.sock"

    @property
    def job_db(self) -> Path:
        """The default SQLite job store."""
        return self.data_dir / "jobs.db"

    @property
    def store_location(self) -> str:
        """The job store's URL: ``store_url``, or the default SQLite file."""
        return self.store_url or f"sqlite://{self.job_db}"

    @property
    def image_cache(self) -> Path:
        """The image cache's directory: ``image_cache_dir``, else the tools directory's shared
        cache where this user may write it, else one under the data directory (a user's own,
        as on a shared node where the tools belong to root)."""
        if self.image_cache_dir is not None:
            return self.image_cache_dir
        shared = self.tools_dir / "image-cache"
        if os.access(shared if shared.exists() else self.tools_dir, os.W_OK | os.X_OK):
            return shared
        return self.data_dir / "image-cache"

    @property
    def image_dir(self) -> Path:
        """Where named images (``base`` → ``base/`` or ``base.sif``) are looked up."""
        return self.images_dir or self.tools_dir / "images"

    @classmethod
    def load(cls, config: Path | None = None, **flags: Any) -> Settings:
        """Settings for a process: command-line ``flags`` (those not None) win over the
        environment, which wins over the ``config`` file (TOML or YAML), then the defaults."""
        given = {name: value for name, value in flags.items() if value is not None}
        from_file = read_config(config) if config is not None else {}

        class FromFile(cls):  # type: ignore[valid-type,misc]
            @classmethod
            def settings_customise_sources(
                cls,
                settings_cls: type[BaseSettings],
                init_settings: PydanticBaseSettingsSource,
                env_settings: PydanticBaseSettingsSource,
                dotenv_settings: PydanticBaseSettingsSource,
                file_secret_settings: PydanticBaseSettingsSource,
            ) -> tuple[PydanticBaseSettingsSource, ...]:
                file_settings = InitSettingsSource(settings_cls, init_kwargs=from_file)
                return init_settings, env_settings, file_settings

        try:
            loaded = FromFile(**given)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
            )
            raise InvalidInputError(
                f"invalid settings: {problems}", config=str(config) if config else None
            ) from exc
        return cls.model_construct(loaded.model_fields_set, **dict(loaded))


def read_config(path: Path) -> dict[str, Any]:
    """A settings file: a TOML or YAML mapping of setting names to values."""
    try:
        text = path.read_text()
        data = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (OSError, tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise InvalidInputError(f"cannot read settings file {path}: {exc}", path=str(path)) from exc
    if not isinstance(data, dict):
        raise InvalidInputError(f"{path} must hold a mapping of settings", path=str(path))
    return data

"""Configuration from the environment (pydantic-settings).

Loaded once by an entry point (`load_settings()`), never at import time, and passed down.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_engine.domain.credentials import parse_prefixes

# The one placeholder of AGENT_ENGINE_TRACE_URL_TEMPLATE.
TRACE_ID_PLACEHOLDER = "{trace_id}"
if TYPE_CHECKING:
    from agent_engine.oauth.keys import TokenKeys


class Settings(BaseSettings):
    # hide_input_in_errors: a refused value may be a secret (token keys, the JWT secret).
    model_config = SettingsConfigDict(
        env_prefix="AGENT_ENGINE_",
        extra="ignore",
        populate_by_name=True,
        hide_input_in_errors=True,
    )

    database_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("DATABASE_URL", "AGENT_ENGINE_DATABASE_URL"),
        description="PostgreSQL URL; unset = the embedded server in the data dir (`run` only).",
    )
    redis_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("REDIS_URL", "AGENT_ENGINE_REDIS_URL"),
        description="Redis/Valkey URL for the Dramatiq broker; unset = embedded Valkey (`run`).",
    )
    broker_url: str | None = Field(
        default=None,
        validation_alias=AliasChoices("BROKER_URL", "AGENT_ENGINE_BROKER_URL"),
        description="amqp://… selects RabbitMQ; otherwise the broker is REDIS_URL.",
    )
    data_dir: Path = Field(default=Path(".agent-engine"), description="Embedded servers' data.")

    jwt_secret: str | None = Field(default=None, description="HS256 secret for bearer tokens.")
    jwt_public_key: str | None = Field(
        default=None, description="PEM public key (RSA, EC or Ed25519); replaces the HS256 secret."
    )
    jwt_public_key_file: Path | None = Field(default=None, description="File with the PEM key.")
    jwt_audience: str | None = Field(
        default=None,
        description="Required `aud`, if set: the api's own identifier at the identity provider "
        "(required with a JWKS URL).",
    )
    jwt_issuer: str | None = Field(default=None, description="Required `iss`, if set.")
    jwt_jwks_url: str | None = Field(
        default=None,
        description="The identity provider's JWKS URL; replaces the PEM key and the secret.",
    )
    jwt_jwks_cache_seconds: float = Field(
        default=300.0, gt=0, description="How long a fetched key set is used before a refetch."
    )
    jwt_jwks_refetch_seconds: float = Field(
        default=10.0,
        ge=0,
        description="At most one fetch per this interval for tokens with an unknown `kid`.",
    )
    jwt_roles_claim: str = Field(
        default="roles",
        min_length=1,
        description="Dotted path to the roles (e.g. realm_access.roles, groups).",
    )
    jwt_admin_role: str = Field(default="agent_admin", min_length=1)
    jwt_user_id_claim: str = Field(
        default="sub", min_length=1, description="Dotted path to the numeric user id."
    )
    jwt_max_lifetime_seconds: float = Field(
        default=86400.0, gt=0, description="Tokens whose `exp` is further away are refused."
    )
    jwt_leeway_seconds: float = Field(
        default=30.0, ge=0, description="Clock skew allowed on `exp`, `nbf` and `iat`."
    )
    jwt_accepted_types: str = Field(
        default="at+jwt,JWT",
        description=(
            "Comma-separated token types (header `typ`) accepted; a token without `typ` counts "
            "as `JWT`; empty = not checked."
        ),
    )

    credential_env_prefixes: str = Field(
        default="",
        description=(
            "Comma-separated prefixes a model's apiKeyEnv (or a tool source's authEnv) must "
            "start with; empty = any variable that is not an engine setting."
        ),
    )

    heartbeat_interval_seconds: float = Field(default=30.0, gt=0)
    stale_after_seconds: float = Field(default=90.0, gt=0)
    queued_resend_after_seconds: float = Field(default=60.0, gt=0)
    queued_fail_after_seconds: float = Field(default=3600.0, gt=0)
    run_timeout_seconds: float = Field(default=600.0, gt=0, description="Wall clock per run.")
    model_timeout_seconds: float = Field(default=120.0, gt=0, description="Per model call.")
    model_breaker_open_seconds: float = Field(
        default=30.0,
        gt=0,
        description=(
            "A model that was down is skipped for its fallback this long (per worker), then one"
            " call tries it again."
        ),
    )
    model_fallback_wait_seconds: float = Field(
        default=20.0,
        gt=0,
        description="A model with a fallback waits out rate limits (429/503) this long at most.",
    )
    tool_timeout_seconds: float = Field(default=30.0, gt=0, description="Per tool call.")
    approval_timeout_seconds: float = Field(
        default=86400.0,
        gt=0,
        description="A WRITE tool call waits this long for its owner's decision, then expires.",
    )
    tool_source_sync_seconds: float = Field(
        default=300.0, gt=0, description="The clock re-syncs enabled MCP tool sources this often."
    )
    schedule_tick_seconds: float = Field(default=5.0, gt=0)
    reap_tick_seconds: float = Field(default=30.0, gt=0)
    schedule_batch_size: int = Field(default=500, ge=1)
    runs_in_flight: int = Field(
        default=200, ge=1, description="Runs one worker process executes at once."
    )
    worker_drain_seconds: float = Field(
        default=20.0,
        ge=0,
        le=3600,
        description="How long a stopping worker (SIGTERM) lets its runs in flight finish before "
        "interrupting them (they journal failed/error).",
    )
    model_slot_wait_seconds: float = Field(
        default=86400.0,
        gt=0,
        description="How long a queued run of a model with maxConcurrentRuns may wait for a slot.",
    )
    delivery_tick_seconds: float = Field(
        default=1.0, gt=0, description="How often the clock sends the delivery dispatch tick."
    )
    delivery_retry_schedule_seconds: list[float] = Field(
        default=[1, 5, 30, 120, 600, 3600, 21600],
        description="Waits between a delivery's attempts; after the last, the delivery fails.",
    )
    delivery_timeout_seconds: float = Field(default=10.0, gt=0, description="Per attempt.")
    delivery_concurrency_per_target: int = Field(default=4, ge=1)
    delivery_lease_seconds: float = Field(
        default=60.0, gt=0, description="A dispatched attempt not recorded by then is sent again."
    )
    retention_tick_seconds: float = Field(
        default=60.0, gt=0, description="How often the clock asks for a run-retention pass."
    )
    retention_batch_size: int = Field(
        default=500, ge=1, description="Runs examined per pruning transaction."
    )

    db_pool_size: int = Field(default=10, ge=1)
    max_body_bytes: int = Field(default=1_000_000, ge=1024)
    max_document_bytes: int = Field(
        default=100_000,
        ge=1024,
        description="A GraphQL document longer than this is refused before it is parsed.",
    )
    max_query_depth: int = Field(default=12, ge=2)
    max_aliases: int = Field(default=30, ge=1)
    max_query_tokens: int = Field(default=2000, ge=10)
    max_query_fields: int = Field(default=500, ge=10)
    max_query_cost: int = Field(
        default=50_000, ge=1, description="Static cost estimate a document may reach."
    )
    max_agents_per_owner: int = Field(default=200, ge=1)
    max_subscriptions_per_connection: int = Field(
        default=50,
        ge=1,
        validation_alias=AliasChoices(
            "AGENT_ENGINE_MAX_SUBSCRIPTIONS_PER_SOCKET",
            "AGENT_ENGINE_MAX_SUBSCRIPTIONS_PER_CONNECTION",
        ),
        description="Operations in flight on one WebSocket; one more is refused with an error.",
    )
    max_sockets_per_user: int = Field(
        default=20,
        ge=1,
        description="WebSockets one user may hold open on one api process; one more is closed.",
    )
    session_check_seconds: float = Field(
        default=2.0, gt=0, description="How often an api process looks for deactivated users."
    )
    broker_timeout_seconds: float = Field(
        default=5.0, gt=0, description="Connect and socket timeout of broker connections."
    )
    subscriber_queue_size: int = Field(default=256, ge=1)

    token_keys: str | None = Field(
        default=None,
        repr=False,
        description="Comma-separated base64 32-byte AES keys for owners' OAuth tokens at rest: the "
        "first encrypts, all decrypt (rotate with `agent-engine rotate-token-keys`).",
    )
    public_url: str | None = Field(
        default=None,
        description="The engine's address as a browser reaches it (https://…, or http:// to "
        "loopback); the OAuth redirect URI is <public_url>/oauth/callback.",
    )
    connect_return_url: str | None = Field(
        default=None,
        description="Where /oauth/callback sends the browser after connecting an account "
        "(?outcome=connected|denied|…&source=<name>); unset = a small page of the engine's.",
    )
    oauth_timeout_seconds: float = Field(
        default=10.0, gt=0, description="Per request to a tool server's authorization server."
    )

    log_format: str = Field(
        default="auto",
        description="json | console | auto (console for `run`, JSON for serve/worker/clock)",
    )
    log_level: str = Field(default="INFO")
    trace_url_template: str | None = Field(
        default=None,
        description="The dashboard links a run's trace id here: an http(s) URL containing "
        "`{trace_id}` (e.g. a Grafana Tempo or Jaeger trace view). Tracing itself is the "
        "standard OTEL_* variables'.",
    )

    @field_validator("database_url")
    @classmethod
    def _asyncpg_url(cls, value: str | None) -> str | None:
        return None if value is None else to_asyncpg_url(value)

    @field_validator("trace_url_template")
    @classmethod
    def _trace_url(cls, value: str | None) -> str | None:
        """An http(s) URL with `{trace_id}` in it (the only placeholder the dashboard fills)."""
        if value is None or not value.strip():
            return None
        value = value.strip()
        if urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).netloc:
            raise ValueError("AGENT_ENGINE_TRACE_URL_TEMPLATE must be an http:// or https:// URL")
        if TRACE_ID_PLACEHOLDER not in value:
            raise ValueError(
                f"AGENT_ENGINE_TRACE_URL_TEMPLATE must contain {TRACE_ID_PLACEHOLDER}"
                " (where the trace id goes)"
            )
        return value

    @field_validator("token_keys")
    @classmethod
    def _token_keys(cls, value: str | None) -> str | None:
        from agent_engine.oauth.keys import key_problem

        if problem := key_problem(value):
            raise ValueError(f"AGENT_ENGINE_TOKEN_KEYS: {problem}")
        return value if value and value.strip() else None

    @field_validator("public_url", "connect_return_url")
    @classmethod
    def _browser_url(cls, value: str | None) -> str | None:
        from agent_engine.domain.delivery import target_url_problem

        if value is None or not value.strip():
            return None
        if problem := target_url_problem(value):
            raise ValueError(problem)
        return value

    def token_keyring(self) -> TokenKeys | None:
        """The keys, or None when AGENT_ENGINE_TOKEN_KEYS is unset."""
        from agent_engine.oauth.keys import TokenKeys

        return None if self.token_keys is None else TokenKeys.parse(self.token_keys)

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        """Refuse settings that contradict each other (the process would misbehave, not fail)."""
        problems = []
        if self.stale_after_seconds <= self.heartbeat_interval_seconds:
            problems.append(
                f"AGENT_ENGINE_STALE_AFTER_SECONDS ({self.stale_after_seconds:g}) must be greater"
                f" than AGENT_ENGINE_HEARTBEAT_INTERVAL_SECONDS"
                f" ({self.heartbeat_interval_seconds:g}): the reaper would fail live runs between"
                " two heartbeats"
            )
        if self.queued_fail_after_seconds <= self.queued_resend_after_seconds:
            problems.append(
                f"AGENT_ENGINE_QUEUED_FAIL_AFTER_SECONDS ({self.queued_fail_after_seconds:g}) must"
                f" be greater than AGENT_ENGINE_QUEUED_RESEND_AFTER_SECONDS"
                f" ({self.queued_resend_after_seconds:g}): a lost message would fail the run"
                " before it is re-sent"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def heartbeat_interval(self) -> timedelta:
        return timedelta(seconds=self.heartbeat_interval_seconds)

    @property
    def stale_after(self) -> timedelta:
        return timedelta(seconds=self.stale_after_seconds)

    @property
    def delivery_retry_schedule(self) -> tuple[timedelta, ...]:
        return tuple(timedelta(seconds=s) for s in self.delivery_retry_schedule_seconds)

    @field_validator("delivery_retry_schedule_seconds")
    @classmethod
    def _non_negative_waits(cls, value: list[float]) -> list[float]:
        if any(s < 0 for s in value):
            raise ValueError("waits must be zero or more seconds")
        return value

    @property
    def credential_prefixes(self) -> tuple[str, ...]:
        return parse_prefixes(self.credential_env_prefixes)

    @property
    def effective_broker_url(self) -> str | None:
        return self.broker_url or self.redis_url

    def require_database_url(self) -> str:
        if not self.database_url:
            raise RuntimeError("DATABASE_URL is not set")
        return self.database_url

    @property
    def jwt_accepted_type_set(self) -> frozenset[str]:
        """The accepted `typ` values as media types compare: without case, `application/` implied
        (RFC 7515 §4.1.9)."""
        return frozenset(
            media_type(value) for value in self.jwt_accepted_types.split(",") if value.strip()
        )

    def jwt_verification_key(self) -> str | None:
        if self.jwt_public_key:
            return self.jwt_public_key
        if self.jwt_public_key_file:
            return self.jwt_public_key_file.read_text()
        return None


def media_type(value: str) -> str:
    """A JOSE `typ`/`cty` as compared: `application/at+jwt` and `AT+JWT` are `at+jwt`."""
    return value.strip().lower().removeprefix("application/")


def to_asyncpg_url(url: str) -> str:
    """Accept the usual `postgresql://` / `postgres://` forms and use the asyncpg driver."""
    for prefix in (
        "postgresql+asyncpg://",
        "postgresql+psycopg://",
        "postgresql://",
        "postgres://",
    ):
        if url.startswith(prefix):
            return "postgresql+asyncpg://" + url[len(prefix) :]
    return url


def to_libpq_url(url: str) -> str:
    """The plain `postgresql://` form, for asyncpg.connect and libpq tools."""
    return "postgresql://" + url.split("://", 1)[1]


def load_settings(**overrides: object) -> Settings:
    return Settings(**overrides)  # type: ignore[arg-type]

"""The resolved configuration: frozen pydantic models every other module reads.

The loader (:mod:`latgate.foundation.config.loader`) turns a TOML file, in either accepted shape
(a provider table or pool sections), into one :class:`Config`. Everything here is already validated and
normalised: provider names referenced by routing exist, connectors are known, URLs
parse, aliases are resolved per provider. Code downstream never re-checks.
"""

from __future__ import annotations

import functools
import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from latgate.foundation.config.scalars import reject_converted_scalar

_VERSION_SEGMENT = re.compile(r"(?:^|/)v\d+(?:beta\d*|alpha\d*)?(?:/|$)")


class Frozen(BaseModel):
    """Base for config models: immutable, unknown fields rejected, numbers strict.

    A number field (``int``/``float``) takes neither ``true``/``false`` (pydantic would
    read ``port = true`` as port 1) nor a string (``port = "8001"``; nor does a ``bool``
    field, ``enabled = "off"``) nor ``inf``/``nan`` (TOML has both; an infinite
    timeout overflows the event loop's timer on every request).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _strict_scalars(cls, value: object, info: ValidationInfo) -> object:
        if info.field_name is not None:
            reject_converted_scalar(cls.model_fields[info.field_name].annotation, value)
        return value


def versioned_base(api_base: str, *, exact: bool = False) -> str:
    """Return the base URL the OpenAI paths (``/chat/completions``...) are appended to.

    A path that already names an API version in any segment (``v1``, ``v4``,
    ``v1beta``, ``v2alpha1``) is used as given, trailing slash removed:
    ``http://h:1/v1/`` -> ``http://h:1/v1``, ``.../v1beta/openai/`` ->
    ``.../v1beta/openai``, ``https://open.bigmodel.cn/api/paas/v4``,
    ``.../compatible-mode/v1`` and ``.../openai/v1`` as they are. A path without one
    gets ``/v1``: ``http://h:8000`` -> ``http://h:8000/v1``,
    ``https://taotoken.net/api`` -> ``https://taotoken.net/api/v1`` (the OpenAI SDK's
    convention for a bare origin). ``exact`` (``api_base_exact = true``): as given.
    """
    base = api_base.rstrip("/")
    if exact or _VERSION_SEGMENT.search(urlsplit(base).path):
        return base
    return base + "/v1"


class ServerConfig(Frozen):
    """``[server]``: where the gateway listens, and what a client connection may take.

    Client timeouts (seconds, 0 turns one off; see :mod:`latgate.app.httplimits`):
    ``header_timeout_sec`` to deliver a request head, ``body_timeout_sec`` the longest
    gap inside a request body, ``send_timeout_sec`` the longest a client may leave
    response bytes unread. ``max_connections``: client connections served at once
    (``None``: derived from the descriptor limit at start, see
    :func:`latgate.process.listen.default_max_connections`).
    """

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    api_compat: Literal["openai"] = "openai"
    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)
    header_timeout_sec: float = Field(default=30.0, ge=0)
    body_timeout_sec: float = Field(default=60.0, ge=0)
    send_timeout_sec: float = Field(default=60.0, ge=0)
    max_connections: int | None = Field(default=None, gt=0)


class DefaultsConfig(Frozen):
    """``[defaults]`` (or ``[default]``): timeouts in seconds, retry count, and the
    upstream limits: ``max_connections`` per provider (its pool; a request finding it
    full waits up to ``connect_timeout_sec``, then gets 503 ``overloaded``),
    ``max_event_bytes`` (the largest SSE event latgate assembles) and
    ``max_response_bytes`` (the largest non-streamed upstream body it reads)."""

    timeout_sec: float = Field(default=600.0, gt=0)
    connect_timeout_sec: float = Field(default=5.0, gt=0)
    first_token_timeout_sec: float | None = Field(default=None, gt=0)
    max_retries: int = Field(default=1, ge=0, le=10)
    max_connections: int = Field(default=2048, gt=0)
    max_event_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    max_response_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    #: a stream still without content this long has its 200 head sent and an SSE
    #: keep-alive every as long until content (0: off; see latgate.forwarding.keepalive)
    first_token_keepalive_sec: float = Field(default=15.0, ge=0)
    #: (sec, issue 23) the longest a stream may last in all, from the request's arrival
    #: (0: no bound; see latgate.forwarding.relay)
    max_stream_sec: float = Field(default=3600.0, ge=0)


class EndpointConfig(Frozen):
    """One replica of a provider.

    ``id`` is stable and bounded (``NAME-0``, ``NAME-1``...): it is used as a metric
    label. ``api_base`` is the base URL as configured (trailing slash removed);
    ``base_url`` is the same with a version segment where it names none (see
    :func:`versioned_base`; ``exact``: the provider's ``api_base_exact``), to which
    OpenAI paths such as ``/chat/completions`` are appended. ``max_batch_size`` (batch
    slots of this replica, overriding the provider's) and ``weight`` (its share of load
    under every strategy, default 1) come from an ``endpoints`` table entry.
    """

    id: str
    api_base: str
    max_batch_size: int | None = Field(default=None, gt=0)
    weight: float = Field(default=1.0, gt=0)
    exact: bool = False

    @functools.cached_property
    def base_url(self) -> str:  # computed once: it is read on every proxied request
        return versioned_base(self.api_base, exact=self.exact)


class ProviderConfig(Frozen):
    """``[providers.NAME]``: one pool or upstream.

    ``models`` empty means the provider accepts any model name. ``connector`` is a
    registered connector name (validated by the loader). ``hints`` keeps any other
    engine capacity hints the config gave (``chunked_prefill``,
    ``max_num_batched_tokens``...), shown by ``latgate check``. ``responses_api``: the
    provider serves ``POST /responses`` itself (OpenAI API reference, "Responses"), so
    Responses requests routed only to such providers pass through untranslated.
    ``proxy`` (``None``: the environment's ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY``;
    a URL; ``False``: direct), ``ca_file``, ``client_cert``/``client_key`` and
    ``verify``: how its endpoints are reached (:mod:`latgate.transport.egress`).
    ``api_base_exact``: base URLs used as given (see :func:`versioned_base`).
    """

    name: str
    endpoints: tuple[EndpointConfig, ...]
    api_key_env: str | None = None
    models: tuple[str, ...] = ()
    extra_body: dict[str, object] = Field(default_factory=dict)
    engine: str | None = None
    connector: str = "openai"
    role: Literal["decode", "prefill", "upstream"] | None = None
    max_batch_size: int | None = Field(default=None, gt=0)
    enable_prefix_cache: bool | None = None
    prefix_cache_tokens: int | None = Field(default=None, gt=0, le=1 << 22)
    responses_api: bool = Field(default=False, strict=True)
    tokenizer: str | None = None
    latency_sensitive: bool = False
    timeout_sec: float | None = Field(default=None, gt=0)
    max_connections: int | None = Field(default=None, gt=0)
    first_token_keepalive_sec: float | None = Field(default=None, ge=0)
    max_stream_sec: float | None = Field(default=None, ge=0)  # (sec, issue 23)
    hints: dict[str, object] = Field(default_factory=dict)
    api_base_exact: bool = Field(default=False, strict=True)
    proxy: str | Literal[False] | None = None
    ca_file: str | None = None
    client_cert: str | None = None
    client_key: str | None = None
    verify: bool = Field(default=True, strict=True)

    def serves(self, model: str) -> bool:
        """True when this provider accepts ``model`` as an upstream model name."""
        return not self.models or model in self.models

    @property
    def caches_prefixes(self) -> bool:
        """Whether its engine is taken to keep a prefix cache: ``enable_prefix_cache``
        when set, else true for every connector but TileRT's (vLLM's automatic prefix
        caching, SGLang's RadixAttention and hosted prompt caching are on by default)."""
        if self.enable_prefix_cache is not None:
            return self.enable_prefix_cache
        return self.connector != "tile_rt_connector"


class PolicyConfig(Frozen):
    """``[routing.policies.NAME]``, selected by ``X-Route-Policy`` or a key's policy."""

    latency_sensitive: bool | None = None
    route_to: str | None = None
    long_context_provider: str | None = None
    latency_budget_ms: int | None = Field(default=None, gt=0)
    hedge: bool = False
    first_token_keepalive_sec: float | None = Field(default=None, ge=0)
    max_stream_sec: float | None = Field(default=None, ge=0)  # (sec, issue 23)
    priority: Literal["interactive", "default", "batch"] | None = None  # the class of its requests (latgate.routing.priority)


PRIORITY_CLASSES = ("interactive", "default", "batch")
"""The priority classes, highest first (:mod:`latgate.routing.priority`)."""


class QueueConfig(Frozen):
    """``[routing.queue]``: the gateway queue of every pool whose capacity is known, and
    the retry and hedge budgets (:mod:`latgate.routing.admission`, docs/routing.md "When
    pools are full").

    Attributes:
        enabled: hold requests in latgate when every endpoint of their pool is at
            capacity (false: sent on to the engine's own queue, as before).
        max_waiting: requests waiting per provider at most; a full queue sheds its
            newest lowest-class waiter for a higher-class newcomer, else the newcomer.
        max_wait_ms: the longest any request waits for a slot.
        batch_max_wait_ms: the longest a ``batch`` request waits; past it (or predicted
            past it) it is shed with 503 and ``Retry-After``.
        batch_headroom_slots: free slots a ``batch`` request does not take, kept for the
            other classes so an interactive turn finds a slot at once instead of the next
            to free, less the running ``batch`` requests that would give theirs up at once
            (``preempt``); only on a provider with at least 4 slots per headroom slot.
        preempt: a request that would wait (above ``batch``, or ``batch`` of a key within
            its share while another key has a backlog) takes the slot of a ``batch`` one
            its client has had nothing of (held back while its key has a backlog; it is
            queued again, or answered 503 with ``x-latgate-preempted``).
        retry_budget_percent: retries plus hedges in flight per provider, at most this
            share of its active requests (Envoy's ``budget_percent``).
        retry_budget_min: this many retries plus hedges in flight are always allowed.
        hedge_slow_share: no hedge when more than this share of a provider's endpoints
            are at capacity at once.
    """

    enabled: bool = True
    max_waiting: int = Field(default=256, ge=1, le=100_000)
    max_wait_ms: int = Field(default=30_000, gt=0, le=600_000)
    batch_max_wait_ms: int = Field(default=10_000, gt=0, le=600_000)
    batch_headroom_slots: int = Field(default=1, ge=0, le=1024)
    preempt: bool = True
    retry_budget_percent: float = Field(default=20.0, ge=0, le=100)
    retry_budget_min: int = Field(default=3, ge=0)
    hedge_slow_share: float = Field(default=0.5, gt=0, le=1)


STRATEGIES = ("predicted_latency", "latgate", "round_robin", "least_outstanding", "rules")
"""``routing.strategy`` values: ``predicted_latency`` (the default; ``latgate`` is its
old name, still accepted: live numbers: overflow, cache-aware predicted-TTFT endpoint
choice, hedging, latency ejection), or the static rules with ``round_robin`` or
``least_outstanding`` endpoint choice (``rules`` is the latter); see
:mod:`latgate.routing.strategies.registry`."""


class RoutingConfig(Frozen):
    """``[routing]``: the rules of :mod:`latgate.routing.decision`.

    ``default_route`` is always set after loading (the first provider when the file
    names none). ``fallbacks`` maps a provider to the providers tried, in order, when
    it fails before the first byte reached the client. ``strategy`` is one of
    :data:`STRATEGIES`. ``exploration_share``: under ``latgate``, at most this share of
    requests with a budget is spent refreshing an endpoint whose estimate is thin or
    stale while a measured endpoint can take them (requests without a budget explore
    freely).
    """

    default_route: str
    latency_threshold_ms: int | None = Field(default=None, gt=0)
    route_latency_sensitive_to: str | None = None
    long_context_threshold: int | None = Field(default=None, gt=0)
    long_context_provider: str | None = None
    default_model: str | None = None
    fallbacks: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    allow_route_override: bool = False
    admission: bool = True  # strategy latgate: hold latency-sensitive requests for a TileRT slot (latgate.routing.admission)
    strategy: Literal["predicted_latency", "latgate", "round_robin", "least_outstanding", "rules"] = "predicted_latency"
    policies: dict[str, PolicyConfig] = Field(default_factory=dict)
    exploration_share: float = Field(default=0.03, ge=0, le=1)
    expected_completion_tokens: int = Field(default=256, gt=0)  # strategy latgate: e2e of a request naming no max_tokens, before any stream
    queue: QueueConfig = Field(default_factory=QueueConfig)  # [routing.queue]: gateway queues, shedding, retry budgets


class ModelConfig(Frozen):
    """``[models."public-name"]``: per-model behaviour."""

    latency_sensitive: bool = False
    fallback_model: str | None = None
    max_context_tokens: int | None = Field(default=None, gt=0)


class AuthKey(Frozen):
    """One ``[[auth.keys]]`` entry. Exactly one of ``key`` / ``key_sha256`` is set."""

    name: str
    key: str | None = None
    key_sha256: str | None = None
    rpm: int | None = Field(default=None, gt=0)
    tpm: int | None = Field(default=None, gt=0)
    models: tuple[str, ...] = ()
    policy: str | None = None
    admin: bool = False
    priority: Literal["interactive", "default", "batch"] | None = None  # the highest class its requests may claim


class AuthConfig(Frozen):
    """``[auth]``: gateway keys. Absent from :class:`Config` means no authentication."""

    keys: tuple[AuthKey, ...] = ()


class StateConfig(Frozen):
    """``[state]``: shared state for replicas. No ``redis_url``: in-process state.

    ``fail_open``: when Redis cannot be reached, admit requests without rate limits
    (true, the default) or refuse them with 503 (false). ``redis_timeout_ms`` bounds
    every Redis call (connect and reply), so an unreachable Redis never hangs a request.
    """

    redis_url: str | None = None
    fail_open: bool = True
    redis_timeout_ms: float = Field(default=100.0, gt=0, le=10_000)


class HealthConfig(Frozen):
    """``[health]``: active probes, engine load scraping and the circuit breaker.

    Attributes:
        probe_interval_sec: seconds between active probes of each endpoint
            (``GET`` of its connector's health path); 0 turns probes off.
        probe_timeout_sec: a probe slower than this failed.
        load_interval_sec: seconds between reads of each engine's load gauges (vLLM
            ``/metrics``: running / waiting requests) where the connector has them;
            0 turns it off.
        failure_threshold: consecutive failed requests that open an endpoint's circuit.
        probe_failure_threshold: consecutive failed probes that open it.
        open_sec: how long a circuit first stays open before one trial request
            (half-open); doubled each time the trial fails, up to ``max_open_sec``.
        max_open_sec: the longest an endpoint stays out between trials.
        latency_factor / latency_margin_ms: with strategy ``latgate``, an endpoint
            whose predicted time to first token exceeds ``latency_factor`` times the
            median of its provider's other endpoints plus ``latency_margin_ms`` is
            ejected as too slow (then tried again like an open circuit), on enough
            observations and unless its queue or overload explains it.
        max_ejection_share: latency ejection never leaves more than this share of a
            provider's endpoints (at least one may go) or of its batch slots out of
            service, and never the last endpoint in service.
    """

    probe_interval_sec: float = Field(default=5.0, ge=0)
    probe_timeout_sec: float = Field(default=2.0, gt=0)
    load_interval_sec: float = Field(default=2.0, ge=0)
    failure_threshold: int = Field(default=5, ge=1)
    probe_failure_threshold: int = Field(default=2, ge=1)
    open_sec: float = Field(default=5.0, gt=0)
    max_open_sec: float = Field(default=60.0, gt=0)
    latency_factor: float = Field(default=3.0, gt=1)
    latency_margin_ms: float = Field(default=50.0, ge=0)
    max_ejection_share: float = Field(default=0.5, gt=0, le=1)


#: the ``[aliases]`` key that serves every model name no provider lists
CATCH_ALL = "*"


class Config(Frozen):
    """The whole resolved configuration.

    ``providers`` keeps file order. ``aliases`` maps a public model name to
    ``{provider: served model name}`` for every provider that takes it (string aliases
    are expanded to every provider serving the target; the key ``"*"``, when
    present, is the catch-all that serves names no provider lists; the same-model rule
    of a single-model provider is *not* listed here, routing applies it).
    ``source`` is the path the config was read from (``<builtin>`` for the embedded
    default), used in messages.
    """

    source: str = "<memory>"
    server: ServerConfig = Field(default_factory=ServerConfig)
    defaults: DefaultsConfig = Field(default_factory=DefaultsConfig)
    providers: dict[str, ProviderConfig]
    routing: RoutingConfig
    aliases: dict[str, dict[str, str]] = Field(default_factory=dict)
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    auth: AuthConfig | None = None
    state: StateConfig = Field(default_factory=StateConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)

    def public_models(self) -> list[str]:
        """Every model name a client may ask for: served names, then aliases, no repeats."""
        seen: dict[str, None] = {}
        for provider in self.providers.values():
            for model in provider.models:
                seen.setdefault(model, None)
        for public in self.aliases:
            if public != CATCH_ALL:
                seen.setdefault(public, None)
        for public in self.models:
            seen.setdefault(public, None)
        if self.routing.default_model:
            seen.setdefault(self.routing.default_model, None)
        return list(seen)

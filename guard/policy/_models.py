"""The guard's policy as pydantic models: every field typed, bounded, described and defaulted.

The limit sets the guard's code reads are declared next to that code (see :mod:`guard._limits`):
the checks' beside each check (:mod:`guard.checks`), framing, JSON, guided decoding, the
chat-template sandbox, the upstream and the rate buckets beside theirs; the policy composes them
as its sections as they are. The rest (routes, keys, rates, logs, admin) is declared here.
Descriptions are the documentation: docs/POLICY.md's reference is generated from them
(:func:`guard.policy._docs.policy_reference`), and a test keeps the two in step. Defaults are
chosen from the peers in THREATS.md and explained in each description.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
import re
from functools import cached_property
from typing import Annotated, Any, Literal, TypeGuard

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass, is_pydantic_dataclass
from pydantic.fields import FieldInfo

from guard._limits import LIMITS_CONFIG, LimitsModel, NonNegInt, PosFloat, PosInt
from guard.admission import ConcurrencyLimits, RateLimits, TrustedProxies
from guard.checks import CHECK_NAMES, CheckSections, Priority
from guard.http import ConnectionLimits, FramingLimits, UpstreamConfig, UpstreamKind
from guard.json import JsonLimits
from guard.presets import PresetName, apply_preset, preset_summary
from guard.request import CallerKey

# Routes every guard proxies; `routes` adds to them.
BASE_ROUTES: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
)


class Section(LimitsModel):
    """Base of every policy model: unknown fields are errors, values are immutable."""


# -- limits -----------------------------------------------------------------------------------


class _TransportSections(Section):
    """The limit sets of the request's transport: connections, framing, the JSON body."""

    connections: ConnectionLimits = Field(
        default_factory=lambda: ConnectionLimits(),
        description="Client connections: head and keep-alive timeouts, open-connection caps.",
    )
    body: FramingLimits = Field(
        default_factory=lambda: FramingLimits(), description="HTTP framing limits."
    )
    json_: JsonLimits = Field(
        default_factory=lambda: JsonLimits(), alias="json", description="Bounded JSON parsing."
    )

    model_config = ConfigDict(populate_by_name=True)


class LimitsPolicy(CheckSections, _TransportSections):
    """The policy's ``limits``: the transport's limit sets, then the checks' (declared with the
    checks, :class:`guard.checks.CheckSections`)."""


# -- rate and keys ----------------------------------------------------------------------------


class AnonymousRate(Section):
    """The anonymous tenant's allowances: every caller when the policy lists no keys."""

    requests_per_minute: PosInt | None = Field(
        default=None,
        description="Requests per minute of all callers together. `null` (default): "
        "unlimited, so that one service behind the guard (a team's sidecar, a benchmark) is "
        "not throttled; the global concurrency and the checks still protect the upstream.",
    )
    tokens_per_minute: PosInt | None = Field(
        default=None, description="Tokens per minute of all callers together. `null`: unlimited."
    )
    burst: PosInt | None = Field(
        default=None, description="The request bucket's capacity. `null`: `rate.burst`."
    )
    token_burst: PosInt | None = Field(
        default=None, description="The token bucket's capacity. `null`: a minute's worth."
    )
    concurrency: PosInt | None = Field(
        default=None,
        description="Requests in flight of all callers together. `null`: "
        "`rate.global_concurrency` (nothing tighter than the guard's own cap).",
    )
    guided_compile_s_per_minute: PosFloat | None = Field(
        default=None,
        description="Structured-output compile CPU-seconds per minute of all callers together "
        "(see `rate.guided_compile_s_per_minute`). `null` (default): unlimited, like the other "
        "anonymous rates; the global caps in `limits.guided` still protect the upstream's "
        "compile pool.",
    )


@dataclass(frozen=True, config=LIMITS_CONFIG)
class RatePolicy(RateLimits):
    """The rate limits of :class:`~guard.admission.RateLimits` (every API key's unless its
    entry overrides them; without keys, `rate.anonymous` applies), concurrency, and where the
    buckets are kept."""

    per_key_concurrency: PosInt = Field(
        default=64,
        description="Requests in flight per API key (more wait in the queue): a quarter of "
        "`global_concurrency`, so that one tenant can use a good share of the engine's batch "
        "and four can fill it.",
    )
    global_concurrency: PosInt = Field(
        default=256,
        description="Requests in flight through this guard (more wait in the queue); about the "
        "upstream's batch size.",
    )
    queue_size: NonNegInt = Field(
        default=256,
        description="Requests waiting for a concurrency slot, at most (beyond: 503 at once).",
    )
    queue_timeout_s: PosFloat = Field(
        default=5.0, description="Seconds a request may wait for a slot (then 429 or 503)."
    )
    weight: PosFloat = Field(
        default=1.0,
        description="This key's share of the upstream when tenants wait for it: queued requests "
        "are released by weighted fair queuing on their estimated work (prompt tokens plus the "
        "output reserved for every sequence), so each waiting tenant gets work in proportion "
        "to its weight. Anonymous callers are told apart by address (an IPv6 /64), each with "
        "this weight.",
    )
    priority: Priority = Field(
        default=0,
        description="The priority this key's requests are scheduled with upstream when the "
        "upstream schedules by priority (`upstream.priority_scheduling`), and the best one "
        "its clients may ask for: lower is served earlier and preempts higher ones. Injected "
        "as the body's `priority` when the request names none (0, vLLM's default, is not "
        "injected); a client may ask for a higher (later) value, never a lower one (400 "
        "`priority_not_allowed`). Anonymous callers get this value. It does not order the "
        "guard's own queue: `weight` shares the upstream between waiting tenants.",
    )
    client_address_header: str = Field(
        default="x-forwarded-for",
        description="The header a proxy in front writes the client's address to; read only "
        "for requests from `trusted_proxies` (under Envoy: the downstream peer, its "
        "`source.address` attribute): the right-most address that is not a trusted proxy is the client's, "
        "the fair queue's flow of an anonymous caller. `forwarded` reads the standard header "
        "(RFC 7239) by its `for=` parameters.",
    )
    trusted_proxies: tuple[str, ...] = Field(
        default=(),
        description="Addresses or CIDRs (`10.0.0.0/8`) of the proxies in front whose "
        "`client_address_header` is believed. Empty (default): the connection's peer is the "
        "client.",
    )
    redis_url: str | None = Field(
        default=None,
        description="`redis://` URL sharing the limits between guard replicas (atomic Lua "
        "scripts). `null`: in memory, per process.",
    )
    on_redis_failure: Literal["closed", "open"] = Field(
        default="closed",
        description="When Redis is unreachable: `closed` refuses requests (503), `open` "
        "admits them unlimited. Never silently per replica.",
    )
    redis_timeout_s: PosFloat = Field(
        default=0.25,
        description="Bound of one Redis operation end to end (connect, one retry on a stale "
        "pooled connection, the script): past it the operation has failed and "
        "`on_redis_failure` decides. Raise it for a Redis across a slow network.",
    )
    anonymous: AnonymousRate = Field(
        default_factory=lambda: AnonymousRate(),
        description="The anonymous tenant's limits (no keys configured: every caller). By "
        "default no request or token rate and the global concurrency: per-tenant rates apply "
        "to keys, or here when set.",
    )

    @field_validator("trusted_proxies")
    @classmethod
    def _cidrs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=False)
            except ValueError:
                raise ValueError(f"{cidr[:60]!r} is not an address or CIDR") from None
        return value

    @field_validator("client_address_header")
    @classmethod
    def _header_name(cls, value: str) -> str:
        if not re.fullmatch(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}", value):
            raise ValueError("must be a header name")
        return value.lower()

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"(rediss?|unix)://", value):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value

    @cached_property
    def slot_limits(self) -> ConcurrencyLimits:
        """The concurrency limits of one key (built once per key's rate)."""
        return ConcurrencyLimits(self.per_key_concurrency, self.queue_size)

    @cached_property
    def anonymous_slot_limits(self) -> ConcurrencyLimits:
        """The anonymous tenant's: none of its own unless `anonymous.concurrency` is set (then
        anonymous callers wait in the global queue, each address its own flow, rather than in
        one first-come queue of their shared tenant)."""
        if self.anonymous.concurrency is None:
            return ConcurrencyLimits(None, self.queue_size)
        return ConcurrencyLimits(self.anonymous.concurrency, self.queue_size)

    @cached_property
    def proxies(self) -> TrustedProxies:
        return TrustedProxies(self.trusted_proxies)

    @cached_property
    def anonymous_rate(self) -> RatePolicy:
        """The anonymous tenant's limits: these with ``anonymous``'s (built once)."""
        anon = self.anonymous
        return dataclasses.replace(
            self,
            requests_per_minute=anon.requests_per_minute,
            tokens_per_minute=anon.tokens_per_minute,
            burst=anon.burst or self.burst,
            token_burst=anon.token_burst,
            per_key_concurrency=anon.concurrency or self.global_concurrency,
            guided_compile_s_per_minute=anon.guided_compile_s_per_minute,
        )


class RateOverrides(Section):
    """Per-key overrides of :class:`RatePolicy`: a field left out inherits the global value."""

    requests_per_minute: PosInt | None = Field(
        default=None, description="Overrides `rate.requests_per_minute` (`null`: unlimited)."
    )
    tokens_per_minute: PosInt | None = Field(
        default=None, description="Overrides `rate.tokens_per_minute` (`null`: unlimited)."
    )
    burst: PosInt | None = Field(default=None, description="Overrides `rate.burst`.")
    token_burst: PosInt | None = Field(default=None, description="Overrides `rate.token_burst`.")
    per_key_concurrency: PosInt | None = Field(
        default=None, description="Overrides `rate.per_key_concurrency`."
    )
    weight: PosFloat | None = Field(
        default=None,
        description="Overrides `rate.weight`: this key's share of the upstream when tenants "
        "wait (2: twice the work of a key with weight 1).",
    )
    priority: Priority | None = Field(
        default=None,
        description="Overrides `rate.priority`: the best priority this key's requests are "
        "scheduled with (e.g. `-10` for an interactive service ahead of batch keys at 0, "
        "`10` for a batch key behind them).",
    )
    guided_compile_s_per_minute: PosFloat | None = Field(
        default=None,
        description="Overrides `rate.guided_compile_s_per_minute` (`null`: unlimited).",
    )
    guided_compile_burst_s: PosFloat | None = Field(
        default=None, description="Overrides `rate.guided_compile_burst_s`."
    )

    def apply(self, base: RatePolicy) -> RatePolicy:
        """``base`` with the fields this override sets."""
        update = {k: getattr(self, k) for k in self.model_fields_set}
        # burst, per_key_concurrency, guided_compile_burst_s, weight and priority cannot be
        # unlimited: null there means "inherit".
        for name in (
            "burst",
            "per_key_concurrency",
            "guided_compile_burst_s",
            "weight",
            "priority",
        ):
            if update.get(name, 0) is None:
                del update[name]
        return dataclasses.replace(base, **update) if update else base


_TENANT = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def _sha256_hex(value: str) -> str:
    value = value.lower()
    if not _SHA256.fullmatch(value):
        raise ValueError("must be 64 hexadecimal digits")
    return value


# A SHA-256 hex digest as the policy holds keys and tokens (lower case).
Sha256Hex = Annotated[str, AfterValidator(_sha256_hex)]


def key_digest(key: str) -> str:
    """The SHA-256 hex digest by which keys are stored, looked up and shown."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyEntry(Section):
    key: SecretStr | None = Field(
        default=None,
        description="The API key, as sent in `Authorization: Bearer <key>`. Prefer "
        "`key_sha256`, so the policy file holds no secret.",
    )
    key_sha256: Sha256Hex | None = Field(
        default=None,
        description="The SHA-256 hex digest of the key (`printf %s KEY | sha256sum`); "
        "`schedguard policy show` prints keys this way.",
    )
    tenant: str = Field(
        description="The tenant the key belongs to (letters, digits, `_.:@-`, at most 64): "
        "the label of its metrics and logs.",
    )
    rate: RateOverrides = Field(
        default_factory=lambda: RateOverrides(),
        description="This key's overrides of `rate` (fields left out inherit).",
    )

    @field_validator("tenant")
    @classmethod
    def _tenant_name(cls, value: str) -> str:
        if not _TENANT.fullmatch(value):
            raise ValueError("must be 1 to 64 letters, digits or _.:@-")
        return value

    @field_validator("key")
    @classmethod
    def _key_text(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            text = value.get_secret_value()
            if not 8 <= len(text) <= 256 or not text.isprintable() or " " in text:
                raise ValueError("must be 8 to 256 printable characters without spaces")
        return value

    @model_validator(mode="after")
    def _one_key(self) -> KeyEntry:
        if (self.key is None) == (self.key_sha256 is None):
            raise ValueError("set exactly one of key and key_sha256")
        return self

    @property
    def digest(self) -> str:
        if self.key_sha256 is not None:
            return self.key_sha256
        assert self.key is not None
        return key_digest(self.key.get_secret_value())

    @property
    def key_id(self) -> str:
        """A short, non-secret identifier of the key (the digest's first 12 digits)."""
        return self.digest[:12]


# -- observability ----------------------------------------------------------------------------


class ObservabilityPolicy(Section):
    access_log: bool = Field(
        default=True,
        description="Write a structured access log line per request (stderr, in `log_format`).",
    )
    log_prompts: bool = Field(
        default=False,
        description="Include prompt text in the access log. Off by default: prompts are user data.",
    )
    log_format: Literal["json", "text"] = Field(
        default="json",
        description="How every line the guard writes to stderr is formatted (its messages, "
        "uvicorn's and the access log): `json`, one JSON object a line, or `text`, for reading "
        "on a terminal (the access log as key=value pairs). `--log-format` sets it.",
    )


# -- admin: health and metrics ------------------------------------------------------------------


_LISTEN = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})")


class AdminPolicy(Section):
    """Who may read ``/metrics`` (tenant names and their token counts) and where."""

    listen: str | None = Field(
        default=None,
        description="`HOST:PORT` of a separate admin listener serving `/healthz`, `/readyz` "
        "and `/metrics` only (Envoy's admin port; `schedguard serve --admin-port`). Bind it "
        "to an interface only operators reach (`127.0.0.1`, a pod's own address). Set, "
        "`/metrics` is no longer served on the public port (404 `not_found`); `/healthz` and "
        "`/readyz` still are. With `--workers N` every worker listens on it (`SO_REUSEPORT`) "
        "and each answers for all. `null`: none.",
    )
    metrics_key_sha256: Sha256Hex | None = Field(
        default=None,
        description="SHA-256 hex digest of a bearer token that opens `/metrics` on the public "
        "port (`Authorization: Bearer <token>`; `printf %s TOKEN | sha256sum`). No tenant's "
        "key does. A scrape without it, or with another, gets 401 `admin_key_required` "
        "(unless its address is in `metrics_allow`).",
    )
    metrics_allow: tuple[str, ...] = Field(
        default=(),
        description="Peer addresses or networks (`10.0.0.0/8`, `::1`) that may read `/metrics` "
        "on the public port without a token. The peer is the TCP peer: behind a proxy on the "
        "same host, every client is the proxy's address, so do not list it then.",
    )
    metrics_open: bool | None = Field(
        default=None,
        description="Whether `/metrics` on the public port needs nothing. `null` (default): "
        "open while the policy lists no `keys` and sets neither `metrics_key_sha256` nor "
        "`metrics_allow` (all traffic is the one `anonymous` tenant); once keys exist, only a "
        "scrape with the token or from an allowed address is answered, others get 401 "
        "`admin_key_required` (a token is configured) or 403 `metrics_forbidden`. `true`: "
        "open whatever the keys (tenant names and their token counts to anyone who can reach "
        "the port).",
    )

    @field_validator("listen")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None:
            match = _LISTEN.fullmatch(value)
            if match is None or not 0 < int(match["port"]) < 65536:
                raise ValueError("must be HOST:PORT (e.g. 127.0.0.1:9090 or [::1]:9090)")
        return value

    @field_validator("metrics_allow")
    @classmethod
    def _networks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for item in value:
            try:
                ipaddress.ip_network(item, strict=False)
            except ValueError:
                raise ValueError(f"{item[:60]!r} is not an address or network") from None
        return value

    @cached_property
    def allowed_networks(self) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
        return tuple(ipaddress.ip_network(item, strict=False) for item in self.metrics_allow)

    @property
    def listen_address(self) -> tuple[str, int] | None:
        """``listen`` as (host, port), brackets removed from an IPv6 host."""
        if self.listen is None:
            return None
        match = _LISTEN.fullmatch(self.listen)
        assert match is not None
        return match["host"].strip("[]"), int(match["port"])


# -- the policy -------------------------------------------------------------------------------


class Policy(Section):
    """The guard's whole configuration. Build it with :func:`guard.policy.load_policy`."""

    preset: PresetName = Field(
        default="default",
        description="A named set of values beneath the policy's own (a field set here or by "
        "a `SCHEDGUARD_*` variable wins over the preset's). `default`: limits sized for "
        "ordinary OpenAI traffic in front of a real server (the prompt and output bounded by "
        "the upstream's context window, the published API limits). `seed`: the seed's "
        "numbers (docs/SEED.md), for the tight budgets of the original patch in front of a "
        "small model: " + preset_summary("seed") + ".",
    )
    upstream: UpstreamConfig = Field(
        default_factory=lambda: UpstreamConfig(), description="The server behind the guard."
    )
    routes: tuple[str, ...] = Field(
        default=(),
        description="Upstream paths proxied besides `/v1/chat/completions`, "
        "`/v1/completions`, `/v1/embeddings` and `/v1/models`, e.g. `/v1/responses` or "
        "`/tokenize` (vLLM). Their bodies go through the same checks. Default: none.",
    )
    checks: tuple[str, ...] = Field(
        default=CHECK_NAMES,
        description="The checks run on every body, in this order; the first rejection wins. "
        "Names: " + ", ".join(f"`{n}`" for n in CHECK_NAMES) + ". Leave one out to disable it.",
    )
    limits: LimitsPolicy = Field(
        default_factory=lambda: LimitsPolicy(), description="Request limits."
    )
    rate: RatePolicy = Field(
        default_factory=lambda: RatePolicy(), description="Rate and concurrency."
    )
    keys: tuple[KeyEntry, ...] = Field(
        default=(),
        description="API keys and their tenants. Empty: no key is required and all callers "
        "share one tenant, `anonymous`. Otherwise a request without a listed key gets 401.",
    )
    observability: ObservabilityPolicy = Field(
        default_factory=lambda: ObservabilityPolicy(), description="Logs."
    )
    admin: AdminPolicy = Field(
        default_factory=lambda: AdminPolicy(),
        description="Health and metrics: a separate admin listener, or who may scrape "
        "`/metrics` on the public port (closed to others once keys exist).",
    )

    @model_validator(mode="before")
    @classmethod
    def _preset_values(cls, data: Any) -> Any:
        """The preset's values beneath the policy's own."""
        return apply_preset(data) if isinstance(data, dict) else data

    @field_validator("routes")
    @classmethod
    def _route_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for route in value:
            if not re.fullmatch(r"/[A-Za-z0-9._~/-]*", route) or "//" in route or ".." in route:
                raise ValueError(f"{route[:80]!r} must be a plain absolute path")
            if route.startswith("/guard/") or route in ("/healthz", "/readyz", "/metrics"):
                raise ValueError(f"{route!r} is the guard's own path")
        return value

    @field_validator("checks")
    @classmethod
    def _check_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            if name not in CHECK_NAMES:
                raise ValueError(f"unknown check {name[:40]!r}; known: {', '.join(CHECK_NAMES)}")
        if len(set(value)) != len(value):
            raise ValueError("a check is listed twice")
        return value

    @model_validator(mode="after")
    def _priorities_checked(self) -> Policy:
        # The schema check bounds each request's priority by its key's: without it, under
        # priority scheduling, any client could preempt every other tenant.
        if self.upstream.priority_scheduling and "schema" not in self.checks:
            raise ValueError(
                "upstream.priority_scheduling needs the schema check in `checks` (it bounds "
                "each request's priority by its key's)"
            )
        return self

    @model_validator(mode="after")
    def _unique_keys(self) -> Policy:
        seen: dict[str, int] = {}
        for i, entry in enumerate(self.keys):
            if entry.digest in seen:
                raise ValueError(f"keys[{i}] repeats the key of keys[{seen[entry.digest]}]")
            seen[entry.digest] = i
        return self

    # -- derived views, computed once per policy ----------------------------------------------

    @cached_property
    def allowed_routes(self) -> frozenset[str]:
        return frozenset(BASE_ROUTES) | frozenset(self.routes)

    @cached_property
    def keys_by_digest(self) -> dict[str, KeyEntry]:
        return {entry.digest: entry for entry in self.keys}

    @cached_property
    def rates_by_digest(self) -> dict[str, RatePolicy]:
        """Each key's rate (its overrides applied once, not per request)."""
        return {entry.digest: entry.rate.apply(self.rate) for entry in self.keys}

    def with_upstream_context(self, max_model_len: int | None) -> Policy:
        """This policy with the upstream's context window in force (see
        :meth:`TokensLimits.with_context`); itself when that changes nothing."""
        tokens = self.limits.tokens
        updated = tokens.with_context(max_model_len)
        if updated is tokens:
            return self
        limits = self.limits.model_copy(update={"tokens": updated})
        return self.model_copy(update={"limits": limits})

    @property
    def upstream_kind(self) -> UpstreamKind:
        """The upstream's kind in force: ``upstream.kind``, ``other`` while it is ``auto``
        (the detected kind replaces ``auto`` through :meth:`with_upstream_kind`)."""
        kind = self.upstream.kind
        return "other" if kind == "auto" else kind

    def with_upstream_kind(self, detected: UpstreamKind) -> Policy:
        """This policy with the upstream's kind in force: ``detected`` (what its
        ``/v1/models`` says; ``other`` when it has not answered) unless ``upstream.kind`` names
        one, and ``limits.guided.llama_cpp_schemas: auto`` decided for it (off in front of
        vLLM, on otherwise); itself when nothing changes."""
        kind = detected if self.upstream.kind == "auto" else self.upstream.kind
        policy = self
        if kind != self.upstream.kind and self.upstream.kind == "auto":
            upstream = dataclasses.replace(self.upstream, kind=kind)
            policy = policy.model_copy(update={"upstream": upstream})
        guided = self.limits.guided
        if guided.llama_cpp_schemas == "auto" and kind == "vllm":
            limits = self.limits.model_copy(
                update={"guided": dataclasses.replace(guided, llama_cpp_schemas=False)}
            )
            policy = policy.model_copy(update={"limits": limits})
        return policy

    def rate_for(self, entry: KeyEntry | None) -> RatePolicy:
        """The rate limits of one key (``rate.anonymous``'s for the anonymous tenant)."""
        if entry is None:
            return self.rate.anonymous_rate
        rate = self.rates_by_digest.get(entry.digest)
        return rate if rate is not None else entry.rate.apply(self.rate)

    def priority_for(self, key: CallerKey | None) -> int | None:
        """The best priority the upstream may schedule this caller's requests with: its key's
        ``rate.priority`` (the anonymous tenant's: ``rate.priority``); ``None`` when the
        upstream does not schedule by priority (``upstream.priority_scheduling`` off)."""
        if not self.upstream.priority_scheduling:
            return None
        rate = None if key is None else self.rates_by_digest.get(key.digest)
        return (rate or self.rate).priority

    def slot_limits_for(self, entry: KeyEntry | None, rate: RatePolicy) -> ConcurrencyLimits:
        """The concurrency limits of one key under its ``rate`` (:meth:`rate_for`); the
        anonymous tenant's are ``rate.anonymous_slot_limits``."""
        return rate.slot_limits if entry is not None else self.rate.anonymous_slot_limits


def is_section(annotation: Any) -> TypeGuard[type]:
    """Whether a field of this type is a section: a policy model or a limit set."""
    return isinstance(annotation, type) and (
        issubclass(annotation, BaseModel) or is_pydantic_dataclass(annotation)
    )


def section_fields(section: type) -> dict[str, FieldInfo]:
    """A section's fields by attribute name, in order."""
    if issubclass(section, BaseModel):
        return section.model_fields
    fields: dict[str, FieldInfo] = getattr(section, "__pydantic_fields__")  # noqa: B009
    return fields


def model_dump_for(model: BaseModel) -> dict[str, Any]:
    """A JSON-compatible dump using the YAML names (``json``, ``schema``)."""
    return model.model_dump(mode="json", by_alias=True)

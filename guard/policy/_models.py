"""The guard's policy as pydantic models: every field typed, bounded, described and defaulted.

Descriptions are the documentation: docs/POLICY.md's reference is generated from them
(:func:`guard.policy._docs.policy_reference`), and a test keeps the two in step. Defaults are
chosen from the peers in THREATS.md and explained in each description.
"""

from __future__ import annotations

import hashlib
import re
from functools import cached_property
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from guard.guided import GuidedLimits
from guard.jinja import SAFE_TEMPLATE_KWARGS
from guard.jinja._meters import ChatTemplateLimits
from guard.json import JsonLimits

# Ints are strict (no "12" or 12.0 or true); YAML and the environment give real ints.
PosInt = Annotated[int, Field(strict=True, gt=0)]
NonNegInt = Annotated[int, Field(strict=True, ge=0)]
PosFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]

# The names of the checks the pipeline knows, in the default order (cheapest first: fan-out
# reads a few fields and counts lists without walking them, so 2,000 messages are refused
# before the schema types each one; the tokenizer and the regex engine last, so that a request
# refused for a cheap reason never reaches them).
CHECK_NAMES: tuple[str, ...] = ("fanout", "schema", "templates", "multimodal", "tokens", "guided")

# Routes every guard proxies; `routes` adds to them.
BASE_ROUTES: tuple[str, ...] = (
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/models",
)

ANONYMOUS_TENANT = "anonymous"


class Section(BaseModel):
    """Base of every policy model: unknown fields are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# -- upstream ---------------------------------------------------------------------------------


class UpstreamPolicy(Section):
    url: str | None = Field(
        default=None,
        description="Base URL of the upstream server (vLLM, SGLang, llama.cpp, TGI or the "
        "reference scheduler), e.g. `http://127.0.0.1:8000`. `null`: `schedguard serve` starts "
        "the reference scheduler (hardened profile) as an embedded upstream.",
    )
    connect_timeout_s: PosFloat = Field(
        default=5.0, description="Seconds to open a connection to the upstream (then 502)."
    )
    read_timeout_s: PosFloat = Field(
        default=60.0,
        description="Seconds to wait for the next bytes of an upstream response, streamed or "
        "not (then 504). Covers the time to the first token of a long prompt.",
    )
    total_timeout_s: PosFloat = Field(
        default=600.0,
        description="Seconds one upstream request may take in all, stream included (then 504 "
        "or, mid-stream, a cleanly ended stream).",
    )
    max_connections: PosInt = Field(
        default=256,
        description="Pooled keep-alive connections to the upstream, at most; as many as the "
        "upstream's concurrent requests (vLLM's default `max_num_seqs` is 256).",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
            raise ValueError("must be an http:// or https:// URL without query or fragment")
        return value.rstrip("/") if value is not None else None


# -- limits -----------------------------------------------------------------------------------


class BodyLimits(Section):
    max_body_bytes: PosInt = Field(
        default=4 * 1_048_576,
        description="Largest request body in bytes, counted while reading (413 before the "
        "rest is read). 4 MiB holds a 2048-token prompt many times over and a few base64 "
        "images; raise it with `limits.json.max_string_bytes` for larger media.",
    )
    max_header_count: PosInt = Field(
        default=100,
        description="Most request headers (HTTP clients send about 10 to 20; Go and nginx "
        "accept about 100).",
    )
    max_header_bytes: PosInt = Field(
        default=16_384,
        description="Most bytes of all request headers together (Node.js's default; one "
        "8 MB header is a known attack, vLLM GHSA-rxc4-3w6r-4v47).",
    )
    body_read_timeout_s: PosFloat = Field(
        default=10.0,
        description="Seconds allowed to receive the whole body (a slow body then gets 408).",
    )
    content_encoding: Literal["refuse", "inflate"] = Field(
        default="refuse",
        description="`refuse`: a compressed body (`Content-Encoding` other than `identity`) "
        "gets 415. `inflate`: gzip and deflate bodies are inflated under "
        "`max_inflated_bytes` and `max_inflate_ratio`, and the inflated body is checked.",
    )
    max_inflated_bytes: PosInt = Field(
        default=4 * 1_048_576,
        description="With `inflate`: largest body after inflating (413 beyond it; inflating "
        "stops there, so a gzip bomb costs at most this much).",
    )
    max_inflate_ratio: PosFloat = Field(
        default=32.0,
        description="With `inflate`: largest ratio of inflated to compressed size (JSON "
        "compresses 5 to 10 times; bombs 1000 times).",
    )


class JsonPolicy(Section):
    """The fields of :class:`guard.json._reader.JsonLimits` (its ``max_body_bytes`` comes from
    ``limits.body``)."""

    max_depth: int = Field(
        default=32,
        strict=True,
        ge=1,
        le=128,
        description="Deepest nesting of arrays and objects, scanned before parsing (a chat "
        "request nests about 5 deep; JSON schemas add 2 per level). At most 128.",
    )
    max_keys_per_object: PosInt = Field(default=256, description="Most keys in one JSON object.")
    max_total_keys: PosInt = Field(
        default=10_000, description="Most object keys in the whole body."
    )
    max_array_length: PosInt = Field(
        default=4096,
        description="Most elements of one array: messages, content parts, batched prompts, "
        "token ids. Raise it for long token-id prompts or big embedding batches.",
    )
    max_string_bytes: PosInt = Field(
        default=1_048_576,
        description="Longest string (UTF-8 bytes after unescaping, keys too): a long prompt or "
        "a ~750 KB image as a base64 data URL.",
    )
    max_number_chars: PosInt = Field(
        default=64, description="Longest number as written (a 64-bit integer takes 20 characters)."
    )
    max_containers: PosInt = Field(
        default=100_000,
        description="Most arrays and objects in the body (an empty list costs the parser 56 "
        "bytes for 2 bytes of body).",
    )


class SchemaPolicy(Section):
    unknown_fields: Literal["allow", "reject"] = Field(
        default="allow",
        description="Fields the guard does not know (OpenAI's, vLLM's, SGLang's, TGI's and "
        "llama.cpp's common parameters are known): `allow` forwards them (OpenAI SDKs send "
        "new parameters first), `reject` refuses the request (`unknown_field`), so that no "
        "parameter the guard cannot check reaches the upstream.",
    )
    extra_known_fields: tuple[str, ...] = Field(
        default=(),
        description="More top-level field names to treat as known (with `reject`): the "
        "upstream's own extensions you accept unchecked.",
    )
    denied_fields: tuple[str, ...] = Field(
        default=("logits_processors", "mm_processor_kwargs"),
        description="Top-level fields refused in every mode (`field_not_allowed`). "
        "`logits_processors` names code for vLLM to load; `mm_processor_kwargs` overrides the "
        "media processor (frames, pixels) behind the multimodal caps.",
    )


class ChatTemplatePolicy(Section):
    """The fields of :class:`guard.jinja._chat_template.ChatTemplateLimits`."""

    max_source_bytes: PosInt = Field(
        default=64 * 1024, description="Largest request chat template (real ones are 1 to 10 KB)."
    )
    max_block_nesting: PosInt = Field(default=16, description="Deepest `{% %}` block nesting.")
    max_expr_nesting: PosInt = Field(
        default=16, description="Deepest bracket nesting in expressions."
    )
    max_syntax_tokens: PosInt = Field(default=6_000, description="Most Jinja syntax tokens.")
    max_iterations: PosInt = Field(
        default=50_000,
        description="Loop items plus calls over one whole render (nested loops count).",
    )
    max_range: PosInt = Field(default=10_000, description="Largest `range()`.")
    max_value_chars: PosInt = Field(
        default=256 * 1024, description="Longest string the template makes (`'A' * 10**10` stops)."
    )
    max_items: PosInt = Field(default=65_536, description="Longest list, tuple or dict it makes.")
    max_int_bits: PosInt = Field(
        default=4096, description="Largest integer, in bits (`10**(10**7)`)."
    )
    max_width: PosInt = Field(
        default=1024,
        description="Widest padding, indent, format width or precision (`center`, ...).",
    )
    max_format_fields: PosInt = Field(
        default=256, description="Most fields in one `format` string."
    )
    max_call_depth: PosInt = Field(default=64, description="Deepest macro and call nesting.")
    max_materialized: PosInt = Field(
        default=16 * 1024 * 1024,
        description="Everything the render makes, summed (characters; 8 per container item).",
    )
    max_output_chars: PosInt = Field(default=1024 * 1024, description="Longest rendered prompt.")
    deadline_s: PosFloat | None = Field(
        default=0.25,
        description="Seconds one validation render may take (the hardened scheduler's render "
        "deadline; the library default is 1 s). `null`: none.",
    )

    def to_limits(self) -> ChatTemplateLimits:
        return ChatTemplateLimits(**self.model_dump())


class TemplatesPolicy(Section):
    max_depth: int = Field(
        default=8,
        strict=True,
        ge=1,
        le=64,
        description="Deepest `{{ }}` placeholder nesting in `prompt_template` and "
        "`template_vars` values, through variables too (the seed's patch: 8).",
    )
    max_expansion_chars: PosInt = Field(
        default=65_536,
        description="Most characters `prompt_template` may expand to with `template_vars`, "
        "bounded before any expansion (billion-laughs variables stop here). 64 KiB is about 8 "
        "times a 2048-token prompt.",
    )
    max_expansions: PosInt = Field(
        default=16_384,
        description="Most placeholder expansions in one `prompt_template` (the hardened "
        "scheduler's step budget).",
    )
    allow_request_chat_template: bool = Field(
        default=False,
        description="Accept `chat_template` (top level or in `chat_template_kwargs`) from "
        "requests. Refused by default, as vLLM does without `--trust-request-chat-template`; "
        "when allowed, each is scanned, compiled and rendered in the hardened sandbox.",
    )
    render_request_chat_template: bool = Field(
        default=True,
        description="When request templates are allowed: render each with the request's "
        "messages under `chat_template` limits and `limits.tokens.max_prompt_tokens` before "
        "forwarding (else only scan and compile it).",
    )
    chat_template_kwargs_allowlist: tuple[str, ...] = Field(
        default=tuple(sorted(SAFE_TEMPLATE_KWARGS)),
        description="`chat_template_kwargs` keys accepted (switches real templates read). "
        "`tokenize` may not be listed (vLLM GHSA-69j4-grxj-j64p), nor `chat_template` (see "
        "`allow_request_chat_template`).",
    )
    chat_template: ChatTemplatePolicy = Field(
        default_factory=lambda: ChatTemplatePolicy(),
        description="Limits of the hardened sandbox for request chat templates.",
    )

    @field_validator("chat_template_kwargs_allowlist")
    @classmethod
    def _no_dangerous_kwargs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in ("tokenize", "chat_template"):
            if name in value:
                raise ValueError(f"{name!r} may not be allowlisted")
        return value


class TokensPolicy(Section):
    tokenizer: str = Field(
        default="cl100k_base",
        description="Tokenizer counting prompt tokens: a tiktoken encoding name (bundled, no "
        "network) or the path of a Hugging Face `tokenizer.json` (use the upstream model's for "
        "exact counts).",
    )
    max_prompt_tokens: PosInt = Field(
        default=2048,
        description="Most prompt tokens in one request (the seed's cap), summed over messages' "
        "text, prompt strings and token ids, tool definitions and template text.",
    )
    max_output_tokens: PosInt = Field(
        default=2048,
        description="Largest `max_tokens` / `max_completion_tokens` (and llama.cpp's "
        "`n_predict`, TGI's `max_new_tokens`, the responses API's `max_output_tokens`).",
    )
    default_max_tokens: PosInt = Field(
        default=256,
        description="Injected as `max_tokens` when a generation request sets none, so every "
        "forwarded request has a bounded output (the reference scheduler's chat default).",
    )
    over_max_output: Literal["reject", "clamp"] = Field(
        default="reject",
        description="A requested output cap above `max_output_tokens`: `reject` "
        "(`max_tokens_exceeded`) or `clamp` it to `max_output_tokens`.",
    )
    context_length: PosInt | None = Field(
        default=4096,
        description="The upstream's context window: each prompt plus its output cap must fit "
        "(`context_length_exceeded`). `null`: not checked.",
    )
    per_message_tokens: NonNegInt = Field(
        default=4,
        description="Tokens added per chat message for the template's role markers (OpenAI "
        "counts 3 to 4).",
    )
    exact_costs: bool = Field(
        default=False,
        description="Count prompt tokens exactly even when the byte length already proves "
        "the prompt is within the cap. `false` reports the byte length as an upper bound "
        "(cheaper; the rate limiter reconciles from the upstream's `usage`).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TokensPolicy:
        if self.default_max_tokens > self.max_output_tokens:
            raise ValueError("default_max_tokens must be <= max_output_tokens")
        if self.context_length is not None and self.default_max_tokens >= self.context_length:
            raise ValueError("default_max_tokens must be < context_length")
        return self


class FanoutPolicy(Section):
    max_n: PosInt = Field(
        default=16,
        description="Largest `n` (choices per prompt). vLLM allows 16384; OpenAI 128; each "
        "choice also reserves `max_tokens` of output against the token rate.",
    )
    max_best_of: PosInt = Field(default=2, description="Largest `best_of` (TGI's default: 2).")
    max_logprobs: NonNegInt = Field(
        default=5,
        description="Largest completions `logprobs` (OpenAI's limit: 5). Negative values "
        "(vLLM: the whole vocabulary) are refused.",
    )
    max_top_logprobs: NonNegInt = Field(
        default=5, description="Largest `top_logprobs` / TGI `top_n_tokens` (TGI's default: 5)."
    )
    max_prompt_logprobs: NonNegInt = Field(
        default=5,
        description="Largest vLLM `prompt_logprobs` (a score per prompt token per "
        "alternative); -1 (the whole vocabulary) is refused.",
    )
    max_prompts: PosInt = Field(
        default=64,
        description="Most prompts in a list-valued `prompt` or embeddings `input` (each is a "
        "sequence; vLLM GHSA-3mwp-wvh9-7528).",
    )
    max_stop_sequences: PosInt = Field(
        default=8,
        description="Most `stop` sequences (OpenAI and TGI: 4; each is matched against every "
        "output delta).",
    )
    max_stop_bytes: PosInt = Field(
        default=256, description="Longest `stop` sequence, in UTF-8 bytes."
    )
    max_logit_bias: NonNegInt = Field(
        default=300, description="Most `logit_bias` entries (OpenAI's limit: 300)."
    )
    max_messages: PosInt = Field(default=512, description="Most chat messages in one request.")
    max_content_parts: PosInt = Field(
        default=256, description="Most content parts over all messages of one request."
    )


class GuidedPolicy(Section):
    """The fields of :class:`guard.guided._check.GuidedLimits`."""

    max_regex_length: PosInt = Field(default=2048, description="Longest regex, in characters.")
    max_regex_nesting: PosInt = Field(default=32, description="Deepest group nesting in a regex.")
    max_regex_repeat_product: PosInt = Field(
        default=1000, description="Largest product of nested `{m,n}` counts (`a{100}{100}{100}`)."
    )
    max_regex_program_size: PosInt = Field(
        default=10_000,
        description="Largest RE2 program for one regex (compile time grows with it).",
    )
    max_regex_ambiguous_ways: PosInt = Field(
        default=4096, description="Most ways nested repetition can match the same text (`(a+)+b`)."
    )
    max_regex_adjacent_unbounded: PosInt = Field(
        default=4, description="Most adjacent unbounded repetitions over overlapping characters."
    )
    re2_max_mem: PosInt = Field(
        default=1 << 20, description="RE2's memory budget per regex, in bytes."
    )
    max_regexes: PosInt = Field(default=128, description="Most regexes per request.")
    max_regex_total_length: PosInt = Field(
        default=16_384, description="Most regex characters per request."
    )
    max_regex_total_program_size: PosInt = Field(
        default=50_000, description="Largest summed RE2 program size per request."
    )
    max_schema_depth: PosInt = Field(
        default=64, description="Deepest JSON-schema nesting, also after `$ref` expansion."
    )
    max_schema_nodes: PosInt = Field(
        default=10_000, description="Most schema nodes per request, after `$ref` expansion."
    )
    max_schema_chars: PosInt = Field(
        default=262_144, description="Most characters of schema keys and strings per request."
    )
    max_schema_refs: PosInt = Field(default=256, description="Most `$ref` per request.")
    allow_recursive_refs: bool = Field(
        default=False, description="Accept recursive `$ref` (a schema that expands without end)."
    )
    max_schema_enum: PosInt = Field(default=1024, description="Largest `enum`.")
    max_schema_length_bound: PosInt = Field(
        default=10_000, description="Largest `minLength` / `maxLength`."
    )
    max_schema_items_bound: PosInt = Field(
        default=1_000, description="Largest `minItems`, `maxItems`, `minProperties`, ..."
    )
    max_schema_number: PosFloat = Field(
        default=1e15, description="Largest magnitude of `minimum`, `maximum`, `multipleOf`, ..."
    )
    max_schemas: PosInt = Field(default=128, description="Most JSON schemas per request.")
    max_grammar_chars: PosInt = Field(
        default=32_768, description="Longest grammar (GBNF, EBNF, Lark)."
    )
    max_grammar_depth: PosInt = Field(
        default=64, description="Deepest grammar nesting (llama.cpp recurses once per group)."
    )
    max_grammar_rules: PosInt = Field(default=1024, description="Most grammar rules.")
    max_grammar_repeat: PosInt = Field(
        default=1000, description="Largest product of nested `{m,n}` in a grammar."
    )
    max_grammar_repeat_total: PosInt = Field(
        default=10_000, description="Largest sum of `{m,n}` counts in one grammar."
    )
    max_choices: PosInt = Field(default=256, description="Most `guided_choice` entries.")
    max_choice_chars: PosInt = Field(
        default=65_536, description="Most characters over all `guided_choice` entries."
    )

    def to_limits(self) -> GuidedLimits:
        return GuidedLimits(**self.model_dump())


class MultimodalPolicy(Section):
    max_media_parts: PosInt = Field(
        default=16,
        description="Most media content parts (`image_url`, `video_url`, `audio_url`, "
        "`input_audio`, `input_image`, `file`, ...) in one request.",
    )
    max_data_url_bytes: PosInt = Field(
        default=1_048_576,
        description="Longest `data:` URL or inline base64 media (`input_audio.data`), in "
        "bytes. `limits.json.max_string_bytes` also applies.",
    )
    max_frames_per_data_url: PosInt = Field(
        default=64,
        description="Most frames in one `video/jpeg` data URL (vLLM's comma-separated base64 "
        "JPEG frames; vLLM samples 32 by default). Frames of encoded video (mp4, webm) are not "
        "counted: the byte cap bounds them.",
    )
    max_image_pixels: PosInt = Field(
        default=25_000_000,
        description="Largest width x height of an inline image, read from its header (PNG, "
        "GIF, JPEG, WebP, BMP) without decoding it: a tiny file can declare huge dimensions. "
        "Pillow warns at 89 M.",
    )
    allow_remote_urls: bool = Field(
        default=True,
        description="Accept `http(s)://` media URLs (the upstream fetches them; the guard "
        "cannot size them). Other schemes (`file:`, ...) are always refused.",
    )


class LimitsPolicy(Section):
    body: BodyLimits = Field(
        default_factory=lambda: BodyLimits(), description="HTTP framing limits."
    )
    json_: JsonPolicy = Field(
        default_factory=lambda: JsonPolicy(), alias="json", description="Bounded JSON parsing."
    )
    schema_: SchemaPolicy = Field(
        default_factory=lambda: SchemaPolicy(), alias="schema", description="Request field types."
    )
    templates: TemplatesPolicy = Field(
        default_factory=lambda: TemplatesPolicy(), description="Prompt and chat templates."
    )
    tokens: TokensPolicy = Field(default_factory=lambda: TokensPolicy(), description="Token caps.")
    fanout: FanoutPolicy = Field(
        default_factory=lambda: FanoutPolicy(), description="Fan-out caps."
    )
    guided: GuidedPolicy = Field(
        default_factory=lambda: GuidedPolicy(), description="Guided-decoding constraints."
    )
    multimodal: MultimodalPolicy = Field(
        default_factory=lambda: MultimodalPolicy(), description="Media parts."
    )

    model_config = ConfigDict(populate_by_name=True)


# -- rate and keys ----------------------------------------------------------------------------


class RatePolicy(Section):
    requests_per_minute: PosInt | None = Field(
        default=600,
        description="Requests per minute per API key (token bucket refilled continuously). "
        "`null`: unlimited.",
    )
    tokens_per_minute: PosInt | None = Field(
        default=200_000,
        description="Tokens per minute per API key, charged before forwarding with the prompt "
        "tokens plus the reserved output (`max_tokens` x sequences), reconciled from the "
        "upstream's `usage`. `null`: unlimited.",
    )
    burst: PosInt = Field(
        default=20, description="Requests one key may send at once: the request bucket's capacity."
    )
    token_burst: PosInt | None = Field(
        default=None,
        description="The token bucket's capacity. `null`: `tokens_per_minute` (a minute's worth).",
    )
    per_key_concurrency: PosInt = Field(
        default=16, description="Requests in flight per API key (more wait in the queue)."
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

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"(rediss?|unix)://", value):
            raise ValueError("must be a redis://, rediss:// or unix:// URL")
        return value


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

    def apply(self, base: RatePolicy) -> RatePolicy:
        """``base`` with the fields this override sets."""
        update = {k: getattr(self, k) for k in self.model_fields_set}
        # burst and per_key_concurrency cannot be unlimited: null there means "inherit".
        for name in ("burst", "per_key_concurrency"):
            if update.get(name, 0) is None:
                del update[name]
        return base.model_copy(update=update) if update else base


_TENANT = re.compile(r"[A-Za-z0-9_.:@-]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


def key_digest(key: str) -> str:
    """The SHA-256 hex digest by which keys are stored, looked up and shown."""
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class KeyEntry(Section):
    key: SecretStr | None = Field(
        default=None,
        description="The API key, as sent in `Authorization: Bearer <key>`. Prefer "
        "`key_sha256`, so the policy file holds no secret.",
    )
    key_sha256: str | None = Field(
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

    @field_validator("key_sha256")
    @classmethod
    def _hex_digest(cls, value: str | None) -> str | None:
        if value is not None:
            value = value.lower()
            if not _SHA256.fullmatch(value):
                raise ValueError("must be 64 hexadecimal digits")
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
        default=True, description="Write a structured JSON access log line per request (stderr)."
    )
    log_prompts: bool = Field(
        default=False,
        description="Include prompt text in the access log. Off by default: prompts are user data.",
    )


# -- the policy -------------------------------------------------------------------------------


class Policy(Section):
    """The guard's whole configuration. Build it with :func:`guard.policy.load_policy`."""

    upstream: UpstreamPolicy = Field(
        default_factory=lambda: UpstreamPolicy(), description="The server behind the guard."
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
    def json_limits(self) -> JsonLimits:
        body = self.limits.body
        largest = body.max_body_bytes
        if body.content_encoding == "inflate":
            largest = max(largest, body.max_inflated_bytes)
        return JsonLimits(**self.limits.json_.model_dump(), max_body_bytes=largest)

    @cached_property
    def guided_limits(self) -> GuidedLimits:
        return self.limits.guided.to_limits()

    @cached_property
    def chat_template_limits(self) -> ChatTemplateLimits:
        return self.limits.templates.chat_template.to_limits()

    def rate_for(self, entry: KeyEntry | None) -> RatePolicy:
        """The rate limits of one key (the global ones for the anonymous tenant)."""
        return self.rate if entry is None else entry.rate.apply(self.rate)


def model_dump_for(model: BaseModel) -> dict[str, Any]:
    """A JSON-compatible dump using the YAML names (``json``, ``schema``)."""
    return model.model_dump(mode="json", by_alias=True)

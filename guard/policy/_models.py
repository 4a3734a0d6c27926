"""The guard's policy as pydantic models: every field typed, bounded, described and defaulted.

The limit sets the guard's code reads (framing, JSON, guided decoding, the chat-template
sandbox, the upstream, the rate buckets) are declared next to that code (see
:mod:`guard._limits`) and used here as sections as they are; the rest is declared here.
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
from typing import Annotated, Any, Literal

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

from guard._limits import LIMITS_CONFIG, NonNegInt, PosFloat, PosInt
from guard.admission import ConcurrencyLimits, RateLimits
from guard.guided import GuidedLimits
from guard.http import ConnectionLimits, FramingLimits, UpstreamConfig
from guard.jinja import COMMON_TEMPLATE_KWARGS, RESERVED_TEMPLATE_KWARGS, ChatTemplateLimits
from guard.json import JsonLimits
from guard.presets import PresetName, apply_preset, preset_summary

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
# What the upstream is (``upstream.kind`` once ``auto`` is decided).
UpstreamKind = Literal["vllm", "llama_cpp", "other"]
# The context window when neither the policy nor the upstream says (Llama 2's; small models').
DEFAULT_CONTEXT_LENGTH = 4096


class Section(BaseModel):
    """Base of every policy model: unknown fields are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


# -- limits -----------------------------------------------------------------------------------


# The default `limits.schema.denied_fields` (reasons in its description).
DENIED_FIELDS: tuple[str, ...] = (
    "logits_processors",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "request_id",
    "session_id",
    "prompt_embeds",
    "return_prompt_text",
    "previous_response_id",
    "previous_input_messages",
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
        default=DENIED_FIELDS,
        description="Top-level fields refused whatever their value, in every `unknown_fields` "
        "mode (`field_not_allowed`): vLLM 0.32's fields that reach code, caches or limits "
        "behind the guard (the table of vLLM's cost fields above). `logits_processors` names "
        "code for vLLM to load; `mm_processor_kwargs` and `media_io_kwargs` override the "
        "media processor and loader (frames, pixels) behind the multimodal caps; "
        "`kv_transfer_params` (its `prompt_token_ids` replace the rendered prompt, past the "
        "token count), `ec_transfer_params` and `vllm_xargs` go to the engine and its plugins; "
        "a client `request_id` names the stored response on the Responses API (another "
        "tenant's, when it collides) and `session_id` routes; `prompt_embeds` is up to 2 GiB "
        "of tensor; `return_prompt_text` returns the server-side template and system prompt; "
        "`previous_response_id` and `previous_input_messages` replay server-stored history "
        "the guard never counted. Remove one only if a trusted client needs it.",
    )


@dataclass(frozen=True, config=LIMITS_CONFIG)
class RequestTemplateLimits(ChatTemplateLimits):
    """The sandbox's limits for request chat templates: the library's, with the hardened
    scheduler's render deadline instead of its 1 s."""

    deadline_s: PosFloat | None = Field(
        default=0.25,
        description="Seconds one validation render may take (the hardened scheduler's render "
        "deadline; the library default is 1 s). `null`: none.",
    )


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
        default=tuple(sorted(COMMON_TEMPLATE_KWARGS)),
        description="`chat_template_kwargs` keys accepted whatever the template: the switches "
        "the chat templates of common open-weight models read (Qwen 3, GLM 4.5, Gemma 4 and "
        "SmolLM 3's `enable_thinking`; DeepSeek V3.1 and Granite's `thinking`; gpt-oss's "
        "`reasoning_effort`, `model_identity`, `builtin_tools`; Llama 3.1's "
        "`tools_in_user_message`, `date_string`, `builtin_tools`, `custom_tools`; Command R's "
        "`citation_mode`, `safety_mode`; Granite 3.3's `controls`; Qwen2-VL's "
        "`add_vision_id`; SmolLM 3's `xml_tools`, `python_tools`), `documents` (Command R's "
        "and Granite's RAG documents, as granite-io and vLLM's examples send them), and "
        "`add_generation_prompt`, `continue_final_message`. The reserved names (below) may not "
        "be listed.",
    )
    chat_template_kwargs_from_template: bool = Field(
        default=True,
        description="Also accept every variable the upstream's chat template reads "
        "(`limits.tokens.chat_template`, configured or found next to the tokenizer), taken "
        "from its syntax tree as vLLM takes them (`jinja2.meta.find_undeclared_variables`). "
        "Never accepted, whatever the template reads, are the names that change what the "
        "server does rather than what the template prints: `chat_template` (see "
        "`allow_request_chat_template`), `tokenize` (vLLM GHSA-69j4-grxj-j64p), "
        "`conversation`, `messages`, `tools` (use the top-level fields), the "
        "tokenizer arguments of `apply_chat_template` (`padding`, `truncation`, `max_length`, "
        "`return_tensors`, `return_dict`, `return_assistant_tokens_mask`, "
        "`tokenizer_kwargs`, `processor_kwargs`, `mm_processor_kwargs`), the special tokens "
        "(`bos_token`, `eos_token`, ...) and the functions and Jinja globals templates call "
        "(`raise_exception`, `strftime_now`, `range`, `namespace`, ...).",
    )
    max_chat_template_kwargs_bytes: PosInt = Field(
        default=16_384,
        description="Most bytes of all `chat_template_kwargs` values together, weighed as "
        "indent-4 JSON as the prompt count weighs them (`chat_template_kwarg_not_allowed` "
        "beyond): strings, numbers, and the lists and objects some templates read "
        "(`builtin_tools`, `controls`). `documents` is content, not a switch: it is not held "
        "to this cap but counted in the prompt's tokens, as every value here is.",
    )
    chat_template: RequestTemplateLimits = Field(
        default_factory=lambda: RequestTemplateLimits(),
        description="Limits of the hardened sandbox for request chat templates.",
    )

    @field_validator("chat_template_kwargs_allowlist")
    @classmethod
    def _no_dangerous_kwargs(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            reason = RESERVED_TEMPLATE_KWARGS.get(name)
            if reason is not None:
                raise ValueError(f"{name[:64]!r} may not be allowlisted: {reason}")
        return value


class TokensPolicy(Section):
    tokenizer: str = Field(
        default="cl100k_base",
        description="Tokenizer counting prompt tokens: a tiktoken encoding name (bundled, no "
        "network) or the path of a Hugging Face `tokenizer.json`. Name the upstream model's: "
        "with it (and its chat template) the prompt count is an upper bound of the upstream's "
        "`usage.prompt_tokens`.",
    )
    chat_template: str | None = Field(
        default="auto",
        description="The upstream's chat template, for exact chat counts: a `.jinja` file, a "
        "`tokenizer_config.json` (its `chat_template`), a `.gguf` model (llama.cpp: its "
        "`tokenizer.chat_template` and BOS/EOS) or a model directory. `auto`: the "
        "`chat_template.jinja`, `tokenizer_config.json` or single `.gguf` next to `tokenizer` "
        "when it is a `tokenizer.json` path. A chat the byte bound cannot decide is then rebuilt as "
        "the upstream builds it (`render_like`), rendered in the hardened sandbox "
        "(`limits.templates.chat_template` limits) and tokenized. `null`, or none found: the "
        "fallback bound (each renderable field counted once, structured values weighed as "
        "indent-4 JSON, plus the overheads below), sound for templates that print each field "
        "at most once with ChatML- or Llama-3-style markup.",
    )
    render_like: tuple[Literal["vllm", "llama_cpp"], ...] = Field(
        default=("vllm", "llama_cpp"),
        min_length=1,
        description="Upstreams whose way of building the conversation is modelled; the "
        "largest count wins. `vllm` (0.32): tool-call arguments parsed and printed again, "
        "content normalised, media as placeholders. `llama_cpp` (llama-cpp-python 0.3.36): "
        "messages as sent, so a text-only template prints list content as it is, media URLs "
        "included (then media URLs also count as text in the fallback). List only yours. Left "
        "out, it follows the upstream kind in force (`upstream.kind`, set or detected): `vllm` "
        "alone in front of vLLM, `llama_cpp` alone in front of llama-cpp-python, both "
        "otherwise.",
    )
    content_format: Literal["auto", "string", "openai"] = Field(
        default="auto",
        description="vLLM's `--chat-template-content-format`: `auto` detects from the "
        "template whether it loops over message content (`openai`: parts stay dicts, extra "
        "keys included) or not (`string`: texts joined with newlines).",
    )
    max_prompt_tokens: PosInt | None = Field(
        default=None,
        description="Most prompt tokens in one request, summed over its sequences: messages' "
        "text, prompt strings and token ids, tool definitions and calls, template text, media "
        "token estimates. `null` (default): no cap below the context window (each prompt plus "
        "its output must fit `context_length`), as the upstream itself allows. The `seed` "
        "preset sets 2048 (the seed's cap).",
    )
    max_output_tokens: PosInt | None = Field(
        default=None,
        description="Largest `max_tokens` / `max_completion_tokens` (and llama.cpp's "
        "`n_predict`, TGI's `max_new_tokens`, the responses API's `max_output_tokens`). `null` "
        "(default): what the context window allows (`context_length` minus one prompt token; "
        "the prompt plus the cap must fit too), as vLLM allows. The `seed` preset: 2048.",
    )
    default_max_tokens: PosInt | None = Field(
        default=None,
        description="Injected as `max_tokens` when a generation request sets no output cap. "
        "`null` (default): nothing is injected and the request is forwarded unchanged: the "
        "upstream generates at most to the end of its window (vLLM's own default), and the "
        "token rate limiter reserves that remainder (`context_length` minus the prompt, per "
        "sequence; at most the key's token bucket), reconciled from the upstream's `usage`. "
        "The `seed` preset: 256 (the reference scheduler's chat default).",
    )
    over_max_output: Literal["reject", "clamp"] = Field(
        default="reject",
        description="A requested output cap above the largest allowed (`max_output_tokens`, "
        "else what the context window allows): `reject` (`max_tokens_exceeded`) or `clamp` it "
        "to that cap (a mutation).",
    )
    context_length: PosInt | None = Field(
        default=DEFAULT_CONTEXT_LENGTH,
        description="The upstream's context window: each prompt plus its output cap must fit "
        "(`context_length_exceeded`). Set here (a number, or `null`: not checked), it is the "
        "one in force. Left out (or `auto`), the upstream's own wins when it reports one "
        "(vLLM's `/v1/models` `max_model_len`, read at start-up and on readiness), else this "
        "default, 4096 (llama.cpp reports none: set it to the server's `n_ctx`). "
        "`schedguard policy show`, `/readyz` and the dry run say which is in force.",
    )
    context_length_from: Literal["upstream", "policy"] = Field(
        default="upstream",
        description="Where the context window comes from: `upstream` (the upstream's "
        "`max_model_len` when it reports one, else `context_length`) or `policy` "
        "(`context_length` always). Setting `context_length` makes it `policy` unless this is "
        "set too.",
    )
    per_message_tokens: NonNegInt = Field(
        default=5,
        description="Fallback bound: tokens of a template's markup around each message and "
        "each tool call, the role aside (ChatML `<|im_start|>`, `\\n`, `<|im_end|>`, `\\n`: "
        "4; Llama 3: 4), plus one for a token merged across the edges.",
    )
    per_request_tokens: NonNegInt = Field(
        default=32,
        description="Fallback bound: tokens a template adds once per conversation (BOS, the "
        "generation prompt, a default system line such as Llama 3.1's dates).",
    )
    tools_tokens: NonNegInt = Field(
        default=256,
        description="Fallback bound: tokens a template adds once when tools are defined (the "
        "instructions around the tool list: ~100 for Qwen 2.5 and Llama 3.1).",
    )
    tokens_per_image: NonNegInt = Field(
        default=576,
        description="Prompt tokens counted per image (the upstream expands each into features "
        "that fill the context: LLaVA 1.5 576; Qwen2-VL up to 16384 at its max pixels). Set it "
        "to your model's worst case.",
    )
    tokens_per_video_frame: NonNegInt = Field(
        default=256,
        description="Prompt tokens counted per video frame the upstream decodes (the "
        "`video/jpeg` frames given, at most 32; 32 for other video).",
    )
    tokens_per_audio: NonNegInt = Field(
        default=750,
        description="Prompt tokens counted per audio item (Qwen2-Audio: 750 for 30 s).",
    )
    exact_costs: bool | None = Field(
        default=None,
        description="Count prompt tokens exactly (rendering the chat template when there is "
        "one) even when the byte length already proves the prompt is within the cap, so that "
        "`costs.prompt_tokens` (what the token rate limiter reserves) is the upstream's count. "
        "`false`: report the byte bound (a few microseconds instead of a render and a "
        "tokenization, ~0.1-1 ms; several times the real count, which the rate limiter "
        "reconciles from the upstream's `usage`). `null` (default): exact when the upstream's "
        "chat template is known (`chat_template`), else the byte bound.",
    )

    @model_validator(mode="before")
    @classmethod
    def _context_source(cls, data: Any) -> Any:
        """A ``context_length`` the policy sets is the one in force (``auto``: the upstream's),
        unless ``context_length_from`` says otherwise."""
        if not isinstance(data, dict) or "context_length" not in data:
            return data
        data = dict(data)
        if data["context_length"] == "auto":
            del data["context_length"]
            data.setdefault("context_length_from", "upstream")
        else:
            data.setdefault("context_length_from", "policy")
        return data

    def with_context(self, max_model_len: int | None) -> TokensPolicy:
        """These limits with the upstream's context window in force, when it reported one and
        ``context_length_from`` is ``upstream``; else these."""
        if max_model_len is None or self.context_length_from != "upstream":
            return self
        if max_model_len == self.context_length:
            return self
        return self.model_copy(update={"context_length": max_model_len})

    @model_validator(mode="after")
    def _consistent(self) -> TokensPolicy:
        default, most = self.default_max_tokens, self.max_output_tokens
        if default is not None and most is not None and default > most:
            raise ValueError("default_max_tokens must be <= max_output_tokens")
        window = self.context_length
        if default is not None and window is not None and default >= window:
            raise ValueError("default_max_tokens must be < context_length")
        return self

    @property
    def output_limit(self) -> int | None:
        """The largest output cap a request may set: ``max_output_tokens``, else what the
        context window leaves beside one prompt token; None when neither bounds it. (A cap
        within it that does not fit beside the prompt is ``context_length_exceeded``.)"""
        if self.max_output_tokens is not None:
            return self.max_output_tokens
        return None if self.context_length is None else self.context_length - 1

    @property
    def prompt_limit(self) -> int | None:
        """The most tokens one prompt may have: ``max_prompt_tokens``, else the context
        window; None when neither bounds it."""
        if self.max_prompt_tokens is not None:
            return self.max_prompt_tokens
        return self.context_length


class FanoutPolicy(Section):
    max_n: PosInt = Field(
        default=128,
        description="Largest `n` (choices per prompt): OpenAI's limit, 128 (vLLM has none). "
        "Each choice also reserves its output against the token rate. The `seed` preset: 16.",
    )
    max_best_of: PosInt = Field(
        default=20,
        description="Largest `best_of`: OpenAI's completions limit, 20 (TGI's default is 2; "
        "vLLM 0.32 ignores it). The `seed` preset: 2.",
    )
    max_logprobs: NonNegInt = Field(
        default=20,
        description="Largest completions `logprobs`: vLLM's default `--max-logprobs`, 20 "
        "(OpenAI's legacy completions allow 5). Negative values (vLLM: the whole vocabulary) "
        "are refused. The `seed` preset: 5.",
    )
    max_top_logprobs: NonNegInt = Field(
        default=20,
        description="Largest `top_logprobs` / TGI `top_n_tokens`: OpenAI's chat limit and "
        "vLLM's default `--max-logprobs`, 20. The `seed` preset: 5.",
    )
    max_prompt_logprobs: NonNegInt = Field(
        default=20,
        description="Largest vLLM `prompt_logprobs` (a score per prompt token per "
        "alternative): vLLM's default `--max-logprobs`, 20; -1 (the whole vocabulary) is "
        "refused. The `seed` preset: 5.",
    )
    max_prompts: PosInt = Field(
        default=64,
        description="Most prompts in a list-valued completions `prompt` (each is a sequence "
        "of up to the context window; vLLM GHSA-3mwp-wvh9-7528). In front of "
        "llama-cpp-python (`upstream.kind: llama_cpp`, set or detected) a completions `prompt` "
        "list is held to one whatever this says: its /v1/completions asserts it "
        '(`prompt: ["a", "b"]` is an empty 500), `prompts_exceeded` is the 400 instead.',
    )
    max_embedding_inputs: PosInt = Field(
        default=2048,
        description="Most inputs in a list-valued embeddings `input`: OpenAI's limit, 2048 "
        "(client libraries batch up to it: LangChain sends 1000). The `seed` preset: 64.",
    )
    max_stop_sequences: PosInt = Field(
        default=4,
        description="Most `stop` sequences (vLLM's `VLLM_MAX_STOP_STRINGS`, OpenAI and TGI: "
        "4; each is matched against every output delta).",
    )
    max_stop_bytes: PosInt = Field(
        default=256, description="Longest `stop` sequence, in UTF-8 bytes."
    )
    max_logit_bias: NonNegInt = Field(
        default=300, description="Most `logit_bias` entries (OpenAI's limit: 300)."
    )
    max_token_ids: NonNegInt = Field(
        default=1024,
        description="Most entries in each of `stop_token_ids`, `allowed_token_ids` and "
        "`logprob_token_ids` (vLLM builds a mask or scores each of them on every generated "
        "token; it caps only `logprob_token_ids`, at 128).",
    )
    max_bad_words: NonNegInt = Field(
        default=128,
        description="Most `bad_words` (each is tokenized twice and checked on every token; "
        "vLLM's `VLLM_MAX_NUM_BAD_WORDS`: 128).",
    )
    max_messages: PosInt = Field(
        default=2048,
        description="Most chat messages in one request (long agent sessions reach hundreds; "
        "the prompt's tokens bound the rest). The `seed` preset: 512.",
    )
    max_score_pairs: PosInt = Field(
        default=256,
        description="Most query-document pairs in one vLLM `/score` or `/rerank` request "
        "(`documents`, `items`, `text_2`, `data_2`, or the longer of the two lists): each pair "
        "is a sequence the model runs, its texts counted as prompt tokens "
        "(`prompts_exceeded`). Batched conversations in embeddings and pooling `messages` / "
        "`input` are held to `max_prompts` (each is a sequence) and their messages together to "
        "`max_messages`.",
    )
    max_content_parts: PosInt = Field(
        default=4096,
        description="Most content parts over all messages of one request (some clients send "
        "every message's content as a list of parts). The `seed` preset: 256.",
    )


class MultimodalPolicy(Section):
    max_media_parts: PosInt = Field(
        default=16,
        description="Most media content parts (`image_url`, `video_url`, `audio_url`, "
        "`input_audio`, `input_image`, `file`, ...) in one request, recognised as vLLM does: by "
        "the part's type, or by its first media key when it has a `uuid` or no `type`.",
    )
    max_data_url_bytes: PosInt = Field(
        default=1_048_576,
        description="Longest `data:` URL or inline base64 media (`input_audio.data`), in "
        "bytes. `limits.json.max_string_bytes` also applies.",
    )
    max_frames_per_data_url: PosInt = Field(
        default=64,
        description="Most frames in one `video/jpeg` data URL (vLLM's comma-separated base64 "
        "images; it decodes the first 32). Every frame is sized like an image.",
    )
    max_image_pixels: PosInt = Field(
        default=25_000_000,
        description="Largest width x height of an inline image or video frame, read from its "
        "header without decoding it (a tiny file can declare huge dimensions), whatever MIME "
        "type the data URL declares (vLLM ignores it). PNG, JPEG, GIF, BMP and WebP are sized; "
        "other formats are refused (`image_format_not_supported`). Pillow warns at 89 M, "
        "vLLM refuses over 179 M.",
    )
    max_total_pixels: PosInt = Field(
        default=100_000_000,
        description="Most pixels of all inline images and video frames of one request "
        "together (`media_pixels_exceeded`): the upstream decodes them all (3 bytes a pixel "
        "in RGB: 300 MB at the default).",
    )
    allow_remote_urls: bool = Field(
        default=True,
        description="Accept `http(s)://` media URLs (the upstream fetches them; the guard "
        "cannot size them). Other schemes (`file:`, ...) and URLs with spaces or control "
        "characters (llama-cpp-python's `urlopen` strips them) are always refused. Set it to "
        "`false` in front of llama-cpp-python, which opens any non-`data:` URL with `urlopen` "
        "(no timeout, no size cap), or of a vLLM without `--allowed-media-domains`.",
    )
    allow_encoded_video: bool = Field(
        default=False,
        description="Accept inline video that is not `video/jpeg` frames (mp4, webm, ...). "
        "Refused by default (`video_format_not_supported`): the guard does not parse "
        "containers, and vLLM's OpenCV loader grabs every frame up to the last one sampled, so "
        "1 MB of video can decode thousands of frames.",
    )
    allow_media_uuid: bool = Field(
        default=False,
        description="Accept a `uuid` on content parts. Refused by default "
        "(`media_uuid_not_allowed`): vLLM uses it instead of the content hash as the key of "
        "its media caches, so one tenant can reuse or poison what another sent, and a part "
        "with a `uuid` and no data costs media the guard cannot size.",
    )


class LimitsPolicy(Section):
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
    guided: GuidedLimits = Field(
        default_factory=lambda: GuidedLimits(), description="Guided-decoding constraints."
    )
    multimodal: MultimodalPolicy = Field(
        default_factory=lambda: MultimodalPolicy(), description="Media parts."
    )

    model_config = ConfigDict(populate_by_name=True)


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

    def apply(self, base: RatePolicy) -> RatePolicy:
        """``base`` with the fields this override sets."""
        update = {k: getattr(self, k) for k in self.model_fields_set}
        # burst and per_key_concurrency cannot be unlimited: null there means "inherit".
        for name in ("burst", "per_key_concurrency"):
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
        default=True, description="Write a structured JSON access log line per request (stderr)."
    )
    log_prompts: bool = Field(
        default=False,
        description="Include prompt text in the access log. Off by default: prompts are user data.",
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
        :meth:`TokensPolicy.with_context`); itself when that changes nothing."""
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


def is_section(annotation: Any) -> bool:
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

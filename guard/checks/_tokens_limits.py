"""The tokens check's limit set, ``limits.tokens``: the tokenizer and chat template the prompt is
counted with, the prompt and output caps, the context window, and the fallback bound's
overheads.

Declared apart from the check (:mod:`guard.checks.tokens`) because the templates and fan-out
checks read it too (the prompt cap a request chat template renders under, the output cap
``min_tokens`` is held to).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from guard._limits import LimitsModel, NonNegInt, PosInt

__all__ = ["DEFAULT_CONTEXT_LENGTH", "TokensLimits"]

# The context window when neither the policy nor the upstream says (Llama 2's; small models').
DEFAULT_CONTEXT_LENGTH = 4096


class TokensLimits(LimitsModel):
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
    max_logprob_work: PosInt | None = Field(
        default=1 << 23,
        description="In front of llama-cpp-python (`upstream.kind: llama_cpp`): the most work "
        "one request's log-probabilities may cost it, in sort entries. It sorts the whole "
        "vocabulary in Python and detokenises the text before it at every position it returns "
        "log-probabilities for (each generated token, and each prompt token with `echo`): "
        "`P x (V + 3P)` for `P` positions and the tokenizer's `V` tokens, ~0.5-1.5 us per entry "
        "on one core. The default, 8,388,608 (a few seconds), allows ~1,000 positions at a 4k "
        "vocabulary, ~250 at 32k, ~65 at 128k; `logprob_work_exceeded` names the most output "
        "tokens that fit. `null`: no limit.",
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

    def with_context(self, max_model_len: int | None) -> TokensLimits:
        """These limits with the upstream's context window in force, when it reported one and
        ``context_length_from`` is ``upstream``; else these."""
        if max_model_len is None or self.context_length_from != "upstream":
            return self
        if max_model_len == self.context_length:
            return self
        return self.model_copy(update={"context_length": max_model_len})

    @model_validator(mode="after")
    def _consistent(self) -> TokensLimits:
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

"""From a validated request to prompt token ids: parameter caps, templates, counting, encoding.

Each step is bounded in the hardened profile and naive in the vulnerable one, as the profile says:

- parameters: hardened caps ``n``, the number of prompts and ``max_tokens``;
- templates: the ``prompt_template`` extra and the chat template are rendered under the profile's
  budget (hardened: depth, tokens counted while expanding, steps, deadline). CPU-bound rendering
  runs in a worker thread in the hardened profile, so a render that uses its whole deadline does
  not stall the event loop; the vulnerable profile renders inline, as a naive server does;
- tokens: hardened counts with an early stop at ``max_prompt_tokens`` (the UTF-8 length bounds
  short prompts without tokenizing) and only then encodes; vulnerable encodes everything.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import anyio

from guard.errors import GuardError, LimitExceeded
from guard.tokens import TokenCounter, check_prompt_tokens, get_counter
from scheduler_ref.api_models import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
)
from scheduler_ref.profiles import Profile
from scheduler_ref.prompt_template import TOKEN_ENCODING, render_prompt_template

T = TypeVar("T")

# Hardened caps on fan-out parameters (TGI and vLLM cap these too; see THREATS.md).
HARDENED_MAX_N = 8
HARDENED_MAX_PROMPTS = 8
# OpenAI's own limit on stop sequences; each is scanned against every delta.
HARDENED_MAX_STOPS = 4
HARDENED_MAX_STOP_CHARS = 256
# Concurrent renders in worker threads (hardened); more wait for a slot.
_RENDER_THREADS = 4

N_EXCEEDED = "n_exceeded"
PROMPTS_EXCEEDED = "prompts_exceeded"
MAX_TOKENS_EXCEEDED = "max_tokens_exceeded"
STOP_EXCEEDED = "stop_exceeded"


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt ready for the engine; ``text`` is kept for ``echo``."""

    token_ids: list[int]
    text: str


class PromptBuilder:
    """Prepares prompts for one server's profile; holds the tokenizer and the render limiter."""

    def __init__(self, profile: Profile, tokenizer: Tokenizer) -> None:
        self.profile = profile
        self.tokenizer = tokenizer
        self._render_slots = anyio.CapacityLimiter(_RENDER_THREADS)

    # -- parameters --------------------------------------------------------------------------

    def check_fan_out(
        self, n: int, num_prompts: int, max_tokens: int | None, tokens_param: str = "max_tokens"
    ) -> None:
        if not self.profile.hardened:
            return
        if n > HARDENED_MAX_N:
            raise LimitExceeded(
                N_EXCEEDED, f"n is {n}; at most {HARDENED_MAX_N} choices per request", param="n"
            )
        if num_prompts > HARDENED_MAX_PROMPTS:
            raise LimitExceeded(
                PROMPTS_EXCEEDED,
                f"{num_prompts} prompts in one request; at most {HARDENED_MAX_PROMPTS}",
                param="prompt",
            )
        cap = self.profile.max_output_tokens
        if cap is not None and max_tokens is not None and max_tokens > cap:
            raise LimitExceeded(
                MAX_TOKENS_EXCEEDED,
                f"{tokens_param} is {max_tokens}; the limit is {cap}",
                param=tokens_param,
            )

    def stop_strings(self, stop: str | list[str] | None) -> list[str]:
        stops = [stop] if isinstance(stop, str) else list(stop or ())
        if self.profile.hardened:
            if len(stops) > HARDENED_MAX_STOPS:
                raise LimitExceeded(
                    STOP_EXCEEDED,
                    f"{len(stops)} stop sequences; at most {HARDENED_MAX_STOPS}",
                    param="stop",
                )
            if any(len(s) > HARDENED_MAX_STOP_CHARS for s in stops):
                raise LimitExceeded(
                    STOP_EXCEEDED,
                    f"a stop sequence is longer than {HARDENED_MAX_STOP_CHARS} characters",
                    param="stop",
                )
        return stops

    # -- completions -------------------------------------------------------------------------

    async def completion_prompts(self, req: CompletionRequest) -> list[Prompt]:
        if req.prompt_template is not None:
            if req.prompt is not None:
                raise GuardError(
                    "invalid_request",
                    "send either prompt or prompt_template, not both",
                    param="prompt_template",
                )
            self.check_fan_out(req.n, 1, req.max_tokens)
            text = await self._render(self._render_prompt_template, req.prompt_template, req)
            return [self._encode_text(text, "prompt_template")]
        raw = req.prompt
        if raw is None:
            raise GuardError("invalid_request", "prompt is required", param="prompt")
        items: Sequence[str | list[int]] = _prompt_items(raw)
        if not items:
            raise GuardError("invalid_request", "prompt must not be empty", param="prompt")
        self.check_fan_out(req.n, len(items), req.max_tokens)
        prompts: list[Prompt] = []
        for i, item in enumerate(items):
            param = "prompt" if len(items) == 1 else f"prompt[{i}]"
            if isinstance(item, str):
                prompts.append(self._encode_text(item, param))
            else:
                prompts.append(self._check_ids(item, param))
        return prompts

    # -- chat --------------------------------------------------------------------------------

    async def chat_prompt(self, req: ChatCompletionRequest) -> Prompt:
        tokens_param = (
            "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
        )
        self.check_fan_out(req.n, 1, req.requested_max_tokens, tokens_param)
        messages = _plain_messages(req)
        if req.prompt_template is not None:
            system = await self._render(self._render_prompt_template, req.prompt_template, req)
            messages.insert(0, {"role": "system", "content": system})
        text = await self._render(self._render_chat, messages, req)
        return self._encode_text(text, "messages")

    # -- helpers -----------------------------------------------------------------------------

    def warm_up(self) -> None:
        """Load what the first request would otherwise pay for: token bounds, the chat template."""
        from scheduler_ref.chat_template import render_chat

        render_prompt_template("{{system_prompt}}", {}, self.profile)
        text = render_chat([{"role": "user", "content": "warm up"}], self.profile)
        self.tokenizer.encode_capped(text, self.profile.max_prompt_tokens, "messages")

    async def _render(self, fn: Callable[[Any, Any], T], arg: Any, req: Any) -> T:
        if self.profile.hardened:
            # Bounded by the profile's budget; a worker thread keeps the loop responsive.
            return await anyio.to_thread.run_sync(fn, arg, req, limiter=self._render_slots)
        return fn(arg, req)

    def _render_prompt_template(self, template: str, req: CompletionRequest) -> str:
        return render_prompt_template(template, req.template_vars or {}, self.profile).text

    def _render_chat(self, messages: list[dict[str, Any]], req: ChatCompletionRequest) -> str:
        from scheduler_ref.chat_template import render_chat

        return render_chat(
            messages,
            self.profile,
            chat_template=req.chat_template,
            chat_template_kwargs=req.chat_template_kwargs,
            tools=req.tools,
            add_generation_prompt=req.add_generation_prompt,
        )

    def _encode_text(self, text: str, param: str) -> Prompt:
        if not text:
            what = (
                param
                if param.startswith("prompt") and param != "prompt_template"
                else (f"the prompt rendered from {param}")
            )
            raise GuardError("invalid_request", f"{what} is empty", param=param)
        ids = self.tokenizer.encode_capped(text, self.profile.max_prompt_tokens, param)
        return Prompt(ids, text)

    def _check_ids(self, ids: list[int], param: str) -> Prompt:
        if not ids:
            raise GuardError("invalid_request", f"{param} must not be empty", param=param)
        cap = self.profile.max_prompt_tokens
        if cap is not None and len(ids) > cap:
            raise LimitExceeded(
                "prompt_tokens_exceeded",
                f"the prompt has {len(ids)} tokens; the limit is {cap}",
                param=param,
            )
        vocab = self.tokenizer.n_vocab
        if any(not 0 <= t < vocab for t in ids):
            raise GuardError(
                "invalid_request", f"{param} holds token ids outside [0, {vocab})", param=param
            )
        return Prompt(ids, "")


def _prompt_items(raw: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a ``prompt`` field: a string or one token-id list is a single prompt."""
    if isinstance(raw, str):
        return [raw]
    if raw and isinstance(raw[0], int):
        return [[t for t in raw if isinstance(t, int)]]
    return [p for p in raw if not isinstance(p, int)]


def default_max_tokens(req: CompletionRequest | ChatCompletionRequest) -> int:
    if isinstance(req, ChatCompletionRequest):
        requested = req.requested_max_tokens
        return DEFAULT_CHAT_MAX_TOKENS if requested is None else requested
    return DEFAULT_COMPLETION_MAX_TOKENS if req.max_tokens is None else req.max_tokens


def _plain_messages(req: ChatCompletionRequest) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: ``content`` a string (text parts joined)."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(req.messages):
        content = msg.content
        if isinstance(content, list):
            texts: list[str] = []
            for j, part in enumerate(content):
                if part.type != "text" or part.text is None:
                    raise GuardError(
                        "unsupported_content",
                        f"content parts of type {part.type[:64]!r} are not supported",
                        param=f"messages[{i}].content[{j}].type",
                    )
                texts.append(part.text)
            content = "\n".join(texts)
        item: dict[str, Any] = {"role": msg.role, "content": content}
        if msg.name is not None:
            item["name"] = msg.name
        if msg.tool_calls is not None:
            item["tool_calls"] = msg.tool_calls
        if msg.tool_call_id is not None:
            item["tool_call_id"] = msg.tool_call_id
        out.append(item)
    return out


class Tokenizer:
    """Prompt text -> cl100k_base token ids, refusing text over a cap before encoding it.

    The cap is checked by :func:`guard.tokens._counter.check_prompt_tokens` (bounds first, counting with
    an early stop), so an oversized prompt is never encoded; without a cap the text is encoded
    whole, as a naive server does. Special-token text is encoded as plain text, as
    ``guard.tokens._counter`` counts it, so counts and ids agree.
    """

    def __init__(self) -> None:
        import tiktoken

        self._enc = tiktoken.get_encoding(f"{TOKEN_ENCODING}_offline")
        self.n_vocab: int = self._enc.n_vocab

    @functools.cached_property
    def counter(self) -> TokenCounter:
        return get_counter(TOKEN_ENCODING)

    def token_bytes(self, text: str) -> list[bytes]:
        """The bytes of each token of ``text`` (a token may hold part of a character)."""
        return [self._enc.decode_single_token_bytes(t) for t in self._enc.encode_ordinary(text)]

    def encode_capped(self, text: str, cap: int | None, param: str) -> list[int]:
        if cap is not None:
            check_prompt_tokens(text, cap, self.counter, param=param)
        ids: list[int] = self._enc.encode_ordinary(text)
        return ids

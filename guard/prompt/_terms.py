"""What counting a prompt is told and what it answers: how prompts are counted (a policy's
settings, :class:`PromptCounting`), what a prompt is held to (:class:`PromptLimits`, and
:class:`Over`, the refusal of one sequence past its limit), and the count (:class:`PromptCount`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from guard.errors import LimitExceeded
from guard.jinja import ChatTemplateLimits
from guard.prompt._units import Counting
from guard.request import Path, fmt_path
from guard.tokens import TokenCounter

__all__ = ["UNBOUNDED", "Flavour", "Over", "PromptCount", "PromptCounting", "PromptLimits"]

# An upstream whose render of a conversation is modelled (:mod:`._vllm_chat`).
Flavour = Literal["vllm", "llama_cpp"]

# A limit no count reaches: a prompt held only by its own size (no window, no cap).
UNBOUNDED = 1 << 62


@dataclass(frozen=True, slots=True)
class PromptCounting:
    """How prompts are counted (a policy's ``limits.tokens`` and ``limits.templates``, built once
    per policy): the tokenizer, what the gatherer adds (:class:`Counting`), the upstreams whose
    renders are modelled, and the chat template."""

    counter: TokenCounter
    units: Counting
    flavours: tuple[Flavour, ...]
    chat_template: str | None  # the configured template: a file, ``auto``, or None
    tokenizer: str
    request_templates: bool  # the request's own chat template is the one rendered
    exact: bool | None  # count exactly even when the bytes fit (None: when a template is known)
    content_format: str
    sandbox: ChatTemplateLimits
    template_depth: int
    expansion_cap: int  # a prompt template's weight, at most, without a token limit


@dataclass(frozen=True, slots=True)
class PromptLimits:
    """What a prompt is held to: ``max_prompt_tokens`` over the request, and each sequence to
    ``context_length`` beside ``output`` tokens (the output cap; 1 when the upstream generates to
    the end of the window, ``output_capped`` false; 0 when nothing is generated)."""

    max_prompt_tokens: int | None
    context_length: int | None
    output: int = 0
    output_capped: bool = False

    @property
    def per_unit(self) -> int | None:
        """What the window leaves each sequence beside the output (None: no window)."""
        context = self.context_length
        return None if context is None else context - self.output


@dataclass(frozen=True, slots=True)
class PromptCount:
    """The prompt's tokens in all and per sequence; ``exact``: counted rather than bounded by
    bytes; ``media``: the media estimates within them; ``exact_per_unit``: each sequence counted
    (``per_unit`` when ``exact``; when bounded by bytes, only if asked for, else None)."""

    tokens: int
    exact: bool
    per_unit: list[int]
    media: int
    exact_per_unit: list[int] | None = None


@dataclass(frozen=True, slots=True)
class Over:
    """Raises the right code for the limit a sequence is held to: the window (``by_context``)
    or the prompt cap."""

    by_context: bool
    limits: PromptLimits

    def __call__(self, path: Path) -> LimitExceeded:
        param = fmt_path(path) or None
        limits = self.limits
        if self.by_context:
            if not limits.output_capped:
                what = "the prompt leaves no room for output within"
            else:
                what = f"the prompt plus the output cap ({limits.output} tokens) exceeds"
            return LimitExceeded(
                "context_length_exceeded",
                f"{what} the context length of {limits.context_length} tokens; shorten "
                "the prompt or lower max_tokens",
                param=param,
            )
        return LimitExceeded(
            "prompt_tokens_exceeded",
            f"the prompt has more tokens than the limit of {limits.max_prompt_tokens}; shorten it",
            param=param,
        )

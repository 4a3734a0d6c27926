"""Benign OpenAI requests with realistic shapes: chat and completions, streamed or not.

Prompt and output lengths follow log-normal distributions, as measured on production chat
traffic (a long tail of long prompts, most outputs short): prompts have a median of about 180
tokens and a 99th percentile of about 1,400 (below the guard's default cap of 2048), outputs a
median of 48 tokens. Text is drawn from a bank of ordinary English sentences (about 1.3 tokens
a word with ``cl100k_base``). Everything comes from one seeded :class:`random.Random`, so a run
is reproducible per user.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from typing import Any, Literal

from loadtests.target import REFERENCE_MODEL

__all__ = ["BenignMix", "BenignRequest", "LengthModel", "PromptKind", "make_request"]

PromptKind = Literal["chat", "completion"]

_SENTENCES = (
    "The quarterly report shows revenue growth in every region except the north.",
    "Please summarise the main arguments of the article in three short bullet points.",
    "Our team migrated the billing service to a new database over the weekend.",
    "Can you explain how a hash map handles collisions, with a small example?",
    "The museum opens at nine and the guided tour starts half an hour later.",
    "Write a polite email asking the supplier to confirm the delivery date.",
    "Photosynthesis converts light energy into chemical energy stored in glucose.",
    "The patient reported mild headaches that improved after a few days of rest.",
    "We need a function that parses dates in several formats and returns UTC.",
    "The committee approved the budget after a long discussion about travel costs.",
    "Translate the following paragraph into French, keeping the formal tone.",
    "A good onboarding document lists the tools, the people and the first tasks.",
    "The recipe calls for two cups of flour, one egg and a pinch of salt.",
    "Compare the trade-offs between optimistic and pessimistic locking.",
    "The train was delayed by twenty minutes because of a signal failure.",
    "List the steps to rotate an API key without downtime for the clients.",
    "Rainfall this spring was well above average across the southern valleys.",
    "The contract renews automatically unless either party gives notice in writing.",
    "Suggest three names for a small bakery that specialises in sourdough bread.",
    "The server logs show a spike in latency shortly after the deployment.",
    "Explain the difference between a process and a thread to a new engineer.",
    "Customers asked for an export button on the monthly statements page.",
    "The novel follows two sisters who inherit a vineyard in a remote valley.",
    "Draft a short agenda for a one-hour planning meeting next Tuesday.",
)
_SYSTEM = (
    "You are a helpful assistant. Answer concisely and accurately.",
    "You are a senior software engineer reviewing code for clarity and correctness.",
    "You are a support agent for an online store. Be friendly and specific.",
    "You summarise documents for busy executives in plain language.",
)
_ASSISTANT = (
    "Sure. Here is a short answer with the key points you asked for.",
    "Thanks for the details. The main issue is the missing index on that table.",
    "Here is a draft you can adapt to your needs.",
)
_TOKENS_PER_WORD = 1.3  # cl100k_base on ordinary English prose


@dataclass(frozen=True)
class LengthModel:
    """Log-normal token lengths, clipped: ``median * exp(sigma * N(0, 1))``."""

    median: float
    sigma: float
    low: int
    high: int

    def sample(self, rng: random.Random) -> int:
        value = self.median * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        return max(self.low, min(self.high, round(value)))


PROMPT_TOKENS = LengthModel(median=180.0, sigma=0.9, low=8, high=1500)
OUTPUT_TOKENS = LengthModel(median=48.0, sigma=0.7, low=4, high=320)


@dataclass(frozen=True)
class BenignMix:
    """What benign users send: request kinds by weight and the share that streams."""

    chat_weight: float = 3.0
    completion_weight: float = 1.0
    stream_share: float = 0.5
    model: str = REFERENCE_MODEL
    prompt_tokens: LengthModel = PROMPT_TOKENS
    output_tokens: LengthModel = OUTPUT_TOKENS

    def __post_init__(self) -> None:
        if self.chat_weight < 0 or self.completion_weight < 0:
            raise ValueError("request weights must be >= 0")
        if self.chat_weight + self.completion_weight <= 0:
            raise ValueError("at least one request weight must be > 0")
        if not 0.0 <= self.stream_share <= 1.0:
            raise ValueError("stream_share is a fraction in [0, 1]")


@dataclass(frozen=True)
class BenignRequest:
    kind: PromptKind
    stream: bool
    path: str
    body: bytes
    prompt_tokens_target: int
    max_tokens: int

    @property
    def name(self) -> str:
        """The locust entry name: ``chat``, ``chat stream``, ``completion``, ..."""
        return f"{self.kind} stream" if self.stream else self.kind


def _text(rng: random.Random, tokens: int) -> str:
    words_wanted = max(1, round(tokens / _TOKENS_PER_WORD))
    out: list[str] = []
    count = 0
    while count < words_wanted:
        sentence = rng.choice(_SENTENCES)
        out.append(sentence)
        count += sentence.count(" ") + 1
    return " ".join(out)


def make_request(rng: random.Random, mix: BenignMix) -> BenignRequest:
    """One benign request drawn from ``mix``."""
    total = mix.chat_weight + mix.completion_weight
    kind: PromptKind = "chat" if rng.random() * total < mix.chat_weight else "completion"
    stream = rng.random() < mix.stream_share
    prompt_tokens = mix.prompt_tokens.sample(rng)
    max_tokens = mix.output_tokens.sample(rng)
    body: dict[str, Any] = {
        "model": mix.model,
        "max_tokens": max_tokens,
        "temperature": round(rng.uniform(0.0, 1.0), 2),
        "top_p": 0.95,
    }
    if kind == "chat":
        messages: list[dict[str, str]] = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": rng.choice(_SYSTEM)})
        turns = rng.choice((1, 1, 1, 2, 3))
        # Earlier turns are short; the last user message carries most of the prompt.
        for _ in range(turns - 1):
            messages.append({"role": "user", "content": _text(rng, 20)})
            messages.append({"role": "assistant", "content": rng.choice(_ASSISTANT)})
        messages.append({"role": "user", "content": _text(rng, prompt_tokens)})
        body["messages"] = messages
        path = "/v1/chat/completions"
    else:
        body["prompt"] = _text(rng, prompt_tokens)
        path = "/v1/completions"
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    raw = json.dumps(body, separators=(",", ":")).encode()
    return BenignRequest(kind, stream, path, raw, prompt_tokens, max_tokens)

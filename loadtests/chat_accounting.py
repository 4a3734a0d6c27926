"""The guard's prompt count against what a real vLLM serves, chat template by chat template.

Each template in :data:`TEMPLATES_DIR` (written from the model cards' formats: Llama 3.1 with
JSON tools, Qwen 2.5 / Hermes tools, Command R with RAG documents, DeepSeek V3, Granite 3,
Mistral) is served by vLLM with ``--chat-template FILE`` and given to the guard the way an
operator would, from a separate folder (nothing beside it), the tokenizer next to the model.
Over :data:`CHATS`, ordinary requests (tools, tool calls and results, documents, reasoning, the
developer role, names, unicode, content parts, long histories, ``continue_final_message``,
near the window), the guard's dry-run ``costs.prompt_tokens`` is compared with vLLM's
``usage.prompt_tokens``: it must never be under, and within 1.5x.

Used by ``tests/e2e/test_template_accounting.py`` (the assertion) and
``bench/template_accounting.py`` (the table in bench/README.md).
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "CHATS",
    "TEMPLATES_DIR",
    "Comparison",
    "TemplateSummary",
    "compare",
    "guard_policy_yaml",
    "post_json",
    "separate_template",
    "summarize",
]

TEMPLATES_DIR = Path(__file__).resolve().parent / "chat_templates"

_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search_flights",
            "description": "Flights between two airports on a day",
            "parameters": {
                "type": "object",
                "properties": {
                    "origin": {"type": "string"},
                    "destination": {"type": "string"},
                    "date": {"type": "string", "format": "date"},
                },
                "required": ["origin", "destination"],
            },
        },
    },
]
_SENTENCE = "The committee reviewed the quarterly figures and adjourned until Thursday. "


def _user(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


def _assistant(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def _call(name: str, arguments: dict[str, Any], call_id: str = "call_00001") -> dict[str, Any]:
    function = {"name": name, "arguments": json.dumps(arguments)}
    return {"id": call_id, "type": "function", "function": function}


def _history(turns: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a concise assistant."}]
    for i in range(turns):
        out.append(_user(f"Question {i}: what changed in release {i}? " + _SENTENCE))
        out.append(_assistant(f"Release {i} fixed {i + 2} bugs. " + _SENTENCE))
    out.append(_user("Summarise all of that in one line."))
    return out


_WEATHER = [
    _user("What is the weather in Paris?"),
    _assistant(None, tool_calls=[_call("get_weather", {"city": "Paris", "unit": "celsius"})]),
    {
        "role": "tool",
        "tool_call_id": "call_00001",
        "content": '{"temperature": 21, "sky": "clear"}',
    },
]

# Ordinary requests: nothing here is an attack.
CHATS: dict[str, dict[str, Any]] = {
    "hello": {"messages": [_user("Hello")]},
    "system and user": {
        "messages": [
            {"role": "system", "content": "Answer briefly."},
            _user("Why is the sky blue?"),
        ]
    },
    "multi-turn": {
        "messages": [
            _user("Name a prime number."),
            _assistant("Seven."),
            _user("And a larger one?"),
        ]
    },
    "tools defined": {"messages": [_user("Weather in Rome tomorrow?")], "tools": _TOOLS},
    "tool call and result": {"messages": [*_WEATHER, _user("And in Lyon?")], "tools": _TOOLS},
    "tool result last": {"messages": _WEATHER, "tools": _TOOLS},
    "tool call with content": {
        "messages": [
            _user("Weather in Oslo?"),
            _assistant("Let me check.", tool_calls=[_call("get_weather", {"city": "Oslo"})]),
            {"role": "tool", "tool_call_id": "call_00001", "content": "snow"},
        ],
        "tools": _TOOLS,
    },
    "two tool calls": {
        "messages": [
            _user("Weather in Oslo and Bergen?"),
            _assistant(
                None,
                tool_calls=[
                    _call("get_weather", {"city": "Oslo"}, "call_00001"),
                    _call("get_weather", {"city": "Bergen"}, "call_00002"),
                ],
            ),
            {"role": "tool", "tool_call_id": "call_00001", "content": "snow"},
            {"role": "tool", "tool_call_id": "call_00002", "content": "rain"},
        ],
        "tools": _TOOLS,
    },
    "tools and no tool_choice": {
        "messages": [_user("Find flights from OSL to CDG on 2026-03-01.")],
        "tools": _TOOLS,
        "tool_choice": "none",
    },
    "documents": {
        "messages": [_user("What did the committee decide?")],
        "documents": [
            {"title": "Minutes", "text": _SENTENCE * 4},
            {"title": "Agenda", "text": "1. Figures. 2. Any other business."},
        ],
    },
    "reasoning in history": {
        "messages": [
            _user("Is 91 prime?"),
            _assistant("No: 91 = 7 x 13.", reasoning_content="Try small primes: 7 x 13 = 91."),
            _user("And 97?"),
        ]
    },
    "reasoning field": {
        "messages": [
            _user("Is 51 prime?"),
            _assistant("No.", reasoning="51 = 3 x 17."),
            _user("Why?"),
        ]
    },
    "developer role": {
        "messages": [{"role": "developer", "content": "Reply in French."}, _user("Good morning")]
    },
    "developer after system": {
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "developer", "content": "Reply in one word."},
            _user("How are you?"),
        ]
    },
    "names": {
        "messages": [
            _user("Hi, I am Ada.", name="ada"),
            _assistant("Hello Ada.", name="helper"),
            _user("What is my name?", name="ada"),
        ]
    },
    "unicode": {
        "messages": [
            _user("Traduis: « Le cœur a ses raisons » — 心には理由がある. Ünïcödé ✓ 🚀"),
            _assistant("Das Herz hat seine Gründe. Καρδιά. Сердце. 🚀"),
            _user("Merci ! 谢谢"),
        ]
    },
    "text parts": {
        "messages": [
            _user([{"type": "text", "text": "Describe this:"}, {"type": "text", "text": "a cat."}])
        ]
    },
    "system parts": {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "Answer in haiku."}]},
            _user("Spring"),
        ]
    },
    "empty assistant content": {
        "messages": [_user("Say nothing."), _assistant(""), _user("Now say hi.")]
    },
    "long history": {"messages": _history(12)},
    "long message": {"messages": [_user(_SENTENCE * 60)]},
    "code and whitespace": {
        "messages": [
            _user("Fix this:\n```python\ndef f(x):\n\treturn x  +  1\n```\n\n\n  Thanks  ")
        ]
    },
    "special-token text typed": {
        "messages": [_user("Print <|im_start|> and <|eot_id|> and [INST] literally.")]
    },
    "continue final message": {
        "messages": [_user("Write a haiku about rain."), _assistant("Soft rain on the roof,")],
        "add_generation_prompt": False,
        "continue_final_message": True,
    },
    "no generation prompt": {
        "messages": [_user("Hello"), _assistant("Hi there.")],
        "add_generation_prompt": False,
    },
    "enable_thinking off": {
        "messages": [_user("Quick: 2+2?")],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "thinking on": {
        "messages": [_user("Plan a three-day trip to Kyoto.")],
        "chat_template_kwargs": {"enable_thinking": True, "thinking": True},
    },
    "reasoning_effort": {
        "messages": [_user("Prove that sqrt(2) is irrational.")],
        "reasoning_effort": "low",
    },
    "tools and documents": {
        "messages": [_user("Use the minutes; is the weather relevant?")],
        "tools": _TOOLS[:1],
        "documents": [{"title": "Minutes", "text": _SENTENCE}],
    },
    "near the window": {"messages": [_user(_SENTENCE * 125)]},
}


def separate_template(template: Path, directory: Path) -> Path:
    """A copy of ``template`` alone in ``directory``: no tokenizer_config.json beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / template.name
    shutil.copyfile(template, target)
    return target


def guard_policy_yaml(
    tokenizer: Path,
    template: Path | None,
    max_prompt_tokens: int,
    *,
    upstream_kind: str = "auto",
    render_like: tuple[str, ...] | None = None,
) -> str:
    """The guard's policy: the model's tokenizer, the template file, the upstream's kind (its
    renders are the ones modelled unless ``render_like`` names others), no rate limits."""
    lines = [
        "upstream:",
        f"  kind: {upstream_kind}",
        "limits:",
        "  tokens:",
        f"    tokenizer: {tokenizer}",
        f"    chat_template: {template if template is not None else 'auto'}",
        f"    max_prompt_tokens: {max_prompt_tokens}",
        "    max_output_tokens: 16",
        "    default_max_tokens: 8",
    ]
    if render_like is not None:
        lines.append(f"    render_like: [{', '.join(render_like)}]")
    # Renders take milliseconds; on a machine shared with vLLM and other suites a render can
    # stall past the 1 s default and fall back to the bound, which this comparison is not about.
    lines += ["  templates:", "    chat_template:", "      deadline_s: 30"]
    lines += ["rate:", "  requests_per_minute: null", "  tokens_per_minute: null"]
    return "\n".join(lines) + "\n"


def post_json(
    url: str, body: dict[str, Any], timeout_s: float = 120.0
) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        url, json.dumps(body).encode(), {"content-type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        raw = err.read()
        try:
            return err.code, json.loads(raw)
        except ValueError:
            return err.code, {"raw": raw[:300].decode(errors="replace")}


@dataclass(frozen=True)
class Comparison:
    """One request: the guard's bound (None: refused, with ``why``) and vLLM's usage (None:
    refused)."""

    name: str
    bound: int | None
    usage: int | None
    why: str = ""

    @property
    def sound(self) -> bool:
        return self.bound is None or self.usage is None or self.bound >= self.usage


def compare(
    name: str,
    body: dict[str, Any],
    count: Callable[[dict[str, Any]], tuple[int | None, str]],
    upstream_url: str,
    model: str,
) -> Comparison:
    """``count(body)``: the guard's bound (or None and why); the upstream is asked with
    ``max_tokens`` 1 (the prompt is what is measured)."""
    body = {**body, "model": model, "max_tokens": 1}
    bound, why = count(body)
    status, reply = post_json(upstream_url + "/v1/chat/completions", body)
    usage = (reply.get("usage") or {}).get("prompt_tokens") if status == 200 else None
    if status != 200:
        message = str((reply.get("error") or {}).get("message", reply))[:160]
        why = f"{why}; upstream {status}: {message}" if why else f"upstream {status}: {message}"
    return Comparison(name, bound, usage, why)


@dataclass
class TemplateSummary:
    """Per template: requests both served, exact, over (largest ratio, most tokens), under."""

    template: str
    compared: int = 0
    exact: int = 0
    over: int = 0
    under: list[str] = field(default_factory=list)
    max_ratio: float = 1.0
    max_over_tokens: int = 0
    refused_by_upstream: int = 0
    refused_by_guard: list[str] = field(default_factory=list)


def summarize(template: str, comparisons: Iterable[Comparison]) -> TemplateSummary:
    summary = TemplateSummary(template)
    for c in comparisons:
        if c.usage is None:
            summary.refused_by_upstream += 1
            continue
        if c.bound is None:
            summary.refused_by_guard.append(f"{c.name}: {c.why}")
            continue
        summary.compared += 1
        if c.bound < c.usage:
            summary.under.append(f"{c.name}: {c.bound} < {c.usage}")
        elif c.bound == c.usage:
            summary.exact += 1
        else:
            summary.over += 1
            summary.max_ratio = max(summary.max_ratio, c.bound / c.usage)
            summary.max_over_tokens = max(summary.max_over_tokens, c.bound - c.usage)
    return summary

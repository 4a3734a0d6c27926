"""Template targets: ``{{name}}`` prompt templates and Jinja chat templates, per profile.

Inputs:

- placeholder targets: the template text, then optional variables, each ``\\0name=value``
  (values are templates too). A finding is filed as a ``/v1/completions`` body with
  ``prompt_template`` and ``template_vars``.
- chat-template targets: the Jinja source, rendered over a fixed two-message conversation. A
  finding is filed as a ``/v1/chat/completions`` body with ``chat_template``. The hardened
  target renders request templates in the hardened sandbox (the hardened *server* refuses
  request templates outright, which would leave nothing to fuzz).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, ClassVar

from fuzz.targets._base import Budgets, Cost
from fuzz.targets._common import TargetBase
from fuzz.targets._mutate import byte_mutate, grow_number, pick_slice
from guard.errors import GuardError

__all__ = [
    "ChatTemplateHardened",
    "ChatTemplateVulnerable",
    "PlaceholderHardened",
    "PlaceholderVulnerable",
]

_MIB = 1 << 20
MODEL = "schedguard-ref"
MESSAGES: tuple[dict[str, str], ...] = (
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Hello, how are you?"},
)


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


# ------------------------------------------------------------------------- placeholders


def split_placeholder_input(data: bytes) -> tuple[str, dict[str, str]]:
    """``template \\0 name=value \\0 ...`` -> (template, variables)."""
    parts = data.split(b"\0")
    variables: dict[str, str] = {}
    for part in parts[1:]:
        name, _, value = part.partition(b"=")
        variables[_text(name)] = _text(value)
    return _text(parts[0]), variables


def join_placeholder_input(template: str, variables: dict[str, str]) -> bytes:
    out = template.encode("utf-8", "surrogatepass")
    for name, value in variables.items():
        out += b"\0" + f"{name}={value}".encode("utf-8", "surrogatepass")
    return out


class _Placeholder(TargetBase):
    source = "scheduler_ref/prompt_template.py"
    endpoint = "/v1/completions"
    class_ = "nested_prompt_template"
    target_field = "prompt_template"
    max_size = 1024
    _seeds = (
        b"Hello {{system_prompt}}",
        b"{{greeting}}, world\0greeting=hi",
        b"plain text",
    )
    _dictionary = (
        b"{{",
        b"}}",
        b"{{system_prompt}}",
        b"{{a}}",
        b"system_prompt",
        b"\0a=",
        b"\0a={{a}}",
        b"\0b={{a}}{{a}}",
        b"{{{{",
        b" ",
    )
    _profile_name: ClassVar[str]

    def __init__(self) -> None:
        self._budget: Any = None

    def execute(self, data: bytes) -> Cost:
        from guard.budget import Budget, Limits
        from scheduler_ref.profiles import get_profile
        from scheduler_ref.prompt_template import budget_for, render_prompt_template

        profile = get_profile(self._profile_name)
        template, variables = split_placeholder_input(data)
        # The vulnerable profile's budget is unlimited: an explicit one only adds the counters.
        self._budget = budget = budget_for(profile) if profile.hardened else Budget(Limits())
        rendered = render_prompt_template(template, variables, profile, budget=budget)
        tokens = rendered.tokens if rendered.tokens is not None else len(rendered.text) // 4
        return Cost(steps=rendered.nodes + budget.steps_used, output_tokens=tokens)

    def progress(self) -> Cost:
        b = self._budget
        if b is None:
            return Cost()
        # Hardened: the exact count (the counter stops at its limit); vulnerable: an estimate.
        tokens = b.tokens_used() if self._profile_name == "hardened" else b.bytes_used // 4
        return Cost(steps=b.steps_used, output_tokens=tokens)

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        template, variables = split_placeholder_input(data)
        op = rng.randrange(8)
        if op == 0:  # a new or replaced variable whose value references others
            name = rng.choice(["a", "b", "c", "system_prompt", *variables])
            ref = rng.choice(["a", "b", "c", *variables])
            variables[name] = ("{{" + ref + "}}") * rng.randint(1, 4)
            return _fit(join_placeholder_input(template, variables), data, max_size)
        if op == 1 and variables:  # mutate one value
            name = rng.choice(list(variables))
            value = byte_mutate(variables[name].encode(), max_size, rng, self._dictionary)
            variables[name] = _text(value.replace(b"\0", b""))
            return _fit(join_placeholder_input(template, variables), data, max_size)
        if op == 2 and template:  # wrap a slice in a placeholder
            raw = template.encode("utf-8", "surrogatepass")
            s, e = pick_slice(raw, rng)
            new = raw[:s] + b"{{" + raw[s:e] + b"}}" + raw[e:]
            return _fit(join_placeholder_input(_text(new), variables), data, max_size)
        return byte_mutate(data, max_size, rng, self._dictionary)

    def payload_body(self, data: bytes) -> tuple[bytes, str]:
        template, variables = split_placeholder_input(data)
        body: dict[str, Any] = {"model": MODEL, "prompt_template": template}
        if variables:
            body["template_vars"] = variables
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"), self.endpoint

    def input_from_payload(
        self, body: bytes, endpoint: str, headers: Sequence[tuple[str, str]] = ()
    ) -> bytes | None:
        doc = _json_object(body)
        if doc is None or not isinstance(doc.get("prompt_template"), str):
            return None
        raw_vars = doc.get("template_vars")
        variables = (
            {str(k): str(v) for k, v in raw_vars.items()} if isinstance(raw_vars, dict) else {}
        )
        return join_placeholder_input(doc["prompt_template"], variables)


def _fit(out: bytes, original: bytes, max_size: int) -> bytes:
    return out if len(out) <= max_size else original


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return doc if isinstance(doc, dict) else None


class PlaceholderVulnerable(_Placeholder):
    name = "placeholder-vulnerable"
    description = "{{name}} prompt templates, vulnerable profile (backtracking parser, no limits)"
    exercises = "scheduler_ref.prompt_template.render_prompt_template(profile=VULNERABLE)"
    kind = "vulnerable"
    budgets = Budgets(wall_s=1.0, mem_bytes=256 * _MIB)
    _profile_name = "vulnerable"


class PlaceholderHardened(_Placeholder):
    name = "placeholder-hardened"
    description = "{{name}} prompt templates, hardened profile (scan first, depth/token/step caps)"
    exercises = "scheduler_ref.prompt_template.render_prompt_template(profile=HARDENED)"
    kind = "hardened"
    # The profile stops at 2048 prompt tokens and a 250 ms deadline. Twice that deadline is the
    # CPU budget, and twice it over the 64-byte floor of Cost.per_byte is the per-byte one.
    budgets = Budgets(
        wall_s=0.5, mem_bytes=64 * _MIB, output_tokens=2048, steps=1 << 16, cost_per_byte=8.0
    )
    expected = (GuardError,)
    isolate_by_default = False
    _profile_name = "hardened"


# ---------------------------------------------------------------------------- chat templates


class _ChatTemplate(TargetBase):
    source = "scheduler_ref/chat_template.py"
    endpoint = "/v1/chat/completions"
    class_ = "request_chat_template"
    target_field = "chat_template"
    max_size = 1024
    _seeds = (
        b"{% for m in messages %}{{ m.content }}{% endfor %}",
        b"{{ messages[0].content }}",
        b"hello",
    )
    _dictionary = (
        b"{% for i in range(9) %}",
        b"{% endfor %}",
        b"{{ i }}",
        b"{{ 'a' * 9 }}",
        b"{{ messages[0].content }}",
        b"{% for m in messages %}",
        b"{% set x = 'ab' %}",
        b"{{ x ~ x }}",
        b"{% if loop.first %}",
        b"{% endif %}",
        b" * 9",
        b"99",
        b"|join",
        b"|length",
        b"{{ range(9)|list }}",
        b"{% macro f(n) %}{{ n }}{% endmacro %}",
        b"{{ f(1) }}",
        b"** 9",
        b"{{ loop.index }}",
    )
    _hardened: ClassVar[bool]

    def execute(self, data: bytes) -> Cost:
        from scheduler_ref.chat_template import render_chat

        profile = _chat_profile(self._hardened)
        source = _text(data)
        if self._hardened:
            budget = _chat_budget(profile)
            render_chat(MESSAGES, profile, chat_template=source, budget=budget)
            return Cost(output_tokens=budget.tokens_used(), steps=budget.steps_used)
        text = render_chat(MESSAGES, profile, chat_template=source)
        return Cost(output_tokens=len(text) // 4, steps=len(text))

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        op = rng.randrange(6)
        if op == 0 and data:  # wrap a slice in a loop (nesting multiplies the work)
            s, e = pick_slice(data, rng)
            var = f"i{rng.randrange(10)}".encode()
            n = str(rng.choice((9, 99, 999))).encode()
            out = (
                data[:s]
                + b"{% for "
                + var
                + b" in range("
                + n
                + b") %}"
                + data[s:e]
                + b"{% endfor %}"
                + data[e:]
            )
            return out if len(out) <= max_size else data
        if op == 1:
            return grow_number(data, max_size, rng)
        return byte_mutate(data, max_size, rng, self._dictionary)

    def payload_body(self, data: bytes) -> tuple[bytes, str]:
        body = {"model": MODEL, "messages": list(MESSAGES), "chat_template": _text(data)}
        return json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"), self.endpoint

    def input_from_payload(
        self, body: bytes, endpoint: str, headers: Sequence[tuple[str, str]] = ()
    ) -> bytes | None:
        doc = _json_object(body)
        if doc is None:
            return None
        source = doc.get("chat_template")
        kwargs = doc.get("chat_template_kwargs")
        if not isinstance(source, str) and isinstance(kwargs, dict):
            source = kwargs.get("chat_template")
        if not isinstance(source, str):
            return None
        return source.encode("utf-8", "surrogatepass")


def _chat_profile(hardened: bool) -> Any:
    from dataclasses import replace

    from scheduler_ref.profiles import HARDENED, VULNERABLE

    if hardened:
        return replace(HARDENED, allow_request_chat_template=True)
    return VULNERABLE


def _chat_budget(profile: Any) -> Any:
    from guard.budget import Budget, Limits
    from guard.tokens import get_counter

    limit = profile.max_prompt_tokens
    limits = Limits(max_tokens=limit, deadline_s=profile.render_deadline_s)
    return Budget(limits, tokens=get_counter("cl100k_base").incremental(limit, param="messages"))


class ChatTemplateVulnerable(_ChatTemplate):
    name = "chat-template-vulnerable"
    description = "Jinja chat templates from the request, vulnerable profile (plain sandbox)"
    exercises = "scheduler_ref.chat_template.render_chat(profile=VULNERABLE, chat_template=...)"
    kind = "vulnerable"
    budgets = Budgets(wall_s=1.0, mem_bytes=256 * _MIB)
    # Compile errors and sandbox refusals are the engine's documented rejections.
    expected = (GuardError,)
    _hardened = False


class ChatTemplateHardened(_ChatTemplate):
    name = "chat-template-hardened"
    description = "Jinja chat templates from the request, rendered in the hardened sandbox"
    exercises = (
        "scheduler_ref.chat_template.render_chat(profile=HARDENED with request templates "
        "allowed) -> guard.jinja._chat_template.render_chat_template"
    )
    kind = "hardened"
    budgets = Budgets(wall_s=0.5, mem_bytes=64 * _MIB, output_tokens=2048, cost_per_byte=8.0)
    expected = (GuardError,)
    isolate_by_default = False
    _hardened = True

"""The prompt text of a request, as the sequences the upstream will process.

A :class:`PromptUnit` is one sequence: the texts that end up in it (with where they are, for
error messages), token ids given directly, and a fixed overhead (role markers). Chat is one
unit; a list-valued ``prompt`` or embeddings ``input`` is one unit per item. What is counted:

- chat (and ``/tokenize`` with ``messages``): every message's text content (string content,
  ``text``/``input_text``/``output_text`` parts), ``name``, reasoning text, tool-call names and
  arguments; tool and function definitions and RAG ``documents`` as compact JSON;
  a ``prompt_template`` with its ``template_vars`` as the bound on its expansion (each
  variable counted as often as it can be expanded), or as plain text without placeholders;
- completions, embeddings, ``/tokenize``: ``prompt`` / ``input`` strings and token ids,
  ``suffix``, prompt templates;
- the responses API: ``instructions`` and ``input`` (a string or items with text content,
  function-call arguments and outputs), tools.

Media parts are not text: the multimodal check bounds them. Nothing here copies prompt text.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from guard.checks._fields import Path, compact_json, is_int, prompt_items
from guard.request_view import Endpoint

_TEXT_PARTS = frozenset({"text", "input_text", "output_text"})


@dataclass(slots=True)
class PromptUnit:
    texts: list[tuple[Path, str]] = field(default_factory=list)
    token_ids: int = 0
    overhead: int = 0
    path: Path = ()  # where the unit is in the body (for token ids)
    # prompt_template with placeholders, and the string template_vars it may expand
    template: tuple[str, dict[str, str]] | None = None

    def add(self, path: Path, value: Any) -> None:
        if isinstance(value, str) and value:
            self.texts.append((path, value))


def prompt_units(body: dict[str, Any], endpoint: Endpoint, per_message: int) -> list[PromptUnit]:
    if endpoint == "chat":
        return [_chat(body, per_message)]
    if endpoint in ("completions", "embeddings"):
        return _prompts(body, "prompt" if endpoint == "completions" else "input")
    if endpoint == "responses":
        return [_responses(body, per_message)]
    if endpoint == "tokenize":
        if isinstance(body.get("messages"), list):
            return [_chat(body, per_message)]
        return _prompts(body, "prompt")
    if endpoint == "other":
        # Allowlisted routes of unknown shape: read what looks like a prompt.
        if isinstance(body.get("messages"), list):
            return [_chat(body, per_message)]
        for name in ("prompt", "input"):
            if body.get(name) is not None:
                return _prompts(body, name)
    return []


def _templates(unit: PromptUnit, body: dict[str, Any]) -> None:
    template = body.get("prompt_template")
    variables = body.get("template_vars")
    if isinstance(template, str) and "{{" in template and isinstance(variables, dict):
        # Placeholders expand variables, each maybe many times: the tokens check bounds the
        # expansion (guard.checks._placeholders) instead of counting each text once.
        unit.template = (template, {k: v for k, v in variables.items() if isinstance(v, str)})
        return
    unit.add(("prompt_template",), template)
    if isinstance(variables, dict):
        for name, value in variables.items():
            unit.add(("template_vars", name), value)


def _content(unit: PromptUnit, path: Path, content: Any) -> None:
    if isinstance(content, str):
        unit.add(path, content)
    elif isinstance(content, list):
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in _TEXT_PARTS:
                unit.add((*path, j, "text"), part.get("text"))


def _json(unit: PromptUnit, body: dict[str, Any], name: str) -> None:
    value = body.get(name)
    if isinstance(value, list | dict) and value:
        unit.add((name,), compact_json(value))


# Message keys and top-level fields besides messages that hold prompt text (read below).
_MESSAGE_TEXT_KEYS = frozenset({"name", "reasoning_content", "reasoning", "tool_calls"})
_CHAT_TEXT_FIELDS = frozenset(
    {"tools", "functions", "documents", "prompt_template", "template_vars"}
)


def _chat(body: dict[str, Any], per_message: int) -> PromptUnit:
    unit = PromptUnit(path=("messages",))
    messages = body.get("messages")
    if isinstance(messages, list):
        unit.overhead = per_message * len(messages)
        texts = unit.texts
        for i, message in enumerate(messages):
            if not isinstance(message, dict):
                continue
            content = message.get("content")
            if type(content) is str:  # the usual message, without two calls
                if content:
                    texts.append((("messages", i, "content"), content))
            else:
                _content(unit, ("messages", i, "content"), content)
            if _MESSAGE_TEXT_KEYS.isdisjoint(message):  # the usual {"role", "content"}
                continue
            for key in ("name", "reasoning_content", "reasoning"):
                unit.add(("messages", i, key), message.get(key))
            calls = message.get("tool_calls")
            if isinstance(calls, list):
                for j, call in enumerate(calls):
                    function = call.get("function") if isinstance(call, dict) else None
                    if isinstance(function, dict):
                        at = ("messages", i, "tool_calls", j, "function")
                        unit.add((*at, "name"), function.get("name"))
                        unit.add((*at, "arguments"), function.get("arguments"))
    if not _CHAT_TEXT_FIELDS.isdisjoint(body):
        for name in ("tools", "functions", "documents"):
            _json(unit, body, name)
        _templates(unit, body)
    return unit


def _prompts(body: dict[str, Any], name: str) -> list[PromptUnit]:
    value = body.get(name)
    items = prompt_items(value)
    units: list[PromptUnit] = []
    if items is not None:
        single = not isinstance(value, list) or (bool(value) and is_int(value[0]))
        for i, item in enumerate(items):
            path: Path = (name,) if single else (name, i)
            unit = PromptUnit(path=path)
            if isinstance(item, str):
                unit.add(path, item)
            elif isinstance(item, list):
                unit.token_ids = len(item)
            units.append(unit)
    if not units:
        units.append(PromptUnit())
    _templates(units[0], body)
    units[0].add(("suffix",), body.get("suffix"))
    return units


def _responses(body: dict[str, Any], per_message: int) -> PromptUnit:
    unit = PromptUnit()
    unit.add(("instructions",), body.get("instructions"))
    value = body.get("input")
    if isinstance(value, str):
        unit.add(("input",), value)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if not isinstance(item, dict):
                continue
            _content(unit, ("input", i, "content"), item.get("content"))
            for key in ("arguments", "output", "name"):
                unit.add(("input", i, key), item.get(key))
        unit.overhead = per_message * len(value)
    _json(unit, body, "tools")
    _templates(unit, body)
    return unit

"""The prompt of a request, as the sequences the upstream will tokenize: everything a chat
template can render, counted or weighed, never skipped.

A :class:`PromptUnit` is one sequence. Chat (and ``/tokenize`` or embeddings with ``messages``,
one unit per conversation when they are batched) is rendered by the upstream's chat template;
what a template can print is gathered here, each field counted once (the fallback's assumption,
docs/POLICY.md):

- ``texts``: strings printed as they are: string content, text-bearing parts as vLLM reads them
  (``text``/``input_text``/``output_text``, ``refusal``, ``thinking``, ``tool_reference`` names,
  bare strings in a content list), and every other string a message carries (``name``,
  ``tool_call_id``, ``task``, ``reasoning``/``reasoning_content``, unknown keys: vLLM drops
  some, other servers print them), roles that are not the usual ones;
- ``values``: structured values printed with ``tojson``, weighed as indent-4 JSON
  (:mod:`guard.prompt._jsonsize`): tool definitions (top level, ``functions``, a message's
  ``tools``), each tool call without its arguments (``id``, ``type``, ``function.name``,
  ``name`` placed on the call, extra keys), ``documents``, unknown keys of parts and messages
  that are not strings;
- ``arguments``: a tool call's ``arguments`` string, which vLLM parses and prints again with
  ``tojson`` (``{}`` when it is not a JSON object) and llama-cpp-python prints as it is: both
  are weighed, the larger counts. Arguments given as an object are a ``value``;
- ``overhead``: the template's own tokens (``per_message_tokens`` per message and per tool call,
  one per content part, the role when it is a usual one, ``per_request_tokens``,
  ``tools_tokens`` when tools are defined);
- ``specials``: the special tokens the tokenizer adds when ``add_special_tokens`` is on;
- ``media``: the tokens each media part expands to (``tokens_per_image``, ``tokens_per_audio``,
  ``tokens_per_video_frame`` per frame vLLM decodes). With ``llama_cpp`` in ``render_like``,
  media URLs are also text: llama-cpp-python hands list content to a text-only template as it
  is.

Completions, embeddings (and vLLM's ``/classify`` and ``/pooling``) ``input`` and
``/tokenize`` ``prompt``: each prompt string or token-id list is a unit (a pooling plugin's
``data``: its strings), plus the tokenizer's special tokens unless ``add_special_tokens`` is false, and
``suffix``. The Responses API: ``instructions``, ``input`` (a string, or items read like
messages), ``tools``. ``prompt_template`` with ``template_vars`` (schedguard's extension) is
bounded by its expansion.

An exact count renders the conversation instead (:mod:`guard.prompt._render`): ``chat`` holds
what it needs. Nothing here copies prompt text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from guard.json import json_depth
from guard.request import (
    KNOWN_PART_FIELDS,
    VIDEO_FRAMES_READ,
    Endpoint,
    PartKind,
    Path,
    classify_part,
    is_int,
    lax_bool,
    media_payload,
    prompt_items,
)

__all__ = [
    "Argument",
    "ChatInput",
    "ChatKind",
    "Counting",
    "PromptUnit",
    "add_content",
    "parse_arguments",
    "prompt_units",
]

# Roles whose name is short ASCII: counted as overhead (their bytes bound their tokens).
_USUAL_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
# Top-level chat fields that hold prompt text, besides messages.
_CHAT_FIELDS = frozenset(
    {
        "tools",
        "functions",
        "documents",
        "chat_template_kwargs",
        "reasoning_effort",
        "tool_choice",
        "prompt_template",
        "template_vars",
        "add_special_tokens",
    }
)


@dataclass(frozen=True, slots=True)
class Counting:
    """The policy's counting settings, as the gatherer needs them."""

    per_message: int = 5
    per_request: int = 32
    tools: int = 256
    image: int = 576
    video_frame: int = 256
    audio: int = 750
    media_as_text: bool = True
    special_tokens: int = 2
    max_json_depth: int = 32


@dataclass(frozen=True, slots=True)
class Argument:
    """A tool call's ``arguments`` string and what vLLM makes of it (``{}`` when it is not a
    JSON object)."""

    path: Path
    raw: str
    parsed: dict[str, Any]


# How the upstream renders a conversation: chat completions; /tokenize; the pooling routes
# (embeddings, /classify, /pooling: no tools, no generation prompt by default); a scored pair.
ChatKind = Literal["chat", "tokenize", "pooling", "score"]


@dataclass(frozen=True, slots=True)
class ChatInput:
    """What rendering one conversation needs: its messages, the request around them, and which
    route renders it."""

    messages: list[Any]
    body: dict[str, Any]
    kind: ChatKind = "chat"


@dataclass(slots=True)
class PromptUnit:
    texts: list[tuple[Path, str]] = field(default_factory=list)
    values: list[tuple[Path, Any]] = field(default_factory=list)
    arguments: list[Argument] = field(default_factory=list)
    token_ids: int = 0
    overhead: int = 0  # the template's markup (fallback bound only)
    media: int = 0  # media token estimates
    specials: int = 0  # special tokens the tokenizer adds (add_special_tokens)
    templated: bool = False  # fields are printed inside a template's text (chat, responses)
    path: Path = ()  # where the unit is in the body (for token ids)
    # prompt_template with placeholders, and the string template_vars it may expand
    template: tuple[str, dict[str, str]] | None = None
    chat: ChatInput | None = None
    # the Responses API's input items as a conversation: not rendered, they size the template's
    # loops (:attr:`loops`)
    items: ChatInput | None = None

    @property
    def fixed(self) -> int:
        """The tokens that are not text: ids, markup, media, special tokens."""
        return self.token_ids + self.overhead + self.media + self.specials

    @property
    def loops(self) -> ChatInput | None:
        """What sizes the chat template's loops when it is not rendered: the conversation, or
        the Responses API's input items."""
        return self.chat or self.items

    def add(self, path: Path, value: Any) -> None:
        if isinstance(value, str):
            if value:
                self.texts.append((path, value))
        elif value is not None:
            self.weigh(path, value)

    def weigh(self, path: Path, value: Any) -> None:
        if isinstance(value, bool | int | float):
            self.overhead += len(json.dumps(value))
        elif value is not None:
            self.values.append((path, value))


# The conversation kind each endpoint renders (ChatKind).
_CHAT_KIND: dict[Endpoint, ChatKind] = {
    "chat": "chat",
    "tokenize": "tokenize",
    "embeddings": "pooling",
    "pooling": "pooling",
}


def prompt_units(body: dict[str, Any], endpoint: Endpoint, counting: Counting) -> list[PromptUnit]:
    if endpoint == "chat":
        return _chat_units(body, counting)
    if endpoint == "completions":
        return _prompts(body, "prompt", counting)
    if endpoint in ("embeddings", "pooling", "tokenize", "other"):
        kind = _CHAT_KIND.get(endpoint, "chat")
        if isinstance(body.get("messages"), list):
            return _chat_units(body, counting, kind=kind)
        pooled = endpoint in ("embeddings", "pooling")
        for name in ("input", "prompt") if pooled else ("prompt", "input"):
            value = body.get(name)
            if value is None:
                continue
            if pooled and _are_conversations(value):
                return _chat_units(body, counting, name, kind)
            return _prompts(body, name, counting)
        if endpoint == "pooling" and "data" in body:
            # An IO-processor plugin's input: whatever it tokenizes comes from these values.
            unit = PromptUnit(path=("data",), specials=counting.special_tokens)
            unit.add(("data",), body["data"])
            return [unit]
        return []
    if endpoint == "responses":
        return [_responses(body, counting)]
    return []


def _are_conversations(value: Any) -> bool:
    """Chat messages, or a batch of conversations, given as embeddings ``input``."""
    if not isinstance(value, list) or not value:
        return False
    first = value[0]
    if isinstance(first, list):
        return bool(first) and isinstance(first[0], dict)
    return isinstance(first, dict)


def _templates(unit: PromptUnit, body: dict[str, Any]) -> None:
    template = body.get("prompt_template")
    variables = body.get("template_vars")
    if isinstance(template, str) and "{{" in template and isinstance(variables, dict):
        # Placeholders expand variables, each maybe many times: the tokens check bounds the
        # expansion (guard.prompt._placeholders) instead of counting each text once.
        unit.template = (template, {k: v for k, v in variables.items() if isinstance(v, str)})
        return
    unit.add(("prompt_template",), template)
    if isinstance(variables, dict):
        for name, value in variables.items():
            unit.add(("template_vars", name), value)


# -- chat ---------------------------------------------------------------------------------------


def _chat_units(
    body: dict[str, Any], c: Counting, name: str = "messages", kind: ChatKind = "chat"
) -> list[PromptUnit]:
    messages = body.get(name)
    if not isinstance(messages, list):
        return [_chat_unit(body, [], (name,), c, kind)]
    if messages and isinstance(messages[0], list):  # a batch of conversations
        return [
            _chat_unit(body, conversation, (name, i), c, kind)
            for i, conversation in enumerate(messages)
            if isinstance(conversation, list)
        ]
    return [_chat_unit(body, messages, (name,), c, kind)]


def _chat_unit(
    body: dict[str, Any], messages: list[Any], base: Path, c: Counting, kind: ChatKind
) -> PromptUnit:
    unit = PromptUnit(path=base, chat=ChatInput(messages, body, kind), templated=True)
    unit.overhead = c.per_request + c.per_message * len(messages)
    texts = unit.texts
    for i, message in enumerate(messages):
        if type(message) is dict and len(message) == 2:
            role = message.get("role")
            content = message.get("content")
            # The usual message: counted without building a path.
            if type(content) is str and type(role) is str and role in _USUAL_ROLES:
                unit.overhead += len(role)
                if content:
                    texts.append(((*base, i, "content"), content))
                continue
        _message(unit, (*base, i), message, c)
    if not _CHAT_FIELDS.isdisjoint(body):
        for key in ("tools", "functions", "documents"):
            value = body.get(key)
            if value:
                unit.weigh((key,), value)
                if key != "documents":
                    unit.overhead += c.tools
        kwargs = body.get("chat_template_kwargs")
        if isinstance(kwargs, dict):
            for key, value in kwargs.items():
                if key != "chat_template":
                    unit.add(("chat_template_kwargs", key), value)
        unit.add(("reasoning_effort",), body.get("reasoning_effort"))
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            unit.weigh(("tool_choice",), choice)
        if lax_bool(body.get("add_special_tokens")) is True:
            unit.specials += c.special_tokens
        _templates(unit, body)
    return unit


def _message(unit: PromptUnit, at: Path, message: Any, c: Counting) -> None:
    if not isinstance(message, dict):
        unit.add(at, message)
        return
    for key, value in message.items():
        if value is None:
            continue
        path = (*at, key)
        if key == "content":
            add_content(unit, path, value, c)
        elif key == "role" and isinstance(value, str) and value in _USUAL_ROLES:
            unit.overhead += len(value)
        elif key == "tool_calls" and isinstance(value, list):
            _tool_calls(unit, path, value, c)
        elif key == "tools" and value:
            unit.weigh(path, value)
            unit.overhead += c.tools
        else:
            unit.add(path, value)


def add_content(unit: PromptUnit, path: Path, content: Any, c: Counting) -> None:
    """A message's content: a string, or parts (text, media estimates, extra keys)."""
    if isinstance(content, str):
        if content:
            unit.texts.append((path, content))
        return
    if not isinstance(content, list):
        unit.add(path, content)
        return
    unit.overhead += len(content)  # a separator or the template's markup per part
    for j, part in enumerate(content):
        at = (*path, j)
        if not isinstance(part, dict):
            unit.add(at, part)
            continue
        kind = classify_part(part)
        if kind.kind == "text":
            _text_part(unit, at, part, kind)
        else:
            _media_part(unit, at, part, kind, c)


def _text_part(unit: PromptUnit, at: Path, part: dict[str, Any], kind: PartKind) -> None:
    for key, value in part.items():
        if key == kind.field:
            unit.add((*at, key), value)
        elif key not in ("type", "uuid"):
            # Extra keys reach templates that loop over content ("openai" format).
            _extra(unit, (*at, key), key, value)


def _media_part(
    unit: PromptUnit, at: Path, part: dict[str, Any], kind: PartKind, c: Counting
) -> None:
    payload, _ = media_payload(part, kind)
    unit.media += _media_tokens(kind, payload, c)
    for key, value in part.items():
        if key in ("type", "uuid"):
            continue
        if kind.kind == "unknown" or key not in KNOWN_PART_FIELDS or c.media_as_text:
            # Read as media by no one (extra keys, parts vLLM refuses), or the part as it is
            # handed to a text-only template (llama-cpp-python).
            _extra(unit, (*at, key), key, value)


def _extra(unit: PromptUnit, path: Path, key: str, value: Any) -> None:
    if isinstance(value, str):
        unit.add(path, value)
    elif value is not None:
        unit.weigh(path, {key: value})


# Tokens around each media item besides its features: vLLM joins its placeholders to the text
# with newlines (string content format).
_MEDIA_SEPARATOR = 2


def _media_tokens(kind: PartKind, payload: Any, c: Counting) -> int:
    if kind.kind == "unknown":
        return 0
    if kind.modality == "audio":
        tokens = c.audio
    elif kind.modality == "video":
        frames = VIDEO_FRAMES_READ
        if isinstance(payload, str) and payload[:5].lower() == "data:":
            comma = payload.find(",", 5, 261)
            if comma > 0 and payload[5:comma].partition(";")[0].lower() == "video/jpeg":
                frames = min(frames, payload.count(",", comma + 1) + 1)
        tokens = c.video_frame * frames
    else:
        tokens = c.image
    return tokens + _MEDIA_SEPARATOR if tokens else 0


def _tool_calls(unit: PromptUnit, path: Path, calls: list[Any], c: Counting) -> None:
    for k, call in enumerate(calls):
        at = (*path, k)
        unit.overhead += c.per_message
        if not isinstance(call, dict):
            unit.add(at, call)
            continue
        rest: dict[str, Any] = {}
        for key, value in call.items():
            if key == "function" and isinstance(value, dict):
                function = {}
                for name, inner in value.items():
                    if name == "arguments":
                        _argument(unit, (*at, key, name), inner, c)
                    else:
                        function[name] = inner
                rest[key] = function
            elif key == "arguments":  # placed on the call itself
                _argument(unit, (*at, key), value, c)
            else:
                rest[key] = value
        unit.weigh(at, rest)


def _argument(unit: PromptUnit, path: Path, value: Any, c: Counting) -> None:
    if isinstance(value, str):
        if value:
            unit.arguments.append(Argument(path, value, parse_arguments(value, c.max_json_depth)))
    else:
        unit.add(path, value)


def parse_arguments(text: str, max_depth: int) -> dict[str, Any]:
    """A tool call's ``arguments`` as vLLM reads them: the JSON object, or ``{}`` when the text
    is not one. Nesting deeper than ``max_depth`` raises ``json_depth_exceeded`` (vLLM's
    ``json.loads`` recurses: about 1000 levels give it a RecursionError, a 500)."""
    if text.count("[") + text.count("{") > max_depth:
        try:
            json_depth(text.encode("utf-8", "surrogatepass"), max_depth)
        except Exception as exc:
            if getattr(exc, "code", None) == "json_depth_exceeded":
                raise
            return {}
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return parsed if isinstance(parsed, dict) else {}


# -- prompts ------------------------------------------------------------------------------------


def _prompts(body: dict[str, Any], name: str, c: Counting) -> list[PromptUnit]:
    value = body.get(name)
    items = prompt_items(value)
    units: list[PromptUnit] = []
    specials = 0 if lax_bool(body.get("add_special_tokens")) is False else c.special_tokens
    if items is not None:
        single = not isinstance(value, list) or (bool(value) and is_int(value[0]))
        for i, item in enumerate(items):
            path: Path = (name,) if single else (name, i)
            unit = PromptUnit(path=path)
            if isinstance(item, str):
                unit.add(path, item)
                unit.specials = specials
            elif isinstance(item, list):
                unit.token_ids = len(item)
            units.append(unit)
    if not units:
        units.append(PromptUnit(specials=specials))
    _templates(units[0], body)
    units[0].add(("suffix",), body.get("suffix"))
    return units


# -- the Responses API --------------------------------------------------------------------------


def _responses(body: dict[str, Any], c: Counting) -> PromptUnit:
    unit = PromptUnit(overhead=c.per_request, templated=True)
    items = body.get("input")
    unit.items = ChatInput(items if isinstance(items, list) else [items], body)
    instructions = body.get("instructions")
    if instructions is not None:
        unit.overhead += c.per_message
        unit.add(("instructions",), instructions)
    value = body.get("input")
    if isinstance(value, str):
        unit.overhead += c.per_message
        unit.add(("input",), value)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            at: Path = ("input", i)
            unit.overhead += c.per_message
            if not isinstance(item, dict):
                unit.add(at, item)
                continue
            for key, inner in item.items():
                if inner is None or key == "type":
                    continue
                if key in ("content", "output", "summary") and isinstance(inner, list):
                    add_content(unit, (*at, key), inner, c)
                elif key == "arguments":
                    _argument(unit, (*at, key), inner, c)
                elif key == "role" and isinstance(inner, str) and inner in _USUAL_ROLES:
                    unit.overhead += len(inner)
                else:
                    unit.add((*at, key), inner)
    tools = body.get("tools")
    if tools:
        unit.weigh(("tools",), tools)
        unit.overhead += c.tools
    _templates(unit, body)
    return unit

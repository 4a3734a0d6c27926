"""The request shapes an OpenAI-compatible server reads, as mutation operators.

Each operator edits a request body (a JSON object, in place) and returns whether it applied.
They are grouped by what they exercise:

- **carriers** put text where a chat template may render it: content parts of every type
  (``text``, ``refusal``, ``thinking``, ``tool_reference``, bare strings, unknown types, parts
  without a type), extra keys on parts, messages and tool calls, message fields (``name``,
  ``reasoning``, ``tool_call_id`` ...), tool calls in every spelling (``arguments`` as a string,
  an object, an array, deeply nested JSON; ``name``/``arguments`` directly on the call; custom
  calls), tool definitions wherever they can sit (top level, legacy ``functions``, inside a
  message, in ``chat_template_kwargs``), ``documents``. These are the places a guard's token
  count can miss (the differential campaign's under-counts);
- **media** adds image, video, audio and file parts with their spellings varied: the part
  type, a ``uuid``, the URL as a string or an object, a data URL with leading whitespace, a
  newline in its base64, another MIME type, upper case, PNGs declaring huge sizes;
- **guided** adds ``response_format`` (json_object, json_schema, llama.cpp's schema form),
  ``structured_outputs`` (regex, grammar, choice, json), GBNF ``grammar`` and the legacy
  ``guided_*`` fields, and nests any of them deeper (``(`` x 60,000 in a grammar kills
  llama.cpp's parser);
- **sampling** sets fan-out and sampling fields (``n``, ``logprobs``, ``logit_bias``, ``stop``,
  ``max_tokens`` ...) to boundary values;
- **structure** duplicates messages and parts, grows strings, nests values, changes roles and
  content forms, drops and splices fields, and applies the generic JSON mutator.

No operator knows which shapes a particular guard misses: they produce the shapes, the
campaign measures what each costs.
"""

from __future__ import annotations

import base64
import json
import random
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CHAT",
    "COMPLETIONS",
    "DEPTHS",
    "GRAMMARS",
    "OPERATORS",
    "OUTPUT_FIELDS",
    "SIZES",
    "Context",
    "Operator",
    "data_url",
    "nest_grammar",
    "png",
]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
OUTPUT_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens")

# Text sizes in characters and nesting depths, from ordinary to hostile (picked log-uniformly).
SIZES: tuple[int, ...] = (8, 64, 512, 2048, 6000, 12000)
DEPTHS: tuple[int, ...] = (4, 32, 256, 700, 2000, 6000, 20000, 60000)
_REPEATS: tuple[int, ...] = (2, 4, 16, 64, 256)

_WORDS = (
    "the",
    "quick",
    "brown",
    "fox",
    "jumps",
    "over",
    "lazy",
    "dog",
    "while",
    "server",
    "counts",
    "every",
    "token",
    "it",
    "renders",
    "from",
    "request",
    "and",
    "guard",
    "models",
)
_SPECIAL = (
    "<|begin_of_text|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|eot_id|>",
    "</s>",
    "<s>",
    "[INST]",
    "{{",
    "}}",
    "{%",
    "%}",
)
_UNICODE = ("日本語のテキスト", "Ünïcödé", "ﷺ", "𝔘𝔫𝔦", "\u200b", "é", "🙂", "\u0000")


@dataclass
class Context:
    """What operators draw on: the random source, texts taken from the seeds, the endpoint."""

    rng: random.Random
    texts: Sequence[str] = ()
    path: str = CHAT
    applied: list[str] = field(default_factory=list)
    # What one operator may add to a body: the campaign's body cap. Repeating a value is
    # bounded by it, so that operators stacked on one body grow it linearly, not
    # multiplicatively (a 1 MiB string repeated 256 times, twice, took a campaign to 21 GB).
    max_bytes: int = 1 << 20

    def repeats(self, unit_bytes: int) -> int:
        """A repeat count from :data:`_REPEATS`, lowered so the copies stay within
        ``max_bytes`` (0: even one more copy would not)."""
        k = self.rng.choice(_REPEATS)
        return min(k, self.max_bytes // max(1, unit_bytes))

    def pick_size(self, sizes: Sequence[int] = SIZES) -> int:
        # Log-uniform over the list: small sizes as often as large ones.
        return self.rng.choice(sizes)

    def text(self, size: int | None = None) -> str:
        """A text of about ``size`` characters (one of :data:`SIZES` when None)."""
        rng = self.rng
        n = self.pick_size() if size is None else size
        r = rng.random()
        if r < 0.45:
            unit = " ".join(rng.choice(_WORDS) for _ in range(8)) + " "
        elif r < 0.65 and self.texts:
            unit = rng.choice(self.texts) or "x"
        elif r < 0.75:
            unit = "".join(rng.choice(_SPECIAL) for _ in range(4))
        elif r < 0.85:
            unit = " ".join(rng.choice(_UNICODE) for _ in range(4))
        elif r < 0.92:
            unit = str(rng.randrange(10**12)) + " "
        else:
            unit = rng.choice((" ", "\n", "\t", "a", "ab"))
        reps = max(1, -(-n // max(1, len(unit))))
        return (unit * reps)[:n]

    def name(self) -> str:
        return self.rng.choice(("get_weather", "f", "lookup", "search_docs", "x" * 40))


Operator = Callable[[dict[str, Any], Context], bool]


# ------------------------------------------------------------------------------- helpers


def _messages(body: dict[str, Any], ctx: Context) -> list[Any] | None:
    """The chat messages (a list, created when missing on the chat endpoint), else None."""
    if ctx.path != CHAT:
        return None
    msgs = body.get("messages")
    if not isinstance(msgs, list):
        msgs = [{"role": "user", "content": "hi"}]
        body["messages"] = msgs
    if not msgs:
        msgs.append({"role": "user", "content": "hi"})
    return msgs


def _message(body: dict[str, Any], ctx: Context) -> dict[str, Any] | None:
    msgs = _messages(body, ctx)
    if msgs is None:
        return None
    dicts = [m for m in msgs if isinstance(m, dict)]
    if not dicts:
        msg: dict[str, Any] = {"role": "user", "content": "hi"}
        msgs.append(msg)
        return msg
    return ctx.rng.choice(dicts)


def _parts(msg: dict[str, Any]) -> list[Any]:
    """The message's content as a list of parts (a string content becomes one text part)."""
    content = msg.get("content")
    if isinstance(content, list):
        return content
    parts: list[Any] = []
    if isinstance(content, str):
        parts.append({"type": "text", "text": content})
    msg["content"] = parts
    return parts


def _insert(items: list[Any], value: Any, rng: random.Random) -> None:
    items.insert(rng.randrange(len(items) + 1), value)


def png(width: int, height: int, rows: int | None = None) -> bytes:
    """A 1-bit greyscale PNG declaring ``width`` x ``height`` with ``rows`` zero rows encoded
    (all by default; keep it small for large sizes: the header is what a decoder trusts)."""
    rows = height if rows is None else rows

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack("!I", len(data)) + kind + data + struct.pack("!I", crc)

    row = b"\x00" + b"\x00" * ((width + 7) // 8)
    ihdr = struct.pack("!IIBBBBB", width, height, 1, 0, 0, 0, 0)
    idat = zlib.compress(row * rows, 9)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def data_url(ctx: Context, data: bytes, mime: str = "image/png") -> str:
    """A data URL of ``data``, spelled canonically or in one of the variants servers accept."""
    b64 = base64.b64encode(data).decode("ascii")
    rng = ctx.rng
    r = rng.randrange(9)
    if r == 0 and len(b64) > 8:  # a newline inside the base64
        cut = rng.randrange(1, len(b64))
        return f"data:{mime};base64,{b64[:cut]}\n{b64[cut:]}"
    if r == 1:
        return f" data:{mime};base64,{b64}"  # leading whitespace
    if r == 2:
        return f"data:application/octet-stream;base64,{b64}"
    if r == 3:
        return f"DATA:{mime.upper()};BASE64,{b64}"
    if r == 4:
        return f"data:image/jpeg;base64,{b64}"  # another image MIME type than the bytes'
    if r == 5:
        return f"\ndata:{mime};base64,{b64}"
    return f"data:{mime};base64,{b64}"


# -------------------------------------------------------------------------------- carriers

_PART_CARRIERS: tuple[Callable[[str, Context], Any], ...] = (
    lambda t, c: {"type": "text", "text": t},
    lambda t, c: {"type": "input_text", "text": t},
    lambda t, c: {"type": "output_text", "text": t},
    lambda t, c: {"type": "refusal", "refusal": t},
    lambda t, c: {"type": "thinking", "thinking": t},
    lambda t, c: {"type": "reasoning", "reasoning": t},
    lambda t, c: {"type": "redacted_thinking", "data": t},
    lambda t, c: {"type": "tool_reference", "name": t},
    lambda t, c: {"text": t},
    lambda t, c: {"type": None, "text": t},
    lambda t, c: t,
    lambda t, c: {"type": c.rng.choice(("input_file", "document", "x_custom")), "text": t},
    lambda t, c: {"type": "text", "text": t, "uuid": f"u-{c.rng.randrange(10**6)}"},
)

_EXTRA_KEYS = (
    "uuid",
    "cache_control",
    "annotations",
    "metadata",
    "name",
    "citations",
    "signature",
    "detail",
    "content",
    "text",
    "x_extra",
)
_MESSAGE_FIELDS = (
    "name",
    "reasoning",
    "reasoning_content",
    "thinking",
    "task",
    "tool_call_id",
    "refusal",
    "prefix",
    "weight",
    "x_note",
)
_ROLES = ("system", "user", "assistant", "tool", "developer", "function", "x_role")


def carrier_part(body: dict[str, Any], ctx: Context) -> bool:
    """A content part of one of the shapes that carry text."""
    msg = _message(body, ctx)
    if msg is None:
        return False
    make = ctx.rng.choice(_PART_CARRIERS)
    _insert(_parts(msg), make(ctx.text(), ctx), ctx.rng)
    return True


def carrier_extra_key(body: dict[str, Any], ctx: Context) -> bool:
    """An extra key carrying text on a part, a message, a tool call or the body."""
    rng = ctx.rng
    msgs = _messages(body, ctx)
    holders: list[dict[str, Any]] = [body]
    if msgs is not None:
        for m in msgs:
            if not isinstance(m, dict):
                continue
            holders.append(m)
            content = m.get("content")
            if isinstance(content, list):
                holders.extend(p for p in content if isinstance(p, dict))
            calls = m.get("tool_calls")
            if isinstance(calls, list):
                holders.extend(c for c in calls if isinstance(c, dict))
                holders.extend(
                    c["function"]
                    for c in calls
                    if isinstance(c, dict) and isinstance(c.get("function"), dict)
                )
    holder = rng.choice(holders)
    key = rng.choice(_EXTRA_KEYS)
    value: Any = ctx.text()
    if rng.random() < 0.2:
        value = {"text": value}
    holder[key] = value
    return True


def carrier_message_field(body: dict[str, Any], ctx: Context) -> bool:
    msg = _message(body, ctx)
    if msg is None:
        return False
    msg[ctx.rng.choice(_MESSAGE_FIELDS)] = ctx.text()
    return True


def _deep_json(depth: int) -> str:
    return "[" * depth + "]" * depth


def _tool_call(ctx: Context) -> dict[str, Any]:
    rng = ctx.rng
    name = ctx.name()
    text = ctx.text()
    args = json.dumps({"query": text}, ensure_ascii=False)
    call_id = f"call_{rng.randrange(10**6)}"
    shape = rng.randrange(11)
    if shape == 0:  # arguments as an object instead of a JSON string
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": {"q": text}},
        }
    if shape == 1:
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": [text]}}
    if shape == 2:  # arguments that are not JSON
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}
    if shape == 3:  # deeply nested JSON arguments
        args = _deep_json(rng.choice((100, 1000, 3000, 20000)))
        return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
    if shape == 4:  # name/arguments directly on the call
        return {"id": call_id, "type": "function", "name": name, "arguments": args}
    if shape == 5:
        return {"id": call_id, "name": name, "arguments": {"q": text}}
    if shape == 6:  # the text in the id
        return {"id": text, "type": "function", "function": {"name": name, "arguments": "{}"}}
    if shape == 7:
        return {"id": call_id, "type": "custom", "custom": {"name": name, "input": text}}
    if shape == 8:  # the text as a long function name
        return {"id": call_id, "type": "function", "function": {"name": text, "arguments": "{}"}}
    if shape == 9:
        return {"id": call_id, "function": {"name": name, "arguments": args}}  # no type
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def carrier_tool_call(body: dict[str, Any], ctx: Context) -> bool:
    """An assistant turn with a tool call in one of its spellings, sometimes with its result."""
    msgs = _messages(body, ctx)
    if msgs is None:
        return False
    rng = ctx.rng
    call = _tool_call(ctx)
    content: Any = rng.choice((None, "", "ok"))
    turn: dict[str, Any] = {"role": "assistant", "content": content, "tool_calls": [call]}
    at = rng.randrange(len(msgs) + 1)
    msgs.insert(at, turn)
    if rng.random() < 0.5:
        call_id = call.get("id") if isinstance(call.get("id"), str) else "call_0"
        result: Any = ctx.text() if rng.random() < 0.8 else [{"type": "text", "text": ctx.text()}]
        msgs.insert(at + 1, {"role": "tool", "tool_call_id": call_id, "content": result})
    return True


def _tool(ctx: Context) -> dict[str, Any]:
    rng = ctx.rng
    text = ctx.text()
    r = rng.randrange(5)
    params: dict[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}
    if r == 0:
        params["properties"]["q"]["description"] = text
    elif r == 1:
        params["properties"]["q"]["enum"] = [text[i : i + 8] for i in range(0, len(text), 8)]
    elif r == 2:
        params["properties"] = {
            f"p{i}": {"type": "string"} for i in range(rng.choice((4, 64, 256)))
        }
    function: dict[str, Any] = {"name": ctx.name(), "parameters": params}
    if r in (3, 4):
        function["description"] = text
    return {"type": "function", "function": function}


def carrier_tools(body: dict[str, Any], ctx: Context) -> bool:
    """Tool definitions at the top level, as legacy ``functions``, inside a message or in
    ``chat_template_kwargs``; sometimes with a ``tool_choice``."""
    rng = ctx.rng
    tool = _tool(ctx)
    where = rng.randrange(5)
    if where == 0:
        body["functions"] = [tool["function"]]
    elif where == 1:
        msg = _message(body, ctx)
        if msg is None:
            return False
        msg["tools"] = [tool]
        if rng.random() < 0.5:
            msg["role"] = rng.choice(("developer", "system"))
    elif where == 2:
        kwargs = body.get("chat_template_kwargs")
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        kwargs["tools"] = [tool]
        body["chat_template_kwargs"] = kwargs
    else:
        tools = body.get("tools")
        tools = tools if isinstance(tools, list) else []
        tools.append(tool)
        body["tools"] = tools
    if rng.random() < 0.4:
        body["tool_choice"] = rng.choice(
            ("auto", "required", "none", {"type": "function", "function": tool["function"]})
        )
    return True


def carrier_documents(body: dict[str, Any], ctx: Context) -> bool:
    """``documents`` (rendered by RAG templates) at the top level or in the template kwargs."""
    docs = [{"title": ctx.text(16), "text": ctx.text()}]
    if ctx.rng.random() < 0.5:
        body["documents"] = docs
    else:
        kwargs = body.get("chat_template_kwargs")
        kwargs = kwargs if isinstance(kwargs, dict) else {}
        kwargs[ctx.rng.choice(("documents", "enable_thinking", "x_kwarg"))] = docs
        body["chat_template_kwargs"] = kwargs
    return True


# ----------------------------------------------------------------------------------- media


def _image_url(ctx: Context) -> str:
    rng = ctx.rng
    r = rng.random()
    if r < 0.5:
        return data_url(ctx, png(1, 1))
    if r < 0.8:
        side = rng.choice((64, 4000, 12000, 30000))
        return data_url(ctx, png(side, side, rows=min(side, 64)))
    return rng.choice(
        ("http://127.0.0.1:9/x.png", "file:///dev/null", "https://example.invalid/a.png")
    )


def media_part(body: dict[str, Any], ctx: Context) -> bool:
    """An image, video, audio or file part, its type and URL spelled one of several ways."""
    msg = _message(body, ctx)
    if msg is None:
        return False
    rng = ctx.rng
    url = _image_url(ctx)
    uid = f"u-{rng.randrange(10**6)}"
    shapes: tuple[Callable[[], Any], ...] = (
        lambda: {"type": "image_url", "image_url": {"url": url}},
        lambda: {"type": "image_url", "image_url": url},
        lambda: {"type": "input_image", "image_url": url},
        lambda: {"type": "image", "image": url},
        lambda: {"image_url": {"url": url}},
        lambda: {"type": "text", "text": "hi", "uuid": uid, "image_url": url},
        lambda: {"type": "image_url", "uuid": uid, "image_url": None},
        lambda: {
            "type": "video_url",
            "video_url": {
                "url": "data:video/jpeg;base64,"
                + ",".join([base64.b64encode(png(1, 1)).decode()] * rng.choice((2, 32, 65)))
            },
        },
        lambda: {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        lambda: {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,UklGRg=="}},
        lambda: {"type": "file", "file": {"file_data": url}},
    )
    _insert(_parts(msg), rng.choice(shapes)(), rng)
    if rng.random() < 0.3:
        msg["role"] = "user"
    return True


# ---------------------------------------------------------------------------------- guided

GRAMMARS: tuple[str, ...] = (
    'root ::= "a"',
    'root ::= ("a" | "b")*',
    'root ::= [a-z]+ " " [0-9]*',
    'root ::= item+\nitem ::= "x" | "(" item ")"',
    'root ::= answer " " number\nanswer ::= "yes" | "no"\nnumber ::= [0-9] [0-9]?',
    'root ::= ("a"?)*',
    'root ::= "' + "a" * 64 + '"',
)
_REGEXES = ("[a-z]+", "(a|b)*c", "\\d{3}-\\d{4}", "(a+)+b", "a{1000}", "[\\s\\S]*", "(x|y|z){1,64}")


def _schema(ctx: Context) -> dict[str, Any]:
    rng = ctx.rng
    r = rng.randrange(8)
    if r == 0:
        return {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    if r == 1:
        return {
            "type": "array",
            "items": {"type": "string"},
            "minItems": 1,
            "maxItems": rng.choice((4, 1000, 100000)),
        }
    if r == 2:
        return {
            "type": "string",
            "minLength": rng.choice((1, 1000)),
            "maxLength": rng.choice((16, 100000)),
        }
    if r == 3:
        return {
            "type": "string",
            "enum": [ctx.text(8) + str(i) for i in range(rng.choice((3, 300)))],
        }
    if r == 4:
        return {"type": "string", "pattern": rng.choice(_REGEXES)}
    if r == 5:
        return {
            "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}},
            "$ref": "#/$defs/n",
        }
    if r == 6:
        return {"anyOf": [{"type": "string", "const": f"v{i}"} for i in range(rng.choice((2, 64)))]}
    return {"type": "object", "properties": {f"k{i}": {"type": "integer"} for i in range(16)}}


def guided_response_format(body: dict[str, Any], ctx: Context) -> bool:
    rng = ctx.rng
    schema = _schema(ctx)
    r = rng.randrange(4)
    if r == 0:
        body["response_format"] = {"type": "json_object"}
    elif r == 1:
        body["response_format"] = {"type": "json_object", "schema": schema}  # llama.cpp's form
    else:
        spec: dict[str, Any] = {"name": "out", "schema": schema}
        if r == 3:
            spec["strict"] = True
        body["response_format"] = {"type": "json_schema", "json_schema": spec}
    return True


def guided_structured(body: dict[str, Any], ctx: Context) -> bool:
    """``structured_outputs`` (vLLM), GBNF ``grammar`` (llama.cpp) or a legacy ``guided_*``."""
    rng = ctx.rng
    r = rng.randrange(8)
    if r == 0:
        body["structured_outputs"] = {"regex": rng.choice(_REGEXES)}
    elif r == 1:
        body["structured_outputs"] = {"grammar": rng.choice(GRAMMARS)}
    elif r == 2:
        body["structured_outputs"] = {"choice": [ctx.text(8) for _ in range(rng.choice((2, 64)))]}
    elif r == 3:
        body["structured_outputs"] = {"json": _schema(ctx)}
    elif r in (4, 5):
        body["grammar"] = rng.choice(GRAMMARS)
    else:
        name = rng.choice(("guided_regex", "guided_grammar", "guided_json", "guided_choice"))
        values: dict[str, Any] = {
            "guided_regex": rng.choice(_REGEXES),
            "guided_grammar": rng.choice(GRAMMARS),
            "guided_json": _schema(ctx),
            "guided_choice": ["a", "b"],
        }
        body[name] = values[name]
    return True


def nest_grammar(grammar: str, depth: int) -> str:
    """``grammar`` with its root rule's body wrapped in ``depth`` parentheses."""
    head, sep, rest = grammar.partition("::=")
    if not sep:
        return "(" * depth + grammar + ")" * depth
    line, nl, tail = rest.partition("\n")
    return f"{head}::= {'(' * depth}{line.strip()}{')' * depth}{nl}{tail}"


def _nested_schema(schema: Any, depth: int) -> Any:
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def guided_nest(body: dict[str, Any], ctx: Context) -> bool:
    """Nest a grammar, regex or schema deeper (adds one first when the body has none)."""
    rng = ctx.rng
    depth = rng.choice(DEPTHS)
    places: list[tuple[dict[str, Any], str, str]] = []
    for holder in (body, body.get("structured_outputs")):
        if not isinstance(holder, dict):
            continue
        for key in ("grammar", "guided_grammar"):
            if isinstance(holder.get(key), str):
                places.append((holder, key, "grammar"))
        for key in ("regex", "guided_regex"):
            if isinstance(holder.get(key), str):
                places.append((holder, key, "regex"))
        for key in ("json", "guided_json"):
            if isinstance(holder.get(key), dict):
                places.append((holder, key, "schema"))
    rf = body.get("response_format")
    if isinstance(rf, dict):
        js = rf.get("json_schema")
        if isinstance(js, dict) and isinstance(js.get("schema"), dict):
            places.append((js, "schema", "schema"))
        if isinstance(rf.get("schema"), dict):
            places.append((rf, "schema", "schema"))
    if not places:
        body["grammar"] = rng.choice(GRAMMARS)
        places.append((body, "grammar", "grammar"))
    holder, key, kind = rng.choice(places)
    if kind == "grammar":
        holder[key] = nest_grammar(holder[key], depth)
    elif kind == "regex":
        holder[key] = "(" * depth + holder[key] + ")" * depth
    else:
        holder[key] = _nested_schema(holder[key], min(depth, MAX_OBJECT_DEPTH // 2))
    return True


# -------------------------------------------------------------------------------- sampling

_SAMPLING: dict[str, tuple[Any, ...]] = {
    "n": (1, 2, 4, 16, 17, 128),
    "best_of": (1, 2, 3, 20),
    "max_tokens": (0, 1, 4, 16, 64, 256, 2048, 4096, 10**6, -1),
    "max_completion_tokens": (0, 1, 16, 4096, 10**6),
    "min_tokens": (0, 1, 16, 4096),
    "logprobs": (True, False, 0, 1, 5, 20, 100),
    "top_logprobs": (0, 1, 5, 20, 21, 1000),
    "prompt_logprobs": (0, 1, 5, 20, 100),
    "temperature": (0, 0.7, 2.0, 100.0, -1),
    "top_p": (0.0, 0.5, 1.0, 1.5),
    "top_k": (-1, 0, 1, 40, 10**6),
    "min_p": (0.0, 0.5, 1.0),
    "seed": (0, 1, 2**63, -1),
    "presence_penalty": (0, 2, -2, 100),
    "frequency_penalty": (0, 2, -2),
    "repetition_penalty": (1.0, 0.1, 10.0),
    "echo": (True, False),
    "ignore_eos": (True, False),
    "skip_special_tokens": (False,),
    "include_stop_str_in_output": (True,),
    "add_special_tokens": (True, False),
    "add_generation_prompt": (False, True),
    "continue_final_message": (True,),
    "truncate_prompt_tokens": (-1, 1, 4096, 10**6),
    "stop_token_ids": ([1, 2, 3], list(range(1000))),
    "allowed_token_ids": ([1], list(range(4096))),
    "priority": (0, -100, 100),
    "parallel_tool_calls": (True, False),
    "stream": (True,),
    "stream_options": ({"include_usage": True}, {"continuous_usage_stats": True}),
    "return_tokens_as_token_ids": (True,),
    "mm_processor_kwargs": ({"num_crops": 1000},),
    "vllm_xargs": ({"a": 1},),
    "kv_transfer_params": ({"do_remote_prefill": True},),
    "chat_template_kwargs": (
        {"enable_thinking": True},
        {"add_generation_prompt": False},
        {"reasoning_effort": "high"},
        {"tokenize": True},
    ),
    "reasoning_effort": ("low", "high", "x"),
}


def sampling_field(body: dict[str, Any], ctx: Context) -> bool:
    rng = ctx.rng
    name = rng.choice(list(_SAMPLING))
    value = rng.choice(_SAMPLING[name])
    body[name] = json.loads(json.dumps(value))
    ctx.applied.append(f"set:{name}")
    return True


def sampling_lists(body: dict[str, Any], ctx: Context) -> bool:
    """``logit_bias``, ``stop``, ``bad_words``, ``user``, ``request_id``: sized lists and maps."""
    rng = ctx.rng
    k = rng.choice((1, 4, 8, 64, 300, 301, 4096))
    r = rng.randrange(5)
    if r == 0:
        body["logit_bias"] = {str(i): rng.choice((-100, 1, 100)) for i in range(k)}
    elif r == 1:
        body["stop"] = [ctx.text(rng.choice((1, 4, 64))) for _ in range(min(k, 64))]
    elif r == 2:
        body["stop"] = ctx.text()
    elif r == 3:
        body["bad_words"] = [ctx.text(8) for _ in range(min(k, 64))]
    else:
        body[rng.choice(("user", "request_id", "suffix"))] = ctx.text()
    return True


# ------------------------------------------------------------------------------- structure


def _random_path(node: Any, rng: random.Random) -> list[Any]:
    path: list[Any] = []
    while rng.random() < 0.8:
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
        elif isinstance(node, list) and node:
            key = rng.randrange(len(node))
        else:
            break
        path.append(key)
        node = node[key]
    return path


def _get(node: Any, path: Sequence[Any]) -> Any:
    for p in path:
        node = node[p]
    return node


def _strings(node: Any, path: list[Any], out: list[list[Any]], limit: int = 256) -> None:
    if len(out) >= limit:
        return
    if isinstance(node, str):
        out.append(list(path))
    elif isinstance(node, dict):
        for k, v in node.items():
            _strings(v, [*path, k], out, limit)
    elif isinstance(node, list):
        for i, v in enumerate(node[:64]):
            _strings(v, [*path, i], out, limit)


def grow_string(body: dict[str, Any], ctx: Context) -> bool:
    """Repeat a string value, or pad it to one of :data:`SIZES`."""
    rng = ctx.rng
    paths: list[list[Any]] = []
    _strings(body, [], paths)
    paths = [p for p in paths if p and p[0] != "model"]
    if not paths:
        return False
    path = rng.choice(paths)
    parent = _get(body, path[:-1])
    value: str = parent[path[-1]]
    reps = ctx.repeats(len(value)) if value else 0
    if rng.random() < 0.5 and reps >= 2:
        parent[path[-1]] = value * reps
    else:
        parent[path[-1]] = value + ctx.text()
    return True


def set_text(body: dict[str, Any], ctx: Context) -> bool:
    """Replace a string value by special tokens, unicode, whitespace or another seed's text."""
    paths: list[list[Any]] = []
    _strings(body, [], paths)
    paths = [p for p in paths if p and p[0] != "model"]
    if not paths:
        return False
    path = ctx.rng.choice(paths)
    _get(body, path[:-1])[path[-1]] = ctx.text()
    return True


def duplicate(body: dict[str, Any], ctx: Context) -> bool:
    """Repeat a message, a part, a tool or a prompt k times."""
    rng = ctx.rng
    lists: list[list[Any]] = []
    for key in ("messages", "tools", "prompt", "stop"):
        if isinstance(body.get(key), list) and body[key]:
            lists.append(body[key])
    for m in body.get("messages") or []:
        if isinstance(m, dict) and isinstance(m.get("content"), list) and m["content"]:
            lists.append(m["content"])
    if not lists:
        return False
    items = rng.choice(lists)
    item = rng.choice(items)
    text = json.dumps(item)
    reps = ctx.repeats(len(text))
    if reps < 1:
        return False
    items.extend(json.loads(text) for _ in range(reps))
    return True


# Python's json and copy recurse: a body nested deeper than this is built as text instead
# (:func:`raw_nest`), and is not mutated further.
MAX_OBJECT_DEPTH = 400


def nest_value(body: dict[str, Any], ctx: Context) -> bool:
    """Wrap a value in k levels of lists or objects (JSON depth)."""
    rng = ctx.rng
    path = _random_path(body, rng)
    if not path:
        return False
    depth = rng.choice((8, 32, 128, 256))
    parent = _get(body, path[:-1])
    value = parent[path[-1]]
    wrap_list = rng.random() < 0.5
    for _ in range(depth):
        value = [value] if wrap_list else {"a": value}
    parent[path[-1]] = value
    return True


_STRING_VALUE = re.compile(rb':("(?:[^"\\]|\\.)*")')


def raw_nest(body: bytes, rng: random.Random) -> bytes:
    """``body`` (compact JSON text) with one string value wrapped in k levels of ``[`` or
    ``{"a":`` as text: nesting deeper than a Python structure can hold."""
    values = list(_STRING_VALUE.finditer(body[: 1 << 20]))
    if not values:
        return body
    m = rng.choice(values)
    depth = rng.choice((1000, 5000, 20000, 100000))
    if rng.random() < 0.5:
        opener, closer = b"[" * depth, b"]" * depth
    else:
        opener, closer = b'{"a":' * depth, b"}" * depth
    return body[: m.start(1)] + opener + m.group(1) + closer + body[m.end(1) :]


def change_role(body: dict[str, Any], ctx: Context) -> bool:
    msg = _message(body, ctx)
    if msg is None:
        return False
    msg["role"] = ctx.rng.choice(_ROLES)
    return True


def content_form(body: dict[str, Any], ctx: Context) -> bool:
    """A message's content as a string, a list of parts, null, empty, an object."""
    msg = _message(body, ctx)
    if msg is None:
        return False
    r = ctx.rng.randrange(6)
    if r == 0:
        _parts(msg)
    elif r == 1:
        msg["content"] = None
    elif r == 2:
        msg["content"] = []
    elif r == 3:
        msg["content"] = {"type": "text", "text": ctx.text()}
    elif r == 4:
        msg["content"] = ctx.text()
    else:
        msg.pop("content", None)
    return True


def drop(body: dict[str, Any], ctx: Context) -> bool:
    """Delete a key or an element somewhere."""
    rng = ctx.rng
    path = _random_path(body, rng)
    if not path or path == ["model"]:
        return False
    parent = _get(body, path[:-1])
    if isinstance(parent, dict):
        parent.pop(path[-1], None)
    elif isinstance(parent, list) and len(parent) > 1:
        parent.pop(path[-1])
    else:
        return False
    return True


def prompt_form(body: dict[str, Any], ctx: Context) -> bool:
    """Completions: the prompt as a string, a list of strings, token ids, lists of ids."""
    if ctx.path != COMPLETIONS:
        return False
    rng = ctx.rng
    k = rng.choice((1, 4, 64, 1000, 5000))
    r = rng.randrange(5)
    if r == 0:
        body["prompt"] = ctx.text()
    elif r == 1:
        body["prompt"] = [ctx.text(16) for _ in range(min(k, 64))]
    elif r == 2:
        body["prompt"] = [rng.randrange(4096) for _ in range(k)]
    elif r == 3:
        body["prompt"] = [[rng.randrange(4096) for _ in range(8)] for _ in range(min(k, 64))]
    else:
        body["prompt"] = ""
    if rng.random() < 0.3:
        body["echo"] = True
    return True


def generic_json(body: dict[str, Any], ctx: Context) -> bool:
    """One edit of the in-process guard targets' structure-aware JSON mutator."""
    from fuzz.targets import json_mutate
    from fuzz.targets.gateway import FIELDS

    raw = json.dumps(body, ensure_ascii=False).encode("utf-8")
    out = json_mutate(raw, max(len(raw) * 4, 4096), ctx.rng, fields=FIELDS)
    try:
        doc = json.loads(out)
    except (ValueError, RecursionError):
        return False
    if not isinstance(doc, dict):
        return False
    body.clear()
    body.update(doc)
    return True


# name -> (operator, weight in black-box campaigns, weight in differential campaigns)
OPERATORS: dict[str, tuple[Operator, float, float]] = {
    "carrier.part": (carrier_part, 3, 8),
    "carrier.extra_key": (carrier_extra_key, 2, 5),
    "carrier.message_field": (carrier_message_field, 2, 5),
    "carrier.tool_call": (carrier_tool_call, 3, 6),
    "carrier.tools": (carrier_tools, 2, 5),
    "carrier.documents": (carrier_documents, 1, 2),
    "media.part": (media_part, 2, 2),
    "guided.response_format": (guided_response_format, 2, 1),
    "guided.structured": (guided_structured, 3, 1),
    "guided.nest": (guided_nest, 4, 1),
    "sampling.field": (sampling_field, 4, 1),
    "sampling.lists": (sampling_lists, 2, 1),
    "struct.grow_string": (grow_string, 4, 4),
    "struct.set_text": (set_text, 2, 2),
    "struct.duplicate": (duplicate, 3, 2),
    "struct.nest_value": (nest_value, 1, 1),
    "struct.role": (change_role, 1, 2),
    "struct.content_form": (content_form, 1, 2),
    "struct.drop": (drop, 2, 2),
    "struct.prompt_form": (prompt_form, 2, 1),
    "struct.generic_json": (generic_json, 2, 1),
}

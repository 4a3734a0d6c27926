"""The declarative generator language of payload files: parse once, bound, then materialise.

A generator spec is data, never code: plain YAML values (strings, numbers, lists, mappings) plus
*operations*, mappings with exactly one key that starts with ``$``. Parsing a spec builds a small
tree of nodes and computes, without materialising anything, an upper bound on the bytes it
produces (``out``) and on the bytes produced along the way (``work``); both are checked against
caps before a body is ever built. Every operation is linear in its output, so building a body
costs time proportional to its bound. Nothing is random: the same spec gives the same bytes.

Operations (``S`` = text, ``B`` = bytes, ``J`` = any JSON value; text is UTF-8 where bytes are
needed):

- ``{$repeat: [value, times]}`` or ``{$repeat: {value: ..., times: N}}``: ``value`` (S or B)
  repeated (S or B).
- ``{$concat: [part, ...]}``: parts joined; S when every part is S, else B.
- ``{$list: {item: J, times: N}}``: a JSON array of ``N`` copies of ``item``.
- ``{$object: {key_prefix: "k", times: N, value: J}}``: a JSON object with keys ``k0``..``kN-1``.
- ``{$nest: {depth: N, key: "a", inner: J}}``: ``{"a": {"a": ... inner}}`` nested ``N`` deep
  (``key: null`` nests arrays ``[[...]]``); emitted as JSON text, so any depth serialises.
- ``{$json: J}``: the compact JSON text of a value, as a string (a schema sent as a string).
- ``{$raw_json: S|B}``: text spliced verbatim into the enclosing JSON (malformed on purpose).
- ``{$hex: "c3 28"}``: bytes from hex digits (whitespace ignored).
- ``{$b64: S|B}``: standard base64 of the bytes, as a string (data URLs).
- ``{$gzip: S|B}``: gzip of the bytes, compressed as a stream (a bomb's inflated size is never
  held in memory); header mtime 0, so deterministic.
- ``{$png: {width: W, height: H, rows: R}}``: a 1-bit greyscale PNG declaring W x H pixels whose
  first ``R`` (default all) all-zero rows are compressed as a stream: tiny on the wire, huge
  when decoded (``rows`` < ``height`` gives a truncated image that fails only after decoding
  starts).

Anything else that is a mapping or a list is a JSON container whose members are evaluated.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from payloads._exceptions import GeneratorError

__all__ = [
    "MAX_OUT_BYTES",
    "MAX_TIMES",
    "MAX_WORK_BYTES",
    "RawJSON",
    "SpecNode",
    "check_out",
    "dump_json",
    "json_bound",
    "materialise_bytes",
    "materialise_json",
    "parse_expr",
    "splices_raw",
]

# Caps on what one spec may produce: the bytes sent and the bytes produced along the way (the
# inflated size of a gzip bomb, say). Bounds are computed before anything is built.
MAX_OUT_BYTES = 64 << 20
MAX_WORK_BYTES = 256 << 20
MAX_TIMES = 1 << 26
# Streaming operations emit at most this much at a time.
_BLOCK = 64 << 10

SpecNodeKind = Literal["text", "bytes", "json"]


@dataclass(frozen=True)
class RawJSON:
    """JSON text emitted verbatim by :func:`dump_json`."""

    data: bytes


@dataclass(frozen=True)
class SpecNode:
    """One parsed operation or container.

    ``out`` bounds the UTF-8 bytes of the value itself (text and bytes) or of its compact JSON
    text (JSON values); ``esc`` bounds a text value's length once escaped inside a JSON string
    (without the quotes); ``work`` bounds the bytes produced while evaluating it.
    """

    op: str
    kind: SpecNodeKind
    out: int
    esc: int
    work: int
    args: tuple[Any, ...]


# ---- parsing ---------------------------------------------------------------------------------


def _json_escaped_len(text: str) -> int:
    return len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass")) - 2


def _int(value: Any, what: str, *, low: int = 0, high: int = MAX_TIMES) -> int:
    if type(value) is not int or not low <= value <= high:
        raise GeneratorError(f"{what} must be an integer from {low} to {high}, not {value!r}")
    return value


def _args(value: Any, op: str, names: Sequence[str], required: Sequence[str]) -> dict[str, Any]:
    if isinstance(value, list) and len(value) <= len(names):
        value = dict(zip(names, value, strict=False))
    if not isinstance(value, Mapping):
        raise GeneratorError(f"{op} takes a mapping with keys {', '.join(names)}")
    unknown = set(value) - set(names)
    if unknown:
        raise GeneratorError(f"{op}: unknown argument(s) {sorted(unknown)}")
    missing = [n for n in required if n not in value]
    if missing:
        raise GeneratorError(f"{op}: missing argument(s) {missing}")
    return dict(value)


def _node(op: str, kind: SpecNodeKind, out: int, esc: int, work: int, *args: Any) -> SpecNode:
    # Intermediate values may be held while evaluating (a $b64 of a $png, say), so every node
    # is capped by the work cap; what is sent is capped by MAX_OUT_BYTES (see check_out).
    if work > MAX_WORK_BYTES or out > MAX_WORK_BYTES:
        raise GeneratorError(f"{op} may cost {work} bytes of work; the cap is {MAX_WORK_BYTES}")
    return SpecNode(op, kind, out, esc, work, args)


def _need(node: SpecNode, kinds: tuple[SpecNodeKind, ...], where: str) -> SpecNode:
    if node.kind not in kinds:
        raise GeneratorError(f"{where} needs {' or '.join(kinds)}, got {node.kind} ({node.op})")
    return node


def parse_expr(spec: Any) -> SpecNode:
    """Parse a spec into a node tree with its bounds; raise :class:`GeneratorError` if invalid."""
    if isinstance(spec, Mapping) and len(spec) == 1:
        (key,) = spec
        if isinstance(key, str) and key.startswith("$"):
            return _parse_op(key, spec[key])
    if isinstance(spec, Mapping):
        items: list[tuple[str, SpecNode]] = []
        out = 2 + max(0, len(spec) - 1)
        work = 0
        for key, value in spec.items():
            if not isinstance(key, str):
                raise GeneratorError(f"JSON object keys must be strings, not {key!r}")
            if key.startswith("$"):
                raise GeneratorError(f"{key!r}: an operation must be the only key of its mapping")
            child = _need(parse_expr(value), ("text", "json"), f"the value of {key!r}")
            items.append((key, child))
            out += _json_escaped_len(key) + 3 + _value_out(child)
            work += child.work
        return _node("object", "json", out, out, work + out, tuple(items))
    if isinstance(spec, list):
        children = [_need(parse_expr(v), ("text", "json"), "an array member") for v in spec]
        out = 2 + max(0, len(children) - 1) + sum(_value_out(c) for c in children)
        work = sum(c.work for c in children) + out
        return _node("array", "json", out, out, work, tuple(children))
    if isinstance(spec, str):
        size = len(spec.encode("utf-8", "surrogatepass"))
        return _node("text", "text", size, _json_escaped_len(spec), size, spec)
    if spec is None or isinstance(spec, bool | int | float):
        size = len(json.dumps(spec))
        return _node("scalar", "json", size, size, size, spec)
    raise GeneratorError(f"unsupported value in a generator: {type(spec).__name__}")


def _value_out(node: SpecNode) -> int:
    """Bound on the JSON text of a member: a text node is quoted and escaped."""
    return node.esc + 2 if node.kind == "text" else node.out


def _parse_op(op: str, value: Any) -> SpecNode:
    parse = _OPS.get(op)
    if parse is None:
        raise GeneratorError(f"unknown operation {op!r}")
    return parse(op, value)


def _op_repeat(op: str, value: Any) -> SpecNode:
    a = _args(value, op, ("value", "times"), ("value", "times"))
    inner = _need(parse_expr(a["value"]), ("text", "bytes"), "$repeat value")
    times = _int(a["times"], "$repeat times")
    return _node(
        op,
        inner.kind,
        inner.out * times,
        inner.esc * times,
        inner.work + inner.out * times,
        inner,
        times,
    )


def _op_concat(op: str, value: Any) -> SpecNode:
    if not isinstance(value, list):
        raise GeneratorError("$concat takes a list of parts")
    parts = [_need(parse_expr(p), ("text", "bytes"), "$concat part") for p in value]
    kind: SpecNodeKind = "text" if all(p.kind == "text" for p in parts) else "bytes"
    out = sum(p.out for p in parts)
    esc = sum(p.esc for p in parts)
    return _node(op, kind, out, esc, sum(p.work for p in parts) + out, tuple(parts))


def _op_list(op: str, value: Any) -> SpecNode:
    a = _args(value, op, ("item", "times"), ("item", "times"))
    item = _need(parse_expr(a["item"]), ("text", "json"), "$list item")
    times = _int(a["times"], "$list times")
    out = 2 + times * (_value_out(item) + 1)
    return _node(op, "json", out, out, item.work + out, item, times)


def _op_object(op: str, value: Any) -> SpecNode:
    a = _args(value, op, ("key_prefix", "times", "value"), ("times", "value"))
    prefix = a.get("key_prefix", "k")
    if not isinstance(prefix, str):
        raise GeneratorError("$object key_prefix must be a string")
    member = _need(parse_expr(a["value"]), ("text", "json"), "$object value")
    times = _int(a["times"], "$object times")
    per = _json_escaped_len(prefix) + len(str(times)) + 4 + _value_out(member)
    out = 2 + times * per
    return _node(op, "json", out, out, member.work + out, prefix, member, times)


def _op_nest(op: str, value: Any) -> SpecNode:
    a = _args(value, op, ("depth", "key", "inner"), ("depth",))
    depth = _int(a["depth"], "$nest depth")
    key = a.get("key")
    if key is not None and not isinstance(key, str):
        raise GeneratorError("$nest key must be a string or null")
    inner = _need(parse_expr(a.get("inner")), ("text", "json"), "$nest inner")
    opener = b"[" if key is None else json.dumps(key, ensure_ascii=False).encode() + b":"
    per = len(opener) + (0 if key is None else 1) + 1
    out = depth * per + _value_out(inner)
    return _node(op, "json", out, out, inner.work + out, key, depth, inner)


def _op_json(op: str, value: Any) -> SpecNode:
    inner = _need(parse_expr(value), ("text", "json"), "$json")
    out = _value_out(inner)
    # Escaping JSON text again at most doubles it (quotes and backslashes).
    return _node(op, "text", out, 2 * out, inner.work + out, inner)


def _op_raw_json(op: str, value: Any) -> SpecNode:
    inner = _need(parse_expr(value), ("text", "bytes"), "$raw_json")
    return _node(op, "json", inner.out, inner.out, inner.work + inner.out, inner)


def _op_hex(op: str, value: Any) -> SpecNode:
    if not isinstance(value, str):
        raise GeneratorError("$hex takes a string of hex digits")
    try:
        data = binascii.unhexlify("".join(value.split()))
    except (binascii.Error, ValueError) as exc:
        raise GeneratorError(f"$hex: {exc}") from None
    return _node(op, "bytes", len(data), 4 * len(data), len(data), data)


def _op_b64(op: str, value: Any) -> SpecNode:
    inner = _need(parse_expr(value), ("text", "bytes"), "$b64")
    out = 4 * math.ceil(inner.out / 3)
    return _node(op, "text", out, out, inner.work + out, inner)


def _op_gzip(op: str, value: Any) -> SpecNode:
    inner = _need(parse_expr(value), ("text", "bytes"), "$gzip")
    # zlib's deflateBound plus the gzip header and trailer: sound for any input.
    out = inner.out + (inner.out >> 12) + (inner.out >> 14) + (inner.out >> 25) + 13 + 18
    return _node(op, "bytes", out, 4 * out, inner.work + out, inner)


def _op_png(op: str, value: Any) -> SpecNode:
    a = _args(value, op, ("width", "height", "rows"), ("width", "height"))
    width = _int(a["width"], "$png width", low=1, high=2**31 - 1)
    height = _int(a["height"], "$png height", low=1, high=2**31 - 1)
    rows = _int(a.get("rows", height), "$png rows", low=0, high=height)
    raw = rows * (1 + math.ceil(width / 8))
    out = raw + (raw >> 12) + (raw >> 14) + (raw >> 25) + 13 + 57
    return _node(op, "bytes", out, 4 * out, raw + out, width, height, rows)


# Each operation's parser: checks its arguments and computes its node's bounds.
_OPS: dict[str, Callable[[str, Any], SpecNode]] = {
    "$repeat": _op_repeat,
    "$concat": _op_concat,
    "$list": _op_list,
    "$object": _op_object,
    "$nest": _op_nest,
    "$json": _op_json,
    "$raw_json": _op_raw_json,
    "$hex": _op_hex,
    "$b64": _op_b64,
    "$gzip": _op_gzip,
    "$png": _op_png,
}


# ---- materialising ---------------------------------------------------------------------------


def _chunks(node: SpecNode) -> Iterator[bytes]:
    """A text or bytes node's bytes, in pieces; repetition streams in blocks."""
    if node.op == "$repeat":
        inner, times = node.args
        unit = b"".join(_chunks(inner))
        if not unit or not times:
            return
        per_block = max(1, _BLOCK // len(unit))
        block = unit * per_block
        full, rest = divmod(times, per_block)
        for _ in range(full):
            yield block
        if rest:
            yield unit * rest
    elif node.op == "$concat":
        for part in node.args[0]:
            yield from _chunks(part)
    elif node.op == "$gzip":
        comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS, 9)
        for piece in _chunks(node.args[0]):
            out = comp.compress(piece)
            if out:
                yield out
        yield comp.flush()
    else:
        value = _evaluate(node)
        yield value.encode("utf-8") if isinstance(value, str) else value


def _png(width: int, height: int, rows: int) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    ihdr = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit greyscale
    comp = zlib.compressobj(9)
    row = b"\x00" * (1 + math.ceil(width / 8))  # filter byte 0, then black pixels
    per_block = max(1, _BLOCK // len(row))
    parts: list[bytes] = []
    done = 0
    while done < rows:
        count = min(per_block, rows - done)
        parts.append(comp.compress(row * count))
        done += count
    parts.append(comp.flush())
    idat = b"".join(parts)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def _nest_text(node: SpecNode) -> bytes:
    key, inner = node.args[0], node.args[2]
    depth: int = node.args[1]
    middle = dump_json(_evaluate(inner))
    if key is None:
        return b"[" * depth + middle + b"]" * depth
    opener = b"{" + json.dumps(key, ensure_ascii=False).encode("utf-8") + b":"
    return opener * depth + middle + b"}" * depth


def _evaluate(node: SpecNode) -> Any:
    op, args = node.op, node.args
    if op in ("text", "scalar"):
        return args[0]
    if op == "object":
        return {key: _evaluate(child) for key, child in args[0]}
    if op == "array":
        return [_evaluate(child) for child in args[0]]
    if op in ("$repeat", "$concat", "$gzip"):
        data = b"".join(_chunks(node))
        return data.decode("utf-8", "surrogatepass") if node.kind == "text" else data
    if op == "$list":
        item, times = args
        value = _evaluate(item)
        return [value] * times  # one shared member: linear, and json.dumps writes each copy
    if op == "$object":
        prefix, member, times = args
        value = _evaluate(member)
        return {f"{prefix}{i}": value for i in range(times)}
    if op == "$nest":
        return RawJSON(_nest_text(node))
    if op == "$json":
        return dump_json(_evaluate(args[0])).decode("utf-8")
    if op == "$raw_json":
        value = _evaluate(args[0])
        return RawJSON(value.encode("utf-8") if isinstance(value, str) else value)
    if op == "$hex":
        return args[0]
    if op == "$b64":
        value = _evaluate(args[0])
        data = value.encode("utf-8") if isinstance(value, str) else value
        return base64.b64encode(data).decode("ascii")
    if op == "$png":
        return _png(*args)
    raise AssertionError(f"unhandled node {op}")  # pragma: no cover - parse_expr rejects it


_SENTINEL = "\x00schedguard-raw-json:"

JsonValue: TypeAlias = Any


def dump_json(value: JsonValue) -> bytes:
    """Compact UTF-8 JSON (``NaN`` and ``Infinity`` allowed, on purpose) with :class:`RawJSON`
    fragments spliced in verbatim."""
    fragments: list[bytes] = []

    def hook(obj: Any) -> str:
        if isinstance(obj, RawJSON):
            fragments.append(obj.data)
            return f"{_SENTINEL}{len(fragments) - 1}\x00"
        raise TypeError(f"cannot serialise {type(obj).__name__} in a JSON body")

    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=hook)
    data = text.encode("utf-8")
    if not fragments:
        return data
    marker = json.dumps(_SENTINEL)[:-1].encode("utf-8")  # '"\u0000schedguard-raw-json:'
    out: list[bytes] = []
    pos = 0
    while True:
        at = data.find(marker, pos)
        if at < 0:
            out.append(data[pos:])
            return b"".join(out)
        end = data.index(b'\\u0000"', at + len(marker))
        out.append(data[pos:at])
        out.append(fragments[int(data[at + len(marker) : end])])
        pos = end + len(b'\\u0000"')


def splices_raw(node: SpecNode) -> bool:
    """Whether ``node`` splices ``$raw_json`` text (so its JSON may be malformed)."""
    if node.op == "$raw_json":
        return True
    children: list[SpecNode] = []
    for arg in node.args:
        if isinstance(arg, SpecNode):
            children.append(arg)
        elif isinstance(arg, tuple):
            for item in arg:
                if isinstance(item, SpecNode):
                    children.append(item)
                elif isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], SpecNode):
                    children.append(item[1])
    return any(splices_raw(child) for child in children)


def check_out(bound: int, what: str) -> None:
    """Refuse a top-level body or header set that may exceed :data:`MAX_OUT_BYTES`."""
    if bound > MAX_OUT_BYTES:
        raise GeneratorError(f"{what} may produce {bound} bytes; the cap is {MAX_OUT_BYTES}")


def json_bound(node: SpecNode) -> int:
    """Bound on the bytes of :func:`materialise_json` of ``node``."""
    return _value_out(node)


def materialise_json(node: SpecNode) -> bytes:
    """The compact JSON text of a text or JSON node."""
    return dump_json(_evaluate(node))


def materialise_bytes(node: SpecNode) -> bytes:
    """The bytes of a text (UTF-8) or bytes node."""
    return b"".join(_chunks(node))

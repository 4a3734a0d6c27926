"""The smallest plain instance of a JSON Schema: what the reference model "generates" as a forced
tool call's arguments.

Deterministic and minimal: an object has its required properties only (more, in
``properties`` order, when ``minProperties`` asks), an array ``minItems`` items, a string
``minLength`` characters (or a sample of its ``format``, padded where the format allows), a number its lower bound (rounded up
to ``multipleOf``) or 0, a boolean ``false``; ``const`` and the first of ``enum`` win over
everything; ``anyOf`` / ``oneOf`` take their first branch (deep in a recursive schema, the
first that nests no further), ``allOf`` is merged shallowly;
``$ref`` follows JSON pointers inside the schema (``#/$defs/...``, ``#/definitions/...``,
``#``). A list of types takes the first. Not honoured: ``pattern``, ``uniqueItems`` over equal
minimal items, ``not``, ``if``/``then``/``else``, remote references.

Bounded whatever the schema (it comes from the client): past :data:`MAX_DEPTH` nested values
and combinator hops a recursive schema gets a leaf (``null`` when a branch allows it, else an
empty value of its type); the instance's size is budgeted (:data:`MAX_NODES` values,
:data:`MAX_CHARS` characters of strings and keys), so ``minItems`` or ``$ref`` fan-out cannot
blow it up, and so is the keyword reading (:data:`MAX_WORK`, for schemas whose keywords are huge
but whose instance is small): :class:`InstanceTooLarge` is raised instead.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = [
    "MAX_CHARS",
    "MAX_DEPTH",
    "MAX_NODES",
    "MAX_WORK",
    "InstanceTooLarge",
    "minimal_instance",
]

MAX_DEPTH = 32
MAX_NODES = 4096
MAX_CHARS = 65536
# Schema keywords, properties and branches read (merging allOf, following $ref, ...).
MAX_WORK = 1_000_000

# Samples of the common formats, so a validator that asserts formats accepts them.
_FORMATS = {
    "date-time": "1970-01-01T00:00:00Z",
    "date": "1970-01-01",
    "time": "00:00:00Z",
    "duration": "P0D",
    "email": "user@example.com",
    "idn-email": "user@example.com",
    "hostname": "example.com",
    "idn-hostname": "example.com",
    "ipv4": "127.0.0.1",
    "ipv6": "::1",
    "uri": "https://example.com/",
    "iri": "https://example.com/",
    "uri-reference": "https://example.com/",
    "iri-reference": "https://example.com/",
    "uuid": "00000000-0000-0000-0000-000000000000",
    "json-pointer": "",
    "regex": "",
}
# Formats whose sample stays valid padded to minLength: at the front (an email's local part), at
# the back (a URI's path); the others have a fixed shape.
_PAD_FRONT = frozenset({"email", "idn-email"})
_PAD_BACK = frozenset({"uri", "iri", "uri-reference", "iri-reference"})
# Deep in a schema, this many branches of an anyOf are looked at for one that nests no further.
_LEAF_BRANCHES = 16
_EMPTY: dict[str, Any] = {
    "object": {},
    "array": [],
    "string": "",
    "number": 0,
    "integer": 0,
    "boolean": False,
    "null": None,
}


def _named_value(schema: Mapping[str, Any]) -> tuple[bool, Any]:
    """The value a schema names outright (``const``, else ``enum``'s first), if it names one."""
    if "const" in schema:
        return True, schema["const"]
    enum = schema.get("enum")
    if isinstance(enum, list) and enum:
        return True, enum[0]
    return False, None


class InstanceTooLarge(ValueError):
    """The smallest instance of the schema is over the size budget."""


def minimal_instance(schema: Any) -> Any:
    """The smallest plain instance of ``schema`` (see the module docstring)."""
    return _Builder(schema).build(schema, 0)


class _Builder:
    def __init__(self, root: Any) -> None:
        self.root = root
        self.nodes = 0
        self.chars = 0
        self.work = 0

    def _spend(self, nodes: int, chars: int = 0, work: int = 0) -> None:
        self.nodes += nodes
        self.chars += chars
        self.work += work
        if self.nodes > MAX_NODES or self.chars > MAX_CHARS:
            raise InstanceTooLarge(
                f"the smallest instance is over {MAX_NODES} values or {MAX_CHARS} characters"
            )
        if self.work > MAX_WORK:
            raise InstanceTooLarge(f"the schema takes over {MAX_WORK} steps to read")

    def _merge(self, base: Mapping[str, Any], other: Any) -> dict[str, Any]:
        size = len(base) + (len(other) if isinstance(other, Mapping) else 0)
        for part in (base, other):
            props = part.get("properties") if isinstance(part, Mapping) else None
            size += len(props) if isinstance(props, Mapping) else 0
            required = part.get("required") if isinstance(part, Mapping) else None
            size += len(required) if isinstance(required, list) else 0
        self._spend(0, work=size)
        return _merge(base, other)

    def build(self, schema: Any, depth: int) -> Any:
        self._spend(1)
        schema = self._resolve(schema)
        if not isinstance(schema, Mapping):
            return None  # true, false (no instance exists) or nonsense: null
        if depth >= MAX_DEPTH:
            return self._leaf(schema)
        named, value = _named_value(schema)
        if named:
            return value
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                rest = {k: v for k, v in schema.items() if k != key}
                return self.build(self._merge(rest, self._pick(branches, depth)), depth + 1)
        all_of = schema.get("allOf")
        if isinstance(all_of, list) and all_of:
            merged = {k: v for k, v in schema.items() if k != "allOf"}
            for part in all_of:
                merged = self._merge(merged, self._resolve(part))
            return self.build(merged, depth + 1)
        kind = _type_of(schema)
        if kind == "object":
            return self._object(schema, depth)
        if kind == "array":
            return self._array(schema, depth)
        if kind == "string":
            return self._string(schema)
        if kind in ("number", "integer"):
            return _number(schema, kind == "integer")
        return _EMPTY.get(kind)

    def _resolve(self, schema: Any) -> Any:
        # $ref chains are followed a bounded number of times (a ref to itself would loop).
        for _ in range(MAX_DEPTH):
            ref = schema.get("$ref") if isinstance(schema, Mapping) else None
            if not isinstance(ref, str):
                return schema
            target = _pointer(self.root, ref)
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            self._spend(0, work=len(schema) + len(ref))
            schema = self._merge(rest, target) if rest else target
        return {}

    def _pick(self, branches: list[Any], depth: int) -> Any:
        """The first branch; past half the depth bound, the first that nests no further (a
        recursive schema's way out, such as ``null`` for a linked list's ``next``)."""
        if depth >= MAX_DEPTH // 2:
            for branch in branches[:_LEAF_BRANCHES]:
                resolved = self._resolve(branch)
                if isinstance(resolved, Mapping) and _type_of(resolved) not in ("object", "array"):
                    return resolved
        return self._resolve(branches[0])

    def _leaf(self, schema: Mapping[str, Any]) -> Any:
        """A value that needs no more nesting, for a schema past the depth bound: ``null`` if a
        branch allows it, else an empty value of the (first branch's) type."""
        named, value = _named_value(schema)
        if named:
            return value
        for key in ("anyOf", "oneOf"):
            branches = schema.get(key)
            if isinstance(branches, list) and branches:
                resolved = [self._resolve(b) for b in branches[:_LEAF_BRANCHES]]
                if any(isinstance(b, Mapping) and _type_of(b) == "null" for b in resolved):
                    return None
                schema = self._merge(schema, resolved[0])
        return _EMPTY.get(_type_of(schema))

    def _object(self, schema: Mapping[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        props = props if isinstance(props, Mapping) else {}
        required = schema.get("required")
        required = required if isinstance(required, list) else []
        self._spend(0, work=len(required))
        names = dict.fromkeys(n for n in required if isinstance(n, str))
        wanted = schema.get("minProperties")
        if isinstance(wanted, int) and not isinstance(wanted, bool) and len(names) < wanted:
            for name in props:
                self._spend(0, work=1)
                if len(names) >= wanted:
                    break
                names.setdefault(name)
            if schema.get("additionalProperties", True) is not False:
                i = 0
                while len(names) < wanted:
                    self._spend(1)
                    if f"p{i}" not in props:
                        names.setdefault(f"p{i}")
                    i += 1
        extra = schema.get("additionalProperties", {})
        out: dict[str, Any] = {}
        for name in names:
            self._spend(0, len(name))
            sub = props.get(name, extra if isinstance(extra, Mapping) else {})
            out[name] = self.build(sub if sub is not True else {}, depth + 1)
        return out

    def _array(self, schema: Mapping[str, Any], depth: int) -> list[Any]:
        wanted = schema.get("minItems", 0)
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
            wanted = 0
        if self.nodes + wanted > MAX_NODES:  # before building: minItems alone may be too many
            self._spend(wanted)
        prefix = schema.get("prefixItems")
        items = schema.get("items", {})
        if isinstance(items, list):  # drafts 4-7: items as a tuple
            prefix, items = items, schema.get("additionalItems", {})
        prefix = prefix if isinstance(prefix, list) else []
        return [
            self.build(prefix[i] if i < len(prefix) else items, depth + 1) for i in range(wanted)
        ]

    def _string(self, schema: Mapping[str, Any]) -> str:
        wanted = schema.get("minLength", 0)
        if not isinstance(wanted, int) or isinstance(wanted, bool) or wanted < 0:
            wanted = 0
        fmt = schema.get("format")
        sample = _FORMATS.get(fmt, "") if isinstance(fmt, str) else ""
        self._spend(0, max(wanted, len(sample)))
        pad = "a" * max(0, wanted - len(sample))
        if not sample or not pad:
            return sample + pad
        if fmt in _PAD_FRONT:
            return pad + sample
        # A fixed-length format (a date, a UUID, ...) longer than minLength allows has no
        # instance: its sample is answered as it is.
        return sample + pad if fmt in _PAD_BACK else sample


def _type_of(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if isinstance(k, str)), None)
    if isinstance(kind, str) and kind in _EMPTY:
        return kind
    # No (usable) type: the keywords say which it is.
    if any(k in schema for k in ("properties", "required", "additionalProperties")):
        return "object"
    if any(k in schema for k in ("items", "prefixItems", "minItems")):
        return "array"
    if any(k in schema for k in ("minLength", "format", "pattern")):
        return "string"
    if any(k in schema for k in ("minimum", "exclusiveMinimum", "maximum", "multipleOf")):
        return "number"
    return "null"


def _number(schema: Mapping[str, Any], integer: bool) -> int | float:
    def num(key: str) -> float | None:
        v = schema.get(key)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    low, excl = num("minimum"), schema.get("exclusiveMinimum")
    high = num("maximum")
    if isinstance(excl, bool):  # draft 4: a flag on minimum
        excl = low if excl else None
    elif num("exclusiveMinimum") is None:
        excl = None
    value: float
    if excl is not None and (low is None or excl >= low):
        value = math.floor(excl) + 1 if integer else excl + 1
    elif low is not None:
        value = math.ceil(low) if integer else low
    elif high is not None and high < 0:
        value = math.floor(high) if integer else high
    else:
        value = 0
    step = num("multipleOf")
    if step is not None and step > 0:
        value = math.ceil(value / step) * step
    if integer or float(value).is_integer():
        return int(value)
    return value


def _merge(base: Mapping[str, Any], other: Any) -> dict[str, Any]:
    """``base`` with ``other``'s keywords: properties merged, required joined."""
    out = dict(base)
    if not isinstance(other, Mapping):
        return out
    for key, value in other.items():
        if key == "properties" and isinstance(out.get(key), Mapping) and isinstance(value, Mapping):
            out[key] = {**out[key], **value}
        elif key == "required" and isinstance(out.get(key), list) and isinstance(value, list):
            out[key] = [*out[key], *(v for v in value if v not in out[key])]
        elif key not in out:
            out[key] = value
    return out


def _pointer(root: Any, ref: str) -> Any:
    """The schema a local ``$ref`` points at; ``{}`` (anything) when it points nowhere."""
    if not ref.startswith("#"):
        return {}
    node = root
    for raw in ref[1:].split("/")[1:]:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return {}
    return node

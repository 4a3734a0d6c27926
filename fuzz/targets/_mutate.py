"""Mutation operators shared by the targets: byte-level, dictionary, numeric and structural.

Resource-exhaustion inputs are usually a small structure repeated or nested, or a number made
large, so besides libFuzzer-style byte edits the operators duplicate and nest slices and grow
digit runs. Every operator keeps the result within ``max_size``.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "JSON_VALUES",
    "byte_mutate",
    "grow_number",
    "json_mutate",
    "pick_slice",
]

_DIGITS = re.compile(rb"\d+")

# Values a JSON mutation may put anywhere: type confusion, large, negative, nested, empty.
JSON_VALUES: tuple[Any, ...] = (
    0,
    -1,
    1,
    2**31,
    2**63,
    10**6,
    1e308,
    -1e308,
    0.5,
    True,
    False,
    None,
    "",
    "x" * 16,
    [],
    {},
    [[]],
    {"": {}},
    "{{system_prompt}}",
)


def pick_slice(data: bytes, rng: random.Random, max_len: int = 64) -> tuple[int, int]:
    """A random non-empty ``[start, end)`` of ``data`` (``data`` must not be empty)."""
    start = rng.randrange(len(data))
    end = min(len(data), start + 1 + rng.randrange(min(max_len, len(data) - start)))
    return start, end


def grow_number(data: bytes, max_size: int, rng: random.Random) -> bytes:
    """Make one digit run larger (x10, x2, +9s, or a large constant) or, sometimes, smaller."""
    runs = list(_DIGITS.finditer(data))
    if not runs:
        return data
    m = rng.choice(runs)
    value = int(m.group()) if len(m.group()) < 30 else 10**29
    choice = rng.randrange(6)
    if choice == 0:
        new = value * 10 + 9
    elif choice == 1:
        new = value * 2 + 1
    elif choice == 2:
        new = int(m.group() + b"9" * rng.randint(1, 3))
    elif choice == 3:
        new = rng.choice((99, 999, 9999, 99999, 10**6, 10**9, 2**31 - 1))
    elif choice == 4:
        new = max(0, value // 2)
    else:
        new = rng.randrange(0, 256)
    out = data[: m.start()] + str(new).encode() + data[m.end() :]
    return out if len(out) <= max_size else data


def byte_mutate(
    data: bytes, max_size: int, rng: random.Random, dictionary: Sequence[bytes] = ()
) -> bytes:
    """One libFuzzer-style edit, biased towards growth by repetition."""
    if not data:
        return rng.choice(dictionary) if dictionary else bytes([rng.randrange(256)])
    op = rng.randrange(10)
    if op <= 1 and dictionary:  # insert a dictionary token
        token = rng.choice(dictionary)
        pos = rng.randrange(len(data) + 1)
        out = data[:pos] + token + data[pos:]
    elif op == 2 and dictionary:  # insert a token several times
        token = rng.choice(dictionary)
        pos = rng.randrange(len(data) + 1)
        out = data[:pos] + token * rng.randint(2, 8) + data[pos:]
    elif op == 3:  # duplicate a slice in place (repetition grows cost)
        s, e = pick_slice(data, rng)
        out = data[:e] + data[s:e] * rng.randint(1, 4) + data[e:]
    elif op == 4 and len(data) > 1:  # delete a slice
        s, e = pick_slice(data, rng, 16)
        out = data[:s] + data[e:]
    elif op == 5:  # overwrite a byte
        pos = rng.randrange(len(data))
        out = data[:pos] + bytes([rng.randrange(256)]) + data[pos + 1 :]
    elif op == 6:
        out = grow_number(data, max_size, rng)
    elif op == 7:  # copy a slice elsewhere
        s, e = pick_slice(data, rng)
        pos = rng.randrange(len(data) + 1)
        out = data[:pos] + data[s:e] + data[pos:]
    elif op == 8 and dictionary:  # replace a slice by a token
        s, e = pick_slice(data, rng, 8)
        out = data[:s] + rng.choice(dictionary) + data[e:]
    else:  # insert a random printable byte
        pos = rng.randrange(len(data) + 1)
        out = data[:pos] + bytes([rng.randrange(32, 127)]) + data[pos:]
    return out if len(out) <= max_size else out[:max_size]


# ------------------------------------------------------------------------------------ JSON


def _random_path(node: Any, rng: random.Random) -> tuple[Any, ...]:
    """A random node's path by random descent (O(depth), not O(size))."""
    path: list[Any] = []
    while rng.random() < 0.75:
        if isinstance(node, dict) and node:
            key = rng.choice(list(node))
        elif isinstance(node, list) and node:
            key = rng.randrange(len(node))
        else:
            break
        path.append(key)
        node = node[key]
    return tuple(path)


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


def _set(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = _get(root, path[:-1])
    parent[path[-1]] = value
    return root


def json_mutate(
    data: bytes,
    max_size: int,
    rng: random.Random,
    *,
    fields: Mapping[str, Sequence[Any]],
    dictionary: Sequence[bytes] = (),
) -> bytes:
    """A structure-aware edit of a JSON document (falls back to bytes when it does not parse):
    set a known field to one of its interesting values, replace any node, duplicate or nest a
    node, grow a string or a list, change a number."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return byte_mutate(data, max_size, rng, dictionary)
    if rng.random() < 0.15:
        return byte_mutate(data, max_size, rng, dictionary)
    op = rng.randrange(7)
    if op <= 1 and isinstance(doc, dict) and fields:  # a known field, a chosen value
        name = rng.choice(list(fields))
        doc[name] = _copy(rng.choice(list(fields[name]) or [None]))
    elif op == 2:  # any node -> an interesting value
        doc = _set(doc, _random_path(doc, rng), _copy(rng.choice(JSON_VALUES)))
    elif op == 3:  # duplicate list elements / grow a string
        path = _random_path(doc, rng)
        node = _get(doc, path)
        if isinstance(node, list) and node:
            node.extend(_copy(node) * rng.randint(1, 3))
        elif isinstance(node, str):
            doc = _set(doc, path, node * rng.randint(2, 8) if node else "ab")
        elif isinstance(node, dict):
            node[f"k{rng.randrange(1000)}"] = _copy(node)
    elif op == 4:  # nest a node one level deeper
        path = _random_path(doc, rng)
        node = _get(doc, path)
        doc = _set(doc, path, [node] if rng.random() < 0.5 else {"content": node})
    elif op == 5:  # numbers
        return grow_number(data, max_size, rng)
    else:  # a byte-level edit of one string value
        path = _random_path(doc, rng)
        node = _get(doc, path)
        if isinstance(node, str):
            edited = byte_mutate(node.encode("utf-8", "replace"), max_size, rng, dictionary)
            doc = _set(doc, path, edited.decode("utf-8", "replace"))
    try:
        out = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    except (ValueError, RecursionError):
        return data
    return out if len(out) <= max_size else data


def _copy(value: Any) -> Any:
    return json.loads(json.dumps(value))

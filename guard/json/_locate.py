"""Where in a JSON body an error is: a JSON path such as ``messages[3].content``.

Used only once a body has been refused, to make the message useful. Paths are found on the
neutralised body by skipping whole container members with the structural scan (in C), so the
cost is linear in the body plus one Python step per member before the culprit, at most
``max_members`` per level. Nothing here raises: a path that cannot be found is ``None``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from itertools import compress
from typing import Any

from guard.json._pattern import StructureScan

JsonPath = list[str | int]

_WS = re.compile(rb"[ \t\n\r]*")
_KEY = re.compile(rb'[ \t\n\r]*"[^"]*"[ \t\n\r]*:[ \t\n\r]*')
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_CONTAINERS = frozenset((list, dict))

# Members skipped one match each before skipping blocks of them (then largest first).
_SINGLE_STEPS = 16
_BLOCKS = (256, 16)
_NONE = 1 << 62  # a search that found nothing, for min()
_NOT_QUOTE_OR_COMMA = bytes(b for b in range(256) if b not in b'",')
_PLAIN_KEY = re.compile(rb'[^"\\\x00-\x1f]*"')

MAX_KEY_CHARS = 32  # longer keys are cut in paths
MAX_PATH_CHARS = 160  # longer paths keep their tail


def path_at(
    scan_body: bytes, body: bytes, offset: int, structure: StructureScan
) -> JsonPath | None:
    """The path of the innermost value containing byte ``offset``.

    ``scan_body`` is the neutralised (and verified-marked) body the scan ran on; ``body`` the
    original, for key text. A key's own offset gives the path ending in that key.
    """
    try:
        return _path_at(scan_body, body, offset, structure)
    except (IndexError, ValueError):  # a body that is not JSON where the walk went: no path
        return None


def _path_at(scan: bytes, body: bytes, offset: int, structure: StructureScan) -> JsonPath:
    path: JsonPath = []
    pos = _skip_ws(scan, 0)
    while True:
        if pos >= len(scan) or scan[pos] not in b"[{" or offset <= pos:
            return path  # a scalar, or the container itself
        is_object = scan[pos] == ord("{")
        pos += 1
        index, end = _members_before(scan, pos, offset)
        if index >= 0 and (index == 0 or scan[pos] != ord(",")):
            # Found in C, as the member-by-member walk below would find it: each comma before
            # the offset ends a member, and the offset is in the member after the last one.
            if end == offset and scan[offset] in b",]}":
                return path  # the offset is this container's own comma or bracket
            if index:
                pos = scan.rfind(b",", pos, end)
        else:
            index = 0
            # Skip the members before the offset. Reading up to and including the byte at the
            # offset, a member that stops there leaves that byte (a comma or the closing
            # bracket) to this container; one that reads it contains the offset. Past a few
            # members, whole blocks of them are skipped in one match each.
            while (end := structure.member_end(scan, pos, offset + 1)) <= offset:
                if end in (offset, pos) or scan[end] != ord(","):
                    return path
                pos, index = end, index + 1
                if index == _SINGLE_STEPS:
                    pos, index = _skip_blocks(scan, pos, offset, index, structure)
        start = pos + 1 if scan[pos] == ord(",") else pos
        if offset < start:
            return path
        if is_object:
            quote = _skip_ws(scan, start)
            key = _KEY.match(scan, start)
            if key is None or key.end() > offset:
                if quote <= offset and scan[quote] == ord('"'):
                    path.append(_key_text(body, quote))
                return path
            path.append(_key_text(body, quote))
            pos = key.end()
        else:
            path.append(index)
            pos = _skip_ws(scan, start)
        if pos > offset:
            return path


def _members_before(scan: bytes, pos: int, offset: int) -> tuple[int, int]:
    """(commas, end) when the members of the container whose first member starts at ``pos``
    can be counted up to ``offset`` in C: the commas before ``end`` each end one; else (-1, 0).

    ``end`` is the offset when no bracket lies between ``pos`` and it. Otherwise it is the
    first bracket, which must open a container that nothing closes before the offset
    (no closing bracket at all there), which then holds the offset, and every comma before it
    ends a member. Either way no string before the first bracket may hold a comma. A few
    ``bytes`` passes over ``scan[pos:offset]``, which the walk below reads anyway (the member
    holding the offset is read up to it).
    """
    if offset <= pos:
        return 0, offset
    opening = min(_found(scan.find(b"[", pos, offset)), _found(scan.find(b"{", pos, offset)))
    closing = min(_found(scan.find(b"]", pos, offset)), _found(scan.find(b"}", pos, offset)))
    if closing < _NONE:
        return -1, 0
    end = min(opening, offset)
    # Quotes and commas alone: strings without commas become empty pairs, removed; a string
    # holding a comma or a bracket (or one cut at ``end``) leaves a quote behind.
    kept = scan[pos:end].translate(None, _NOT_QUOTE_OR_COMMA).replace(b'""', b"")
    return (-1, 0) if b'"' in kept else (len(kept), end)


def _found(index: int) -> int:
    return _NONE if index < 0 else index


def _skip_blocks(
    scan: bytes, pos: int, offset: int, index: int, structure: StructureScan
) -> tuple[int, int]:
    """Skip whole blocks of members (``pos`` is at the comma before the next one) while every
    member of a block ends before ``offset`` at a comma, as single steps would; return the new
    position and member index."""
    for count in _BLOCKS:
        while (end := structure.members_end(scan, pos, offset + 1, count)) >= 0:
            if end >= offset or scan[end] != ord(","):
                break
            pos, index = end, index + count
    return pos, index


def is_object_member(scan: bytes, pos: int) -> bool:
    """Whether the container member starting at ``pos`` opens with a key and a colon."""
    return _KEY.match(scan, pos) is not None


def _skip_ws(scan: bytes, pos: int) -> int:
    m = _WS.match(scan, pos)
    return pos if m is None else m.end()


def _key_text(body: bytes, quote: int) -> str:
    """The key whose opening quote is at ``quote``, decoded from at most a few hundred bytes."""
    limit = min(len(body), quote + 1 + 4 * MAX_KEY_CHARS)
    plain = _PLAIN_KEY.match(body, quote + 1, limit)
    if plain is not None:  # no escape or control character: the text is the bytes
        return body[quote + 1 : plain.end() - 1].decode("utf-8", "replace")
    end = quote + 1
    while end < limit and body[end] != ord('"'):
        end += 2 if body[end] == ord("\\") else 1
    raw = body[quote + 1 : min(end, limit)]
    try:
        text = json.loads(b'"' + raw + b'"')
    except ValueError:  # cut inside an escape, or not a valid string
        return raw.decode("utf-8", "replace")
    # A lone surrogate escape decodes to a str that cannot be encoded: keep messages encodable.
    return str(text).encode("utf-8", "replace").decode("utf-8")


def nth_object_end(scan: bytes, n: int, endpos: int | None = None) -> int:
    """Offset of the closing brace of the ``n``-th object to close (1-based), or -1 (also when
    it is not before ``endpos``).

    The parser's ``object_pairs_hook`` runs as each object closes, so its call count is this
    ``n``. One counted match, in C.
    """
    pattern = re.compile(rb'(?:(?:[^"}]++|"[^"]*+")*+\}){%d}' % n)
    m = pattern.match(scan, 0, len(scan) if endpos is None else endpos)
    return -1 if m is None else m.end() - 1


def long_array_path(root: Any, max_length: int) -> tuple[JsonPath, int] | None:
    """The path and length of the first array longer than ``max_length``, walking iteratively."""
    is_container = _CONTAINERS.__contains__
    stack: list[tuple[Any, JsonPath]] = [(root, [])]
    while stack:
        value, path = stack.pop()
        if type(value) is list:
            if len(value) > max_length:
                return path, len(value)
            # compress/map select the nested containers in C; scalars are never visited.
            found = compress(range(len(value)), map(is_container, map(type, value)))
            children: Sequence[tuple[Any, JsonPath]] = [(value[i], [*path, i]) for i in found]
        elif type(value) is dict:
            keys = compress(value, map(is_container, map(type, value.values())))
            children = [(value[k], [*path, k]) for k in keys]
        else:
            continue
        stack.extend(reversed(children))
    return None


def format_path(path: JsonPath | None) -> str | None:
    """``messages[3].content``; odd keys in brackets; long keys and paths cut; root is None."""
    if not path:
        return None
    parts: list[str] = []
    for item in path:
        if isinstance(item, int):
            parts.append(f"[{item}]")
            continue
        key, cut = item[:MAX_KEY_CHARS], "…" if len(item) > MAX_KEY_CHARS else ""
        if _IDENTIFIER.match(key):
            parts.append(f".{key}{cut}" if parts else f"{key}{cut}")
        else:  # quoted: json.dumps escapes quotes and control characters
            parts.append(f"[{json.dumps(key + cut, ensure_ascii=False)}]")
    text = "".join(parts)
    if len(text) > MAX_PATH_CHARS:
        text = "…" + text[-(MAX_PATH_CHARS - 1) :]
    return text

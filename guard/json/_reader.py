"""A bounded JSON body reader: every limit checked before or while parsing, nothing unbounded built.

``parse_json_body(body, limits, max_body_bytes)`` reads a request body in four steps, each linear
in its size and each stopping at the first limit crossed:

1. size, when bounded (``body_too_large``, 413), strict UTF-8 (``invalid_utf8``), and no lone surrogate
   escape such as ``"\\ud800"`` (``invalid_utf8``: it has no UTF-8 form and upstreams differ on
   it);
2. scans before parsing, in C (see ``guard/json/_pattern.py``), respecting strings and
   escapes: one regular expression for nesting depth, members per array or object and string
   lengths, then ``bytes`` searches for long numbers and for the number of containers;
3. the standard library parser, whose ``object_pairs_hook`` refuses duplicate keys (an upstream
   may keep the other one) and counts keys per object and in total, and whose
   ``parse_constant`` refuses ``NaN`` and ``Infinity``, and ``parse_float`` numbers that
   overflow to infinity (``1e999``, ``-1E+400``; integers too when the number limit lets one
   reach a double's range). Numbers are already short, so ``int()``
   never meets a long digit string, and depth is already bounded, so the parser's recursion
   is too;
4. array lengths, when ``max_keys_per_object`` exceeds ``max_array_length`` (the scan counts
   members of both kinds with one bound, the larger; otherwise nothing is left to check).

orjson is not used: it has no ``object_pairs_hook``, so it keeps one of two duplicate keys
silently, and it refuses integers beyond 64 bits that JSON allows. (Its deep-nesting crash,
CVE-2024-27454, would be precluded by step 2 anyway.) A whole read costs about 1 to 3 times a
plain ``json.loads`` of the same body: close to it for text, most on dense number arrays; see
``bench/json_scan.py``.

Errors carry a stable ``code``, a short message naming the limit and where it was crossed (a
JSON path such as ``messages[3].content`` and a byte offset; past the first 64 KiB, the
offset alone, or for a key refused while parsing only that it is past it), and that path as
``param``. They never echo body text beyond a few dozen characters of one key.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

from pydantic import Field
from pydantic.dataclasses import dataclass

from guard._limits import LIMITS_CONFIG
from guard.errors import GuardError, LimitExceeded
from guard.json import _locate as locate
from guard.json import _pattern as pattern

__all__ = ["JsonLimits", "json_depth", "parse_json_body", "scan_json_body"]

_REPEAT_MAX = 2**31 - 1  # well under the regex engine's repeat limit
# A refusal further into the body than this is not named by its path: the path walk re-reads
# everything before it with the structural pattern (~100 ns a byte on dense containers: 40 ms
# of a 450 KB bracket bomb's 50 went to naming the path). Scan refusals keep their byte offset.
_LOCATE_WITHIN = 64 * 1024


# The scan's patterns repeat a group up to a limit's value times.
_Count = Annotated[int, Field(strict=True, gt=0, le=_REPEAT_MAX)]


@dataclass(frozen=True, config=LIMITS_CONFIG)
class JsonLimits:
    """Limits on one JSON request body: the policy's ``limits.json`` section. The defaults suit
    OpenAI-style API requests: a chat request nests about 5 deep and has a few dozen fields;
    ``logit_bias`` maps are capped by providers at about 300 entries (and by the fan-out check);
    a prompt of token ids longer than ``max_array_length`` exceeds the token cap anyway.

    With these caps, the parsed form of a body takes at most about 15 times its size (a dense
    array of 2-character strings; text and request bodies take 1 to 5 times), so ~60 MB while
    one 4 MiB body is parsed (measured: bench/json_scan.py --memory). The body's size is the
    framing's to bound (``limits.body``); :func:`parse_json_body` takes it separately.
    """

    max_depth: int = Field(
        default=32,
        strict=True,
        ge=1,
        le=pattern.MAX_SUPPORTED_DEPTH,  # the scan is a pattern nested that many times
        description="Deepest nesting of arrays and objects, scanned before parsing (a chat "
        "request nests about 5 deep; JSON schemas add 2 per level). At most 128.",
    )
    max_keys_per_object: _Count = Field(
        default=1024,
        description="Most keys in one JSON object (OpenAI's `logit_bias` takes 300; a JSON "
        "schema's `properties` rarely more than a few dozen).",
    )
    max_total_keys: _Count = Field(
        default=65_536,
        description="Most object keys in the whole body (a conversation of 2,048 messages "
        "with tool calls holds about 16,000).",
    )
    max_array_length: _Count = Field(
        default=131_072,
        description="Most elements of one array: messages, content parts, batched prompts, "
        "token ids (a token-id prompt as long as a 128k-token context window).",
    )
    max_string_bytes: _Count = Field(
        default=1_048_576,
        description="Longest string (UTF-8 bytes after unescaping, keys too): a long prompt or "
        "a ~750 KB image as a base64 data URL.",
    )
    max_number_chars: _Count = Field(
        default=64, description="Longest number as written (a 64-bit integer takes 20 characters)."
    )
    max_containers: _Count = Field(
        default=100_000,
        description="Most arrays and objects in the body (an empty list costs the parser 56 "
        "bytes for 2 bytes of body).",
    )


def parse_json_body(body: bytes, limits: JsonLimits, max_body_bytes: int | None = None) -> Any:
    """The parsed body, or a :class:`GuardError` naming the first limit crossed.

    ``max_body_bytes``: the largest body accepted (None: the caller bounded it already).

    Codes: ``body_too_large`` (413), ``invalid_utf8``, ``invalid_json``,
    ``json_depth_exceeded``, ``json_too_many_keys``, ``json_duplicate_key``,
    ``json_array_too_long``, ``json_string_too_long``, ``json_number_too_long``,
    ``json_too_many_containers``, ``json_non_finite_number`` (``NaN``, ``Infinity`` and numbers
    that overflow to infinity, such as ``1e999``) (all 400 but the first). Limit
    codes raise :class:`LimitExceeded`; ``invalid_*``, ``json_duplicate_key`` and
    ``json_non_finite_number`` a plain :class:`GuardError`.
    """
    if max_body_bytes is not None and len(body) > max_body_bytes:
        raise LimitExceeded(
            "body_too_large",
            f"request body is {len(body)} bytes; the limit is {max_body_bytes}",
            status=413,
        )
    try:
        text = body.decode("utf-8")  # strict: no overlongs, no encoded surrogates
    except UnicodeDecodeError as exc:
        raise GuardError(
            "invalid_utf8", f"request body is not valid UTF-8 at byte {exc.start}"
        ) from None

    scan, structure = _scanned(body, limits)
    value = _parse(text, scan, body, limits, structure)

    if limits.max_keys_per_object > limits.max_array_length:
        long_array = locate.long_array_path(value, limits.max_array_length)
        if long_array is not None:
            path, length = long_array
            raise LimitExceeded(
                "json_array_too_long",
                f"JSON array of {length} elements exceeds the limit of {limits.max_array_length}"
                f" at {locate.format_path(path) or '$'}",
                param=locate.format_path(path),
            )
    return value


def scan_json_body(body: bytes, limits: JsonLimits) -> None:
    """Step 2 of :func:`parse_json_body` alone (a lone surrogate escape, then the scans before
    parsing): raises what the body's structure crosses first; neither UTF-8 nor the JSON
    grammar is checked."""
    _scanned(body, limits)


def _scanned(body: bytes, limits: JsonLimits) -> tuple[bytes, pattern.StructureScan]:
    """The scans before parsing; the neutralised body and the structural scan, for the parse."""
    scan = pattern.neutralise(body)
    structure = _structure(limits)
    lone = pattern.find_lone_surrogate(scan)
    if lone >= 0:
        _refuse(
            GuardError,
            "invalid_utf8",
            "lone surrogate escape in a string",
            lone,
            scan,
            body,
            structure,
        )

    # The searches are fast; the structural scan then reads only up to the first thing they
    # found, so the first limit crossed in the body is the one reported, and a dense body with
    # too many containers is refused after reading just those.
    number = pattern.find_long_number(scan, limits.max_number_chars)
    openers = pattern.count_openers(scan)  # read once, for both of the next two
    container = pattern.find_container(scan, limits.max_containers + 1, openers)
    stop = min((x for x in (number, container) if x >= 0), default=len(scan))
    within = _within_structure_limits(scan, limits, openers)
    found = None if within else structure.run(scan, stop)
    if found is not None and found.kind == "unverified_string":
        scan = _verify_long_strings(scan, body, limits, structure, stop)
        found = structure.run(scan, stop)
    if found is not None:
        _refuse_scan(found, scan, body, limits, structure)
    if stop == number:
        what = f"JSON number exceeds the limit of {limits.max_number_chars} characters"
        _refuse(LimitExceeded, "json_number_too_long", what, number, scan, body, structure)
    if stop == container:
        what = f"JSON body exceeds the limit of {limits.max_containers} arrays and objects"
        _refuse(LimitExceeded, "json_too_many_containers", what, container, scan, body, structure)
    return scan, structure


def _within_structure_limits(scan: bytes, limits: JsonLimits, openers: int | None = None) -> bool:
    """Whether bytes methods alone prove the structural scan would find nothing, so a body
    skips it (its fixed cost is several times a small body's parse, and a body of many small
    containers costs it about 20 ns a byte). Each count bounds what the scan measures from
    above, strings included: members of any one container by the commas plus one, a string's
    length by the body's, nesting depth by the opening brackets or else by
    :func:`_depth_within`. Bodies over the bounds are scanned as before."""
    if len(scan) > limits.max_string_bytes:
        return False
    if scan.count(b",") >= max(limits.max_array_length, limits.max_keys_per_object):
        return False
    if openers is None:
        openers = pattern.count_openers(scan)
    if openers <= limits.max_depth:
        return True
    return _depth_within(scan, openers, limits.max_depth)


# Brackets to parentheses and quotes kept; every other byte deleted.
_PARENS = bytes(range(256)).translate(bytes.maketrans(b"[{]}", b"(())"))
_NOT_BRACKET_OR_QUOTE = bytes(b for b in range(256) if b not in b'[]{}"')


def _depth_within(scan: bytes, openers: int, max_depth: int) -> bool:
    """Whether the brackets of ``scan`` nest at most ``max_depth`` deep, shown in C, or False
    when that is not quick to show (the structural scan then decides). ``scan`` is the body
    after :func:`~guard.json._pattern.neutralise`: no escaped quote is left to pair up with a
    real one and pass a string's brackets off as structure.

    Kept alone, brackets and quotes show strings as quote pairs: a string without a bracket
    becomes ``""`` and is removed; one holding a bracket leaves a quote behind, and is left to
    the scan. Then each pass removes the innermost ``()`` pairs: a body is at most ``max_depth``
    deep when as many passes leave nothing. Bodies that cannot pass (brackets that do not
    balance, a run of openers over the limit) stop before the passes, which read at most 8
    times the brackets and quotes in all.
    """
    nest = scan.translate(_PARENS, _NOT_BRACKET_OR_QUOTE)
    if nest.count(b")") != openers:  # counted on the brackets and quotes alone: far shorter
        return False
    nest = nest.replace(b'""', b"")
    if b'"' in nest or b"(" * (max_depth + 1) in nest:
        return False
    budget = 8 * len(nest) + 4096
    for _ in range(max_depth):
        if not nest:
            return True
        budget -= len(nest)
        shorter = nest.replace(b"()", b"")
        if len(shorter) == len(nest) or budget < 0:
            return False  # unbalanced, or too slow to show: the scan decides
        nest = shorter
    return not nest


_LEVELS = frozenset(f"level{i}" for i in range(1, pattern.MAX_SUPPORTED_DEPTH + 1))


def json_depth(body: bytes, max_depth: int) -> int:
    """The nesting depth of a JSON text (0 for a scalar), in one pass that respects strings.

    Raises :class:`LimitExceeded` ``json_depth_exceeded`` at the first bracket deeper than
    ``max_depth`` (at most 128) without reading further, and :class:`GuardError`
    ``invalid_json`` when brackets or quotes do not balance. Nothing else is validated (a ``]``
    may close a ``{``): this measures nesting, the parser validates.
    """
    if type(max_depth) is not int or not 1 <= max_depth <= pattern.MAX_SUPPORTED_DEPTH:
        raise ValueError(f"max_depth must be an integer from 1 to {pattern.MAX_SUPPORTED_DEPTH}")
    scan = pattern.neutralise(body)
    compiled = pattern.depth_scan(max_depth)
    m = compiled.match(scan)
    if m is not None and m.start("depth") >= 0:
        offset = m.start("depth") - 1
        raise LimitExceeded(
            "json_depth_exceeded",
            f"JSON nesting depth exceeds the limit of {max_depth} at byte {offset}",
        )
    if m is None or m.end() != len(scan) or m.lastgroup not in (None, *_LEVELS):
        # Stopped early at a stray closing bracket or an unclosed string, or ended with a
        # container still open (the last group set is then an ``unclosed<i>``).
        at = 0 if m is None else m.end()
        raise GuardError("invalid_json", f"unbalanced brackets or quotes from byte {at}")
    for level in range(max_depth, 0, -1):
        if m.group(f"level{level}") is not None:
            return level
    return 0


class _ObjectRefused(Exception):
    """Raised by the pairs hook inside the parser; turned into a GuardError with a path."""

    def __init__(self, code: str, ordinal: int, detail: str, key: str | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.ordinal = ordinal
        self.detail = detail
        self.key = key


_PairsHook = Callable[[list[tuple[str, Any]]], dict[str, Any]]


def _pairs_hook() -> tuple[_PairsHook, Callable[[int, int], None]]:
    """The parser's ``object_pairs_hook`` and its reset: builds each object, refusing duplicate
    keys and counting keys per object and in all. State lives in the closure, not in instance
    attributes: the hook runs once per object, and on bodies of a thousand small objects or
    more the parse took 13-16% less time than with a callable instance (6-9% of the whole read).
    """
    calls = total = max_keys = max_total = 0

    def reset(keys: int, total_keys: int) -> None:
        nonlocal calls, total, max_keys, max_total
        calls, total, max_keys, max_total = 0, 0, keys, total_keys

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal calls, total
        calls += 1
        count = len(pairs)
        obj = dict(pairs)
        total += count
        if count > max_keys or len(obj) != count or total > max_total:
            raise _refusal(pairs, obj, calls, max_keys, max_total)
        return obj

    return hook, reset


def _refusal(
    pairs: list[tuple[str, Any]], obj: dict[str, Any], ordinal: int, max_keys: int, max_total: int
) -> _ObjectRefused:
    """Which limit an object crossed, in the order they are documented: its own keys, then a
    duplicate key, then the keys of the whole body."""
    count = len(pairs)
    if count > max_keys:
        detail = f"JSON object of {count} keys exceeds the limit of {max_keys}"
        return _ObjectRefused("json_too_many_keys", ordinal, detail)
    if len(obj) != count:
        seen: set[str] = set()
        for key, _ in pairs:  # pragma: no branch - a duplicate exists
            if key in seen:
                return _ObjectRefused(
                    "json_duplicate_key", ordinal, "duplicate JSON object key", key
                )
            seen.add(key)
    detail = f"JSON body exceeds the limit of {max_total} object keys in total"
    return _ObjectRefused("json_too_many_keys", ordinal, detail)


class _Parser(threading.local):
    """Decoders and their hook per thread, built once: ``json.loads`` with hooks builds a new
    decoder and scanner on every call, which costs more than parsing a small body.

    ``decoder`` leaves numbers on the C parser's fast path; ``finite_floats`` checks every
    float literal (a Python call each: about twice the parse of a float-dense body), for bodies
    where one could overflow; ``wide_ints`` checks integers too, for limits that let an integer
    literal reach a double's range (see :func:`_decoder`).
    """

    def __init__(self) -> None:
        hook, self.reset = _pairs_hook()
        self.decoder = json.JSONDecoder(object_pairs_hook=hook, parse_constant=_reject_constant)
        self.finite_floats = json.JSONDecoder(
            object_pairs_hook=hook, parse_constant=_reject_constant, parse_float=_finite_float
        )
        self.wide_ints = json.JSONDecoder(
            object_pairs_hook=hook,
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            parse_int=_finite_int,
        )


class _ConstantRefused(Exception):
    """Raised by ``parse_constant``: the parser met NaN, Infinity or -Infinity."""


class _Overflowed(Exception):
    """Raised by ``parse_float`` / ``parse_int``: a number beyond a double's range, which
    Python (and so pydantic in the upstream) reads as infinity or cannot convert at all."""


def _reject_constant(name: str) -> NoReturn:
    raise _ConstantRefused(name)


def _finite_float(text: str) -> float:
    value = float(text)
    if value - value != 0.0:  # inf - inf is nan; every finite value gives 0.0
        raise _Overflowed(text[:40])
    return value


# The digits from which an integer literal can exceed the largest double (1.8e308).
_WIDE_INT_CHARS = 309
# A positive exponent of 100 or more. Without one, a literal of at most _SHORT_NUMBER_CHARS
# characters is below 1e(200 + 99): finite, so the fast decoder is exact.
_BIG_EXPONENT = re.compile(rb"[eE]\+?0*[1-9][0-9]{2}")
_SHORT_NUMBER_CHARS = 200


def _decoder(parser: _Parser, scan: bytes, limits: JsonLimits) -> json.JSONDecoder:
    """The cheapest decoder that still refuses every number overflowing to infinity."""
    if limits.max_number_chars >= _WIDE_INT_CHARS:
        return parser.wide_ints
    if limits.max_number_chars > _SHORT_NUMBER_CHARS or _BIG_EXPONENT.search(scan):
        return parser.finite_floats
    return parser.decoder


def _finite_int(text: str) -> int:
    value = int(text)
    if len(text) >= _WIDE_INT_CHARS:
        try:
            float(value)  # what an upstream's float field does with it
        except OverflowError:
            raise _Overflowed(text[:40]) from None
    return value


_PARSER = _Parser()


def _structure(limits: JsonLimits) -> pattern.StructureScan:
    # Members of arrays and objects share one bound, the larger (see step 4 above).
    members = max(limits.max_array_length, limits.max_keys_per_object)
    return pattern.structure_scan(limits.max_depth, members, limits.max_string_bytes)


def _parse(
    text: str, scan: bytes, body: bytes, limits: JsonLimits, structure: pattern.StructureScan
) -> Any:
    parser = _PARSER
    parser.reset(limits.max_keys_per_object, limits.max_total_keys)
    decoder = _decoder(parser, scan, limits)
    try:
        if text.startswith("\ufeff"):  # as json.loads refuses it
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return decoder.decode(text)
    except _ObjectRefused as refused:
        cls = GuardError if refused.code == "json_duplicate_key" else LimitExceeded
        end = locate.nth_object_end(scan, refused.ordinal, _LOCATE_WITHIN + 1)
        if end < 0:  # past the first 64 KiB: where, not which path (see _LOCATE_WITHIN)
            key = "" if refused.key is None else f" (key {locate.format_path([refused.key])})"
            at = f"an object past byte {_LOCATE_WITHIN}{key}"
            raise cls(refused.code, f"{refused.detail} in {at}") from None
        path = locate.path_at(scan, body, end, structure)
        if refused.key is not None:
            path = [*(path or []), refused.key]
        where = locate.format_path(path)
        at = f"{where or '$'}" + (f" (byte {end})" if refused.key is None else "")
        raise cls(refused.code, f"{refused.detail} at {at}", param=where) from None
    except _ConstantRefused:
        what = "NaN and Infinity are not valid JSON numbers"
        offset = pattern.find_non_finite(scan)
        if offset < 0:  # pragma: no cover - the parser found one, so the search does
            raise GuardError("json_non_finite_number", what) from None
        _refuse(GuardError, "json_non_finite_number", what, offset, scan, body, structure)
    except _Overflowed:
        what = "JSON number overflows to infinity (beyond 1.8e308)"
        offset = pattern.find_overflowing_number(scan)
        if offset < 0:  # pragma: no cover - the parser found one, so the search does
            raise GuardError("json_non_finite_number", what) from None
        _refuse(GuardError, "json_non_finite_number", what, offset, scan, body, structure)
    except json.JSONDecodeError as exc:
        offset = len(text[: exc.pos].encode("utf-8", "surrogatepass"))
        raise GuardError(
            "invalid_json", f"request body is not valid JSON: {exc.msg} at byte {offset}"
        ) from None
    except (ValueError, RecursionError):
        # Not expected after the scan (numbers are short, depth is bounded); kept so that no
        # input can surface as anything but a GuardError.
        raise GuardError("invalid_json", "request body is not valid JSON") from None


def _verify_long_strings(
    scan: bytes, body: bytes, limits: JsonLimits, structure: pattern.StructureScan, stop: int
) -> bytes:
    """Measure every string before ``stop`` whose raw form exceeds the limit; refuse one whose
    UTF-8 form does too, else mark them all verified for a second scan. Linear: the long runs
    are found in C, and there are fewer of them than body bytes / limit."""
    limit = limits.max_string_bytes
    verified: list[int] = []
    for quote in pattern.long_strings(scan, limit):
        if quote >= stop:
            break
        close = scan.find(b'"', quote + 1)
        try:
            value = json.loads(body[quote : len(body) if close < 0 else close + 1].decode("utf-8"))
        except ValueError:
            value = None  # malformed: the parser will refuse it where it starts
        if isinstance(value, str) and len(value.encode("utf-8", "surrogatepass")) > limit:
            _refuse(
                LimitExceeded,
                "json_string_too_long",
                f"JSON string exceeds the limit of {limit} bytes",
                quote,
                pattern.mark_verified(scan, verified),
                body,
                structure,
            )
        verified.append(quote)
    return pattern.mark_verified(scan, verified)


_SCAN_MESSAGES = {
    "depth": ("json_depth_exceeded", "JSON nesting depth exceeds the limit of {max_depth}"),
    "string": ("json_string_too_long", "JSON string exceeds the limit of {max_string_bytes} bytes"),
    # Not expected: every long string is verified and marked before the second scan.
    "unverified_string": (
        "json_string_too_long",
        "JSON string exceeds the limit of {max_string_bytes} bytes",
    ),
}


def _refuse_scan(
    found: pattern.Violation,
    scan: bytes,
    body: bytes,
    limits: JsonLimits,
    structure: pattern.StructureScan,
) -> NoReturn:
    if found.kind == "members":
        # The scan bounds members of arrays and objects alike; an object member starts with a
        # key and a colon, which an array element never has.
        if locate.is_object_member(scan, found.offset + 1):
            code, what = (
                "json_too_many_keys",
                f"JSON object exceeds the limit of {limits.max_keys_per_object} keys",
            )
        else:
            code, what = (
                "json_array_too_long",
                f"JSON array exceeds the limit of {limits.max_array_length} elements",
            )
    else:
        code, template = _SCAN_MESSAGES[found.kind]
        what = template.format(**limits.__dict__)
    _refuse(LimitExceeded, code, what, found.offset, scan, body, structure)


def _refuse(
    cls: type[GuardError],
    code: str,
    what: str,
    offset: int,
    scan: bytes,
    body: bytes,
    structure: pattern.StructureScan,
) -> NoReturn:
    where = None
    if offset <= _LOCATE_WITHIN:
        where = locate.format_path(locate.path_at(scan, body, offset, structure))
    at = f"{where} (byte {offset})" if where else f"byte {offset}"
    raise cls(code, f"{what} at {at}", param=where)

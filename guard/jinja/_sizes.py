"""Upper bounds on the size of text before it is made: ``str()``/``repr()`` of values, JSON, printf.

Each bound is computed in time linear in what it measures and stops as soon as it passes its
limit, so a value built from shared references (``[big] * 10000``) is refused after a few items
instead of being converted.
"""

from __future__ import annotations

import re
from collections.abc import ItemsView, KeysView, Mapping, ValuesView
from typing import Any, Literal

from jinja2.utils import Namespace

from guard.errors import FormatRefused

Mode = Literal["str", "repr", "json"]

# Characters JSON escapes beyond the quote, backslash, \n, \r and \t counted separately.
_JSON_OTHER_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")
# repr(float) is at most 24 characters ("-1.2345678901234567e-308").
_FLOAT_CHARS = 24
# Anything we cannot look into (functions, loop contexts, generators) prints a short repr.
_OPAQUE_CHARS = 256


def int_chars(value: int) -> int:
    """Upper bound on the decimal, octal or hex digits of ``value`` (plus sign and prefix)."""
    return value.bit_length() // 3 + 4


def _str_repr_chars(s: str) -> int:
    # repr() escapes quotes and backslashes (2 chars) and non-printables (up to 10: \U0001f600).
    if s.isprintable():
        return len(s) + 2 + s.count("\\") + s.count("'")
    return 10 * len(s) + 2


def _str_json_chars(s: str, ensure_ascii: bool) -> int:
    if ensure_ascii and not s.isascii():
        return 12 * len(s) + 2  # astral characters become two \uXXXX escapes
    if _JSON_OTHER_CONTROL.search(s) is not None:
        return 6 * len(s) + 2
    return len(s) + 2 + s.count('"') + s.count("\\") + s.count("\n") + s.count("\r") + s.count("\t")


def _scalar_chars(value: Any, mode: Mode, ensure_ascii: bool, top: bool) -> int | None:
    """The bound for a scalar, or None for a container."""
    if isinstance(value, str):
        if mode == "json":
            return _str_json_chars(value, ensure_ascii)
        if mode == "str" and top:
            return len(value)
        return _str_repr_chars(value)
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return int_chars(value)
    if isinstance(value, float):
        return _FLOAT_CHARS
    if isinstance(value, (bytes, bytearray)):
        return 4 * len(value) + 14
    return None


def size_bound(
    value: Any,
    limit: int,
    *,
    mode: Mode = "str",
    indent: int | None = None,
    item_sep: int = 2,
    key_sep: int = 2,
    ensure_ascii: bool = False,
) -> int:
    """Upper bound on the length of ``str(value)`` / ``repr(value)`` / ``json.dumps(value)``.

    Returns early with some number greater than ``limit`` once the bound passes it. For JSON,
    ``indent`` is the indent string's length (``None``: no newlines; 0: newlines only) and the
    separators' lengths are given.
    """
    scalar = _scalar_chars(value, mode, ensure_ascii, top=True)
    if scalar is not None:
        return scalar
    total = 0
    # Iterative walk: (object, depth). Input data may be deep; Python recursion is not used.
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        obj, depth = stack.pop()
        scalar = _scalar_chars(obj, mode, ensure_ascii, top=False)
        if scalar is not None:
            total += scalar
        else:
            children: Any
            pairs = False
            if isinstance(obj, Namespace):
                children = object.__getattribute__(obj, "_Namespace__attrs")
                total += 14
                pairs = True
            elif isinstance(obj, Mapping):
                children = obj
                pairs = True
                total += 2
            elif isinstance(obj, (list, tuple, set, frozenset, KeysView, ValuesView, ItemsView)):
                children = obj
                total += 20 if isinstance(obj, (frozenset, KeysView, ValuesView, ItemsView)) else 5
            else:
                total += _OPAQUE_CHARS
                children = ()
            per_item = (item_sep if mode == "json" else 2) + (
                0 if indent is None else 1 + indent * (depth + 1)
            )
            if indent is not None:
                total += 1 + indent * depth
            for child in children:
                total += per_item
                if pairs:
                    # JSON quotes non-string keys; repr separates with ": ".
                    total += key_sep + 2 if mode == "json" else 2
                    stack.append((child, depth + 1))
                    stack.append((children[child], depth + 1))
                else:
                    stack.append((child, depth + 1))
                if total > limit:
                    return total
        if total > limit:
            return total
    return total


# printf-style conversion specifiers, as CPython parses them. A mapping key with nested
# parentheses is not matched and makes the estimate refuse the format (a template never needs it).
_PRINTF = re.compile(
    r"%(?:\((?P<key>[^()]*)\))?[-+ #0]*(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+)?)?[hlL]?(?P<conv>.?)",
    re.S,
)


def _number(digits: str, max_width: int, what: str) -> int:
    if len(digits) > 9 or int(digits) > max_width:
        raise FormatRefused(f"{what} {digits[:12]} exceeds the limit of {max_width}")
    return int(digits)


def printf_bound(fmt: str, args: Any, *, limit: int, max_width: int, max_fields: int) -> int:
    """Upper bound on ``len(fmt % args)``; raises :class:`FormatRefused` for huge widths."""
    fields = fmt.count("%")
    if fields > 2 * max_fields:
        raise FormatRefused(f"the format has more than {max_fields} fields")
    if isinstance(args, tuple):
        positional: tuple[Any, ...] = args
        mapping: Any = None
    else:
        positional = (args,)
        mapping = args if isinstance(args, Mapping) else None
    total = len(fmt)
    index = 0
    for m in _PRINTF.finditer(fmt):
        conv = m.group("conv")
        if conv == "%":
            continue
        if conv == "(":
            raise FormatRefused("unsupported printf format (nested parentheses in a key)")
        if conv == "":
            return total  # Python raises "incomplete format"
        width = 0
        precision = 0
        if m.group("width") == "*":
            width = _star(positional, index, max_width, "width")
            index += 1
        elif m.group("width"):
            width = _number(m.group("width"), max_width, "format width")
        if m.group("prec") == "*":
            precision = _star(positional, index, max_width, "precision")
            index += 1
        elif m.group("prec"):
            precision = _number(m.group("prec"), max_width, "format precision")
        key = m.group("key")
        if key is not None:
            if mapping is None:
                return total  # Python raises "format requires a mapping"
            try:
                value = mapping[key]
            except Exception:
                return total  # Python raises the same lookup error before formatting it
        else:
            if index >= len(positional):
                return total  # "not enough arguments"
            value = positional[index]
            index += 1
        if conv in "sra":
            chars = size_bound(value, limit, mode="str" if conv == "s" else "repr")
        elif conv == "c":
            chars = 1
        elif isinstance(value, int):
            chars = max(int_chars(value), precision) + 2
        else:
            # Floats print at most 309 integer digits plus the precision.
            chars = 330 + precision
        total += max(width, chars)
        if total > limit:
            return total
    return total


def _star(positional: tuple[Any, ...], index: int, max_width: int, what: str) -> int:
    if index >= len(positional) or not isinstance(positional[index], int):
        raise FormatRefused(f"'*' {what} needs an integer argument")
    value = abs(positional[index])
    if value > max_width:
        raise FormatRefused(f"format {what} {value} exceeds the limit of {max_width}")
    return int(value)


# str.format specs: [[fill]align][sign][z][#][0][width][grouping][.precision][type]
_FORMAT_SPEC = re.compile(
    r"(?:.?[<>=^])?[-+ ]?z?#?0?(?P<width>\d*)[_,]?(?:\.(?P<prec>\d+))?[a-zA-Z%]?",
    re.S,
)


def check_format_spec(spec: str, max_width: int) -> int:
    """Check a ``str.format`` spec's width and precision; return the larger of the two."""
    if not spec:
        return 0
    m = _FORMAT_SPEC.fullmatch(spec)
    if m is None:
        raise FormatRefused(f"unsupported format spec {spec[:40]!r}")
    width = _number(m.group("width"), max_width, "format width") if m.group("width") else 0
    prec = _number(m.group("prec"), max_width, "format precision") if m.group("prec") else 0
    return max(width, prec)

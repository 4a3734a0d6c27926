"""Size-checked filters, methods and globals for the hardened chat-template sandbox.

Every filter is wrapped: it ticks the deadline, checks its sizing arguments (widths, counts,
separators) before the work is done, counts the items it pulls from an iterable as loop
iterations, and checks what it made afterwards. The same rules guard ``str``/``bytes``/``int``
methods called from templates, and the Hugging Face helpers (``tojson``, ``strftime_now``,
``raise_exception``) exist in a bounded form.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from datetime import datetime
from typing import Any, NoReturn

from jinja2.exceptions import TemplateError as JinjaTemplateError
from jinja2.filters import make_attrgetter, sync_do_join
from jinja2.runtime import Undefined
from jinja2.utils import pass_environment, pass_eval_context

from guard.errors import FormatRefused, TemplateError
from guard.jinja._meters import (
    CODE_RENDER_FAILED,
    RenderState,
    current_state,
    value_too_large,
)
from guard.jinja._sizes import printf_bound, size_bound

# Filters that are slow per character in pure Python (textwrap) get a smaller input cap.
_WORDWRAP_MAX_CHARS = 64 * 1024
# round(x, -10**9) makes Python compute 10**(10**9); nothing needs more digits than this.
_MAX_ROUND_DIGITS = 64
_STRFTIME_MAX_CHARS = 256
# strftime directives, with glibc's flags (`%-d`, `%_H`, `%^a`: no padding, space, upper case;
# chat templates use them for dates) but no widths ("%1000000000Y" pads in glibc).
_STRFTIME_FORMAT = re.compile(r"(?:[^%]|%[-_0^#]?[A-Za-z%])*", re.S)
# Filters with no bounded form here, unused by chat templates.
REMOVED_FILTERS = frozenset({"pprint", "urlize"})
# Filters that call str() on their value: bound that first.
_STRINGIFYING = frozenset(
    {
        "capitalize",
        "center",
        "e",
        "escape",
        "forceescape",
        "format",
        "indent",
        "lower",
        "replace",
        "safe",
        "string",
        "striptags",
        "title",
        "trim",
        "truncate",
        "upper",
        "urlencode",
        "wordcount",
        "wordwrap",
        "xmlattr",
    }
)
# Filters that iterate their value: each item pulled is a loop iteration.
_ITERATING = frozenset(
    {
        "batch",
        "groupby",
        "list",
        "map",
        "max",
        "min",
        "reject",
        "rejectattr",
        "select",
        "selectattr",
        "slice",
        "sort",
        "unique",
    }
)
_LINE_BREAKS = ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029")

PreCheck = Callable[[RenderState, Any, tuple[Any, ...], dict[str, Any]], None]


def _arg(
    args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str, default: Any
) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def check_text(state: RenderState, value: Any, what: str) -> None:
    """Refuse before ``str(value)`` if the text would be too long."""
    if type(value) is str:
        return
    limit = state.limits.max_value_chars
    state.check_chars(size_bound(value, limit), what)


def _format_refused(exc: FormatRefused, what: str) -> Exception:
    return value_too_large(f"{what}: {exc}")


# -- pre-checks of individual filters ---------------------------------------------------------


def _pre_center(state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    state.check_width(_arg(args, kw, 0, "width", 80), "center")


def _line_count(s: str) -> int:
    return sum(s.count(ch) for ch in _LINE_BREAKS) + 1


def _pre_indent(state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    width = _arg(args, kw, 0, "width", 4)
    if isinstance(width, str):
        state.check_width(len(width), "indent")
        per_line = len(width)
    elif isinstance(width, int):
        state.check_width(width, "indent")
        per_line = max(width, 0)
    else:
        return  # the filter raises TypeError itself
    text = value if isinstance(value, str) else str(value)
    state.check_chars(len(text) + 1 + _line_count(text) * (per_line + 1), "indent")


def _pre_format(state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    fmt = value if isinstance(value, str) else str(value)
    check_printf(state, fmt, kw or args, "format")


def check_printf(state: RenderState, fmt: str, args: Any, what: str) -> None:
    limits = state.limits
    try:
        bound = printf_bound(
            fmt,
            args,
            limit=limits.max_value_chars,
            max_width=limits.max_width,
            max_fields=limits.max_format_fields,
        )
    except FormatRefused as exc:
        raise _format_refused(exc, what) from None
    state.check_chars(bound, what)


def _pre_wordwrap(
    state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]
) -> None:
    text = value if isinstance(value, str) else str(value)
    if len(text) > _WORDWRAP_MAX_CHARS:
        raise value_too_large(
            f"wordwrap takes at most {_WORDWRAP_MAX_CHARS} characters; got {len(text)}"
        )
    wrapstring = _arg(args, kw, 2, "wrapstring", None)
    wrap_len = 2 if wrapstring is None else len(str(wrapstring)[: state.limits.max_width + 1])
    state.check_width(wrap_len, "wordwrap wrapstring")
    state.check_chars(len(text) + (len(text) + 1) * wrap_len, "wordwrap")


def _pre_replace(state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    old = _arg(args, kw, 0, "old", None)
    new = _arg(args, kw, 1, "new", None)
    count = _arg(args, kw, 2, "count", None)
    check_text(state, old, "replace")
    check_text(state, new, "replace")
    replace_bound(state, value if isinstance(value, str) else str(value), str(old), str(new), count)


def replace_bound(state: RenderState, s: Any, old: Any, new: Any, count: Any) -> None:
    """Refuse ``s.replace(old, new, count)`` (str or bytes) if the result would be too long."""
    try:
        occurrences = s.count(old) if len(old) else len(s) + 1
    except TypeError:
        return  # mismatched types: replace raises the same error
    if isinstance(count, int) and count >= 0:
        occurrences = min(occurrences, count)
    growth = occurrences * (len(new) - len(old))
    state.check_chars(len(s) + max(growth, 0), "replace")


def _pre_batch(state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    linecount = _arg(args, kw, 0, "linecount", None)
    fill_with = _arg(args, kw, 1, "fill_with", None)
    if fill_with is not None and isinstance(linecount, int):
        state.check_items(linecount, "batch")


def _pre_slice(state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    slices = _arg(args, kw, 0, "slices", None)
    if isinstance(slices, int) and slices > state.limits.max_width:
        raise value_too_large(f"slice into {slices} parts; the limit is {state.limits.max_width}")


def _pre_round(state: RenderState, value: Any, args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    precision = _arg(args, kw, 0, "precision", 0)
    if isinstance(precision, int) and abs(precision) > _MAX_ROUND_DIGITS:
        raise value_too_large(f"round precision {precision}; the limit is {_MAX_ROUND_DIGITS}")


_PRE_CHECKS: dict[str, PreCheck] = {
    "batch": _pre_batch,
    "center": _pre_center,
    "format": _pre_format,
    "indent": _pre_indent,
    "replace": _pre_replace,
    "round": _pre_round,
    "slice": _pre_slice,
    "wordwrap": _pre_wordwrap,
}


def _guard_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    pass_arg = getattr(fn, "jinja_pass_arg", None)
    offset = 0 if pass_arg is None else 1
    pre = _PRE_CHECKS.get(name)
    stringifies = name in _STRINGIFYING
    iterates = name in _ITERATING
    what = f"the {name} filter"

    def guarded(*args: Any, **kwargs: Any) -> Any:
        state = current_state()
        state.tick()
        value: Any = None
        if len(args) > offset:
            value = args[offset]
            rest = args[offset + 1 :]
            if stringifies:
                check_text(state, value, what)
            if pre is not None:
                pre(state, value, rest, kwargs)
            if iterates and value is not None and not isinstance(value, Undefined):
                args = (*args[:offset], state.counted(value), *rest)
        result = fn(*args, **kwargs)
        if result is not value:
            state.check_result(result, what)
        return result

    guarded.__name__ = f"guarded_{name}"
    guarded.__doc__ = fn.__doc__
    if pass_arg is not None:
        setattr(guarded, "jinja_pass_arg", pass_arg)  # noqa: B010 - Jinja reads this marker
    return guarded


# -- filters replaced outright ----------------------------------------------------------------


@pass_eval_context
def guarded_join(eval_ctx: Any, value: Any, d: Any = "", attribute: Any = None) -> str:
    """``join`` that sizes the result before joining."""
    state = current_state()
    state.tick()
    items = list(state.counted(value))
    if attribute is not None:
        getter = make_attrgetter(eval_ctx.environment, attribute)
        items = [getter(item) for item in items]
    limit = state.limits.max_value_chars
    total = size_bound(d, limit) * max(len(items) - 1, 0)
    state.check_chars(total, "the join filter")
    for item in items:
        total += size_bound(item, limit)
        state.check_chars(total, "the join filter")
    result: str = sync_do_join(eval_ctx, items, d)
    state.check_result(result, "the join filter")
    return result


def _require_number(value: Any) -> None:
    if not isinstance(value, (int, float)):
        raise TemplateError(
            CODE_RENDER_FAILED,
            f"the sum filter adds numbers only; got {type(value).__name__}",
        )


@pass_environment
def guarded_sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """``sum`` over numbers only (summing lists is quadratic)."""
    state = current_state()
    state.tick()
    _require_number(start)
    items: Any = state.counted(iterable)
    if attribute is not None:
        items = map(make_attrgetter(environment, attribute), items)
    total = sum(_numbers(items), start)
    state.check_result(total, "the sum filter")
    return total


def _numbers(items: Iterable[Any]) -> Iterator[Any]:
    for item in items:
        _require_number(item)
        yield item


def hf_tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Hugging Face's ``tojson`` (``json.dumps`` without HTML escaping), unbounded."""
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def guarded_tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """Hugging Face's ``tojson`` with the output sized before it is made."""
    state = current_state()
    state.tick()
    indent_len: int | None
    if indent is None:
        indent_len = None
    elif isinstance(indent, str):
        state.check_width(len(indent), "tojson indent")
        indent_len = len(indent)
    elif isinstance(indent, int):
        state.check_width(indent, "tojson indent")
        indent_len = max(indent, 0)
    elif not isinstance(x, (list, tuple, dict)):
        indent_len = None  # json.dumps never reads the indent of a scalar: plain Jinja renders it
    else:
        raise TemplateError(CODE_RENDER_FAILED, "tojson indent must be an integer or a string")
    if separators is not None:
        if not (
            isinstance(separators, (tuple, list))
            and len(separators) == 2
            and all(isinstance(s, str) for s in separators)
        ):
            raise TemplateError(CODE_RENDER_FAILED, "tojson separators must be two strings")
        item_sep, key_sep = (len(separators[0]), len(separators[1]))
        state.check_width(max(item_sep, key_sep), "tojson separator")
    else:
        item_sep, key_sep = (1 if indent is not None else 2), 2
    limit = state.limits.max_value_chars
    bound = size_bound(
        x,
        limit,
        mode="json",
        indent=indent_len,
        item_sep=item_sep,
        key_sep=key_sep,
        ensure_ascii=bool(ensure_ascii),
    )
    state.check_chars(bound, "the tojson filter")
    result = hf_tojson(x, ensure_ascii, indent, separators, sort_keys)
    state.check_result(result, "the tojson filter")
    return result


def guarded_filters(base: Mapping[str, Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """Jinja's default filters, each wrapped, with the unbounded ones replaced or removed."""
    filters = {
        name: _guard_filter(name, fn) for name, fn in base.items() if name not in REMOVED_FILTERS
    }
    filters["join"] = guarded_join
    filters["sum"] = guarded_sum
    filters["tojson"] = guarded_tojson
    return filters


# -- globals ----------------------------------------------------------------------------------


class TemplateRaised(JinjaTemplateError):
    """The template called ``raise_exception(message)`` (Hugging Face's helper)."""


def raise_exception(message: Any) -> NoReturn:
    raise TemplateRaised(str(message)[:1000])


def hf_strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def guarded_strftime_now(format: Any) -> str:
    if (
        not isinstance(format, str)
        or len(format) > _STRFTIME_MAX_CHARS
        or _STRFTIME_FORMAT.fullmatch(format) is None
    ):
        raise value_too_large(
            f"strftime_now takes a format of at most {_STRFTIME_MAX_CHARS} characters with "
            "%-directives and their flags (no widths)"
        )
    return hf_strftime_now(format)


def guarded_range(*args: Any) -> range:
    state = current_state()
    state.tick()
    rng = range(*args)
    try:
        n = len(rng)
    except OverflowError:
        n = state.limits.max_range + 1
    if n > state.limits.max_range:
        raise value_too_large(
            f"range of {n} items; the hardened sandbox allows {state.limits.max_range}"
        )
    return rng


# -- methods called from templates ------------------------------------------------------------


def _method_width(state: RenderState, obj: Any, args: tuple[Any, ...], name: str) -> None:
    width = args[0] if args else None
    if isinstance(width, int) and width > len(obj):
        state.check_width(width, name)


def check_method_call(
    state: RenderState, fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[tuple[Any, ...], bool]:
    """Check a call of a ``str``/``bytes``/``int``/container method before it runs.

    Returns the (possibly materialised) positional arguments and whether the result is a new
    value to be charged.
    """
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", None)
    if owner is None or not isinstance(name, str):
        return args, False
    if isinstance(owner, (str, bytes)):
        if name in ("center", "ljust", "rjust", "zfill"):
            _method_width(state, owner, args, name)
        elif name == "expandtabs":
            tabsize = _arg(args, kwargs, 0, "tabsize", 8)
            if isinstance(tabsize, int):
                state.check_width(tabsize, name)
                tab: Any = "\t" if isinstance(owner, str) else b"\t"
                state.check_chars(len(owner) + owner.count(tab) * max(tabsize, 0), name)
        elif name == "replace":
            replace_bound(
                state,
                owner,
                _arg(args, kwargs, 0, "old", ""),
                _arg(args, kwargs, 1, "new", ""),
                _arg(args, kwargs, 2, "count", -1),
            )
        elif name == "join":
            items = list(state.counted(args[0])) if args else []
            total = len(owner) * max(len(items) - 1, 0)
            state.check_chars(total, name)
            for item in items:
                if isinstance(item, (str, bytes)):
                    total += len(item)
                    state.check_chars(total, name)
            args = (items, *args[1:])
        elif name == "translate" and isinstance(owner, str) and args:
            state.check_chars(len(owner) * _translate_factor(state, args[0]), name)
        return args, True
    if isinstance(owner, (int, float)):  # bool too: True.to_bytes(10**9) allocates
        if name == "to_bytes":
            length = _arg(args, kwargs, 0, "length", 1)
            if isinstance(length, int):
                state.check_chars(length, name)
        return args, True
    if isinstance(owner, (dict, list, tuple)) or owner is dict or owner is list:
        if name == "fromkeys" and args and isinstance(args[0], Sized):
            state.check_items(len(args[0]), name)
        return args, name in ("copy", "fromkeys")
    return args, False


def _translate_factor(state: RenderState, table: Any) -> int:
    """The longest replacement in a ``str.translate`` table (each character maps to one)."""
    if isinstance(table, Mapping):
        values: Any = table.values()
    elif isinstance(table, (list, tuple)):
        values = table
    else:
        return 1
    state.check_items(len(values), "translate")
    longest = 1
    for v in values:
        if isinstance(v, str) and len(v) > longest:
            longest = len(v)
    return longest

"""A JSON-schema constraint checked (:func:`check_schema`), given as an object or as JSON text
(:func:`parse_json_text`: size-capped, duplicate keys and non-finite numbers refused)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any, NoReturn

from guard.errors import GuardError
from guard.guided._budget import ParamPath, RequestBudget, refuse, refuse_invalid
from guard.guided.schema._walk import exact_schema_walk, fast_schema_walk

__all__ = ["check_schema", "parse_json_text"]


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("duplicate key")
    return out


def _bounded_int(text: str) -> int:
    if len(text) > 20:
        raise ValueError("integer too long")
    return int(text)


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("non-finite number")
    return value


def _reject_constant(_: str) -> NoReturn:
    raise ValueError("non-finite number")


def parse_json_text(ctx: RequestBudget, text: str, path: ParamPath) -> Any:
    """Parse a schema sent as a JSON string; size-capped, and the C parser raises
    RecursionError (not a crash) on deep nesting."""
    if ctx.chars_over(len(text)):
        ctx.too_many_chars(path)
    try:
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_int=_bounded_int,
            parse_float=_finite_float,
            parse_constant=_reject_constant,
        )
    except RecursionError:
        refuse(
            "guided_schema_too_deep",
            f"JSON nested deeper than {ctx.limits.max_schema_depth} levels",
            path,
        )
    except (ValueError, TypeError):
        refuse_invalid("guided_schema_invalid", "the schema string is not valid JSON", path)


def check_schema(ctx: RequestBudget, value: Any, path: ParamPath) -> None:
    """Check one schema constraint (an object, a boolean or JSON text; None: absent) against
    the request's budget; a plain schema's facts go to ``ctx.facts`` for the backend checks."""
    if value is None:
        return
    ctx.schemas += 1
    if ctx.schemas > ctx.limits.max_schemas:
        refuse("guided_schema_too_large", f"more than {ctx.limits.max_schemas} schemas", path)
    if isinstance(value, str):
        value = parse_json_text(ctx, value, path)
    if not (isinstance(value, Mapping | bool)):
        refuse_invalid("guided_schema_invalid", "a schema must be an object or a boolean", path)
    if isinstance(value, bool):
        if ctx.nodes_over(1):
            ctx.too_many_nodes(path)
        return
    saved = ctx.snapshot()
    try:
        facts = fast_schema_walk(ctx, value, path)
    except GuardError:
        facts = None
    if facts is None:
        # Something is wrong (or unusual): the exact walk finds the first problem in order.
        ctx.restore(saved)
        exact_schema_walk(ctx, value, path)
    elif ctx.facts is not None:
        ctx.facts[id(value)] = (value, facts)

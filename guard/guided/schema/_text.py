"""A JSON schema sent as JSON text, parsed under the request's budget: size-capped, duplicate
keys and non-finite numbers refused, deep nesting a refusal rather than a crash."""

from __future__ import annotations

import json
import math
from typing import Any, NoReturn

from guard.guided._budget import ParamPath, RequestBudget, refuse, refuse_invalid

__all__ = ["parse_json_text"]


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

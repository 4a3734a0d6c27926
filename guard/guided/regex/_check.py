"""A regex constraint checked: length, the request's regex budget, the structural scan
(:mod:`._scan`), then RE2 under a memory cap (:mod:`._re2`): what RE2 refuses is refused."""

from __future__ import annotations

from typing import Any

from guard.errors import RegexRejected
from guard.guided._budget import ParamPath, RequestBudget, refuse, refuse_invalid
from guard.guided.regex._re2 import re2_program_size
from guard.guided.regex._scan import UNSAFE, scan_regex

__all__ = ["check_regex"]


def check_regex(ctx: RequestBudget, pattern: Any, path: ParamPath) -> None:
    limits = ctx.limits
    if not isinstance(pattern, str):
        refuse_invalid("guided_regex_invalid", "a regex must be a string", path)
    if len(pattern) > limits.max_regex_length:
        refuse(
            "guided_regex_too_long",
            f"regex longer than {limits.max_regex_length} characters",
            path,
        )
    ctx.regexes += 1
    if ctx.regexes > limits.max_regexes:
        refuse("guided_regex_unsafe", f"more than {limits.max_regexes} regexes", path)
    ctx.regex_chars += len(pattern)
    if ctx.regex_chars > limits.max_regex_total_length:
        refuse(
            "guided_regex_too_long",
            f"regexes in the request exceed {limits.max_regex_total_length} characters",
            path,
        )
    # Budgets count every occurrence; the work is done once per distinct pattern (tools often
    # repeat the same ones).
    known = ctx.regex_sizes.get(pattern)
    try:
        scan_size = known if known is not None else scan_regex(pattern, ctx.limits).est_program_size
        ctx.regex_program += scan_size
        if ctx.regex_program > limits.max_regex_total_program_size:
            refuse(
                "guided_regex_unsafe",
                "regexes in the request would compile to more than "
                f"{limits.max_regex_total_program_size} instructions",
                path,
            )
        if known is None:
            re2_program_size(
                pattern,
                max_mem=limits.re2_max_mem,
                max_program_size=limits.max_regex_program_size,
            )
            ctx.regex_sizes[pattern] = scan_size
    except RegexRejected as e:
        if e.code == UNSAFE:
            refuse(e.code, e.message, path)
        refuse_invalid(e.code, e.message, path)

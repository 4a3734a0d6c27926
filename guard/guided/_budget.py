"""What the guided-decoding constraints of one request may add up to, and how a refusal names
the field it is about.

:class:`RequestBudget` holds the policy's limits and the counters every constraint in a body
adds to (regexes: count, characters, estimated program size; schemas: count, nodes, characters,
``$ref``), shared by the regex, schema and grammar checks. :func:`refuse` and
:func:`refuse_invalid` raise the refusals, with ``param`` the field's path
(``a.b[0]["odd key"]``).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, NoReturn

from guard.errors import GuardError, LimitExceeded
from guard.guided._limits import GuidedLimits

if TYPE_CHECKING:
    from guard.guided.schema import Memo

__all__ = ["ParamPath", "RequestBudget", "fmt_param", "refuse", "refuse_invalid"]

ParamPath = tuple[str | int, ...]
_IDENT = re.compile(r"[A-Za-z0-9_$\-]{1,40}")
_MAX_PATH = 300


def fmt_param(path: ParamPath) -> str:
    """``a.b[0]["odd key"]``; keys are cut to 40 characters and the path to 300."""
    out: list[str] = []
    for part in path:
        if isinstance(part, int):
            out.append(f"[{part}]")
        elif _IDENT.fullmatch(part):
            out.append(f".{part}" if out else part)
        else:
            label = part if len(part) <= 40 else part[:40] + "..."
            out.append("[" + json.dumps(label) + "]")
    text = "".join(out)
    if len(text) > _MAX_PATH:
        text = text[: _MAX_PATH // 2 - 2] + "..." + text[-(_MAX_PATH // 2 - 2) :]
    return text


def refuse(code: str, message: str, path: ParamPath) -> NoReturn:
    raise LimitExceeded(code, message, param=fmt_param(path))


def refuse_invalid(code: str, message: str, path: ParamPath) -> NoReturn:
    raise GuardError(code, message, param=fmt_param(path))


class RequestBudget:
    """Per-request counters shared by every constraint in the body."""

    def __init__(self, limits: GuidedLimits, facts: Memo | None = None) -> None:
        self.limits = limits
        self.facts = facts  # schema facts gathered on the way, for the backend checks
        self.regexes = 0
        self.regex_chars = 0
        self.regex_program = 0
        self.regex_sizes: dict[str, int] = {}  # accepted pattern -> estimated program size
        self.schemas = 0
        self.schema_nodes = 0
        self.schema_chars = 0
        self.refs = 0

    # The counters, to undo a fast walk that gave up. ``regex_sizes`` is not saved: what a
    # fast walk adds to it is what the exact walk would find (a pattern's size).
    def snapshot(self) -> tuple[int, ...]:
        return (
            self.regexes,
            self.regex_chars,
            self.regex_program,
            self.schema_nodes,
            self.schema_chars,
            self.refs,
        )

    def restore(self, saved: tuple[int, ...]) -> None:
        (
            self.regexes,
            self.regex_chars,
            self.regex_program,
            self.schema_nodes,
            self.schema_chars,
            self.refs,
        ) = saved

    # The path is built only when a limit is crossed: walks call these once per node.
    def nodes_over(self, n: int) -> bool:
        self.schema_nodes += n
        return self.schema_nodes > self.limits.max_schema_nodes

    def chars_over(self, n: int) -> bool:
        self.schema_chars += n
        return self.schema_chars > self.limits.max_schema_chars

    def too_many_nodes(self, path: ParamPath) -> NoReturn:
        refuse(
            "guided_schema_too_large",
            f"JSON schemas in the request exceed {self.limits.max_schema_nodes} nodes",
            path,
        )

    def too_many_chars(self, path: ParamPath) -> NoReturn:
        refuse(
            "guided_schema_too_large",
            f"JSON schemas in the request exceed {self.limits.max_schema_chars} characters",
            path,
        )

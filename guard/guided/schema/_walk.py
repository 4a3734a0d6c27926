"""Guided-decoding constraints checked before an upstream compiles them.

Regexes, JSON schemas, grammars and choice lists in a request become automata or grammars inside
the upstream (xgrammar, outlines, llguidance, llama.cpp's GBNF parser). Building those can burn
CPU, exhaust memory or overflow a native stack, so this module refuses, in time linear in the
request, anything over explicit limits:

- regexes (``guided_regex``, ``structured_outputs.regex``, whitespace patterns, JSON-schema
  ``pattern`` and ``patternProperties`` keys): a length cap, a structural scan for nesting,
  repetition products and ambiguous nested repetition (:mod:`guard.guided.regex._scan`), then RE2
  under a memory cap (:mod:`guard.guided.regex._re2`): what RE2 refuses is refused;
- JSON schemas (``response_format``, ``guided_json``, ``structured_outputs.json``, tool and
  function ``parameters``, ...): walked iteratively with caps on depth, nodes, characters,
  ``$ref`` count, ``$ref`` expansion (size and depth, so no billion laughs) and recursion,
  ``enum`` size and the numbers that drive grammar size (``maxLength``, ``minItems``, ...);
- grammars (llama.cpp ``grammar``, ``guided_grammar``, ``structured_outputs.grammar``, SGLang
  ``ebnf``): length, nesting (llama.cpp recurses once per group), rule count, ``{m,n}``
  repetition, and a nullable body under ``*`` / ``+`` (llama.cpp issue 18988), see
  :mod:`guard.guided.grammar._scan`; the ``grammar`` field (llama-cpp-python's) is also parsed
  as llama.cpp parses it (:mod:`guard.guided.grammar._gbnf`): what it refuses crashes the server;
- choice lists (``guided_choice``, ``structured_outputs.choice``): count and total characters;
- the same inside structural tags, TGI's ``grammar`` object, the Responses API's
  ``text.format`` and custom tools' ``format``.

Codes: ``guided_regex_{too_long,invalid,unsafe}``, ``guided_schema_{too_deep,too_large,
invalid}``, ``guided_grammar_{too_deep,too_large,unsafe,invalid}``,
``guided_choice_{too_large,invalid}``, ``guided_schema_grammar_{invalid,too_large}`` (the
grammar llama-cpp-python makes of a schema, :mod:`guard.guided.grammar._llamacpp`); ``*_invalid`` is a :class:`~guard.errors.GuardError`,
the rest :class:`~guard.errors.LimitExceeded`, all HTTP 400.

Everything is a pure function of (request body, :class:`~guard.guided.GuidedLimits`); refusals carry a stable
code and a ``param`` naming the field, and never quote attacker-sized text.
"""

from __future__ import annotations

import bisect
import json
import math
import re
from collections.abc import Mapping
from typing import Any, NoReturn
from urllib.parse import unquote

from guard.errors import GuardError, LimitExceeded, RegexRejected
from guard.guided._limits import GuidedLimits
from guard.guided.grammar import (
    GbnfLimits,
    llama_cpp_schemas,
    parse_gbnf,
    scan_gbnf,
    scan_nesting,
    schema_grammar_problem,
)
from guard.guided.regex import UNSAFE, re2_program_size, scan_regex
from guard.guided.schema import BOUND_SKIP, FACT_KEYS, Memo, SchemaFacts, add_node, bound_here

__all__ = ["check_guided_decoding"]


# ---- errors and parameter paths --------------------------------------------------------------

_Path = tuple[str | int, ...]
_IDENT = re.compile(r"[A-Za-z0-9_$\-]{1,40}")
_MAX_PATH = 300


def _fmt(path: _Path) -> str:
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


def _limit(code: str, message: str, path: _Path) -> NoReturn:
    raise LimitExceeded(code, message, param=_fmt(path))


def _invalid(code: str, message: str, path: _Path) -> NoReturn:
    raise GuardError(code, message, param=_fmt(path))


class _Ctx:
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

    def too_many_nodes(self, path: _Path) -> NoReturn:
        _limit(
            "guided_schema_too_large",
            f"JSON schemas in the request exceed {self.limits.max_schema_nodes} nodes",
            path,
        )

    def too_many_chars(self, path: _Path) -> NoReturn:
        _limit(
            "guided_schema_too_large",
            f"JSON schemas in the request exceed {self.limits.max_schema_chars} characters",
            path,
        )


# ---- regexes ---------------------------------------------------------------------------------


def _check_regex(ctx: _Ctx, pattern: Any, path: _Path) -> None:
    limits = ctx.limits
    if not isinstance(pattern, str):
        _invalid("guided_regex_invalid", "a regex must be a string", path)
    if len(pattern) > limits.max_regex_length:
        _limit(
            "guided_regex_too_long",
            f"regex longer than {limits.max_regex_length} characters",
            path,
        )
    ctx.regexes += 1
    if ctx.regexes > limits.max_regexes:
        _limit("guided_regex_unsafe", f"more than {limits.max_regexes} regexes", path)
    ctx.regex_chars += len(pattern)
    if ctx.regex_chars > limits.max_regex_total_length:
        _limit(
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
            _limit(
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
            _limit(e.code, e.message, path)
        _invalid(e.code, e.message, path)


# ---- JSON text embedded in a string ------------------------------------------------------------


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


def _parse_json_text(ctx: _Ctx, text: str, path: _Path) -> Any:
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
        _limit(
            "guided_schema_too_deep",
            f"JSON nested deeper than {ctx.limits.max_schema_depth} levels",
            path,
        )
    except (ValueError, TypeError):
        _invalid("guided_schema_invalid", "the schema string is not valid JSON", path)


# ---- JSON schemas ------------------------------------------------------------------------------

# What a walked value is: a schema, a map or list of schemas, or plain data (counted only).
_SCHEMA, _MAP, _LIST, _PATTERN_MAP, _DEPS, _DATA = range(6)

_SCHEMA_KEYWORDS = frozenset(
    {
        "additionalProperties",
        "additionalItems",
        "contains",
        "not",
        "if",
        "then",
        "else",
        "propertyNames",
        "unevaluatedItems",
        "unevaluatedProperties",
        "contentSchema",
    }
)
_MAP_KEYWORDS = frozenset({"properties", "$defs", "definitions", "dependentSchemas"})
_LIST_KEYWORDS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_LENGTH_KEYWORDS = frozenset({"minLength", "maxLength"})
_COUNT_KEYWORDS = frozenset(
    {"minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"}
)
_NUMBER_KEYWORDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}
)
_REF_KEYWORDS = frozenset({"$ref", "$dynamicRef", "$recursiveRef"})
_BOOL_TARGET = -2
# What _lookup returns for a $ref it cannot resolve, and the message each gets.
_REF_NOT_LOCAL, _REF_ANCHOR, _REF_UNRESOLVED = -3, -4, -5
_REF_ERRORS = {
    _REF_NOT_LOCAL: "only local $ref values ('#' or '#/...') are allowed",
    _REF_ANCHOR: "$ref anchors are not supported",
    _REF_UNRESOLVED: "$ref does not resolve to a schema",
}


def _is_list(value: Any) -> bool:
    return isinstance(value, list | tuple)


class _SchemaWalk:
    """One schema, walked with an explicit stack; containers get pre-order indices so that a
    subtree is an index interval (used to expand ``$ref`` without materialising anything)."""

    def __init__(self, ctx: _Ctx, root: Any, path: _Path) -> None:
        self.ctx = ctx
        self.limits = ctx.limits
        self.root = root
        self.path = path
        self.parent: list[int] = []
        self.label: list[str | int] = []
        self.depth: list[int] = []
        self.count: list[int] = []  # the container plus its scalar children
        self.schema_index: dict[int, int] = {}  # id(schema object) -> index
        self.refs: list[tuple[int, str, str]] = []  # (site index, ref, keyword)
        self.patterns: list[tuple[int, str, str]] = []  # (index, label, pattern)

    def path_of(self, idx: int, *extra: str | int) -> _Path:
        parts: list[str | int] = []
        while idx > 0:
            parts.append(self.label[idx])
            idx = self.parent[idx]
        parts.reverse()
        return self.path + tuple(parts) + extra

    def run(self) -> None:
        self._walk()
        self._expand_refs()
        for idx, label, pattern in self.patterns:
            _check_regex(self.ctx, pattern, self.path_of(idx, label))

    # -- the walk ------------------------------------------------------------------------------

    def _walk(self) -> None:
        limits = self.limits
        ctx = self.ctx
        stack: list[tuple[Any, int, str | int, int, int]] = [(self.root, -1, "", 1, _SCHEMA)]
        while stack:
            node, parent, label, depth, role = stack.pop()
            if ctx.nodes_over(1):
                ctx.too_many_nodes(self.path if parent < 0 else self.path_of(parent, label))
            is_map = isinstance(node, Mapping)
            if not (is_map or _is_list(node)):
                self._scalar(node, parent, label, role)
                continue
            idx = len(self.parent)
            self.parent.append(parent)
            self.label.append(label)
            self.depth.append(depth)
            self.count.append(1)
            if depth > limits.max_schema_depth:
                _limit(
                    "guided_schema_too_deep",
                    f"schema nested deeper than {limits.max_schema_depth} levels",
                    self.path_of(idx),
                )
            # Every value on the stack is charged when popped: refuse a container whose
            # children cannot all fit before copying or pushing any of them.
            if ctx.schema_nodes + len(stack) + len(node) > limits.max_schema_nodes:
                ctx.too_many_nodes(self.path_of(idx))
            if role == _SCHEMA:
                if not is_map:
                    _invalid(
                        "guided_schema_invalid",
                        "a schema must be an object or a boolean",
                        self.path_of(idx),
                    )
                self.schema_index[id(node)] = idx
                self._schema(node, idx, depth, stack)
            elif role == _DATA:
                items = node.items() if is_map else enumerate(node)
                for key, value in reversed(list(items)):
                    if isinstance(key, str) and ctx.chars_over(len(key)):
                        ctx.too_many_chars(self.path_of(idx))
                    label = key if isinstance(key, str | int) else "?"
                    stack.append((value, idx, label, depth + 1, _DATA))
            elif role == _LIST:
                if is_map:
                    _invalid(
                        "guided_schema_invalid", "expected a list of schemas", self.path_of(idx)
                    )
                for i in range(len(node) - 1, -1, -1):
                    stack.append((node[i], idx, i, depth + 1, _SCHEMA))
            else:  # _MAP, _PATTERN_MAP, _DEPS: objects whose values are schemas
                if not is_map:
                    _invalid("guided_schema_invalid", "expected an object", self.path_of(idx))
                for key, value in reversed(list(node.items())):
                    if not isinstance(key, str):
                        _invalid("guided_schema_invalid", "keys must be strings", self.path_of(idx))
                    if ctx.chars_over(len(key)):
                        ctx.too_many_chars(self.path_of(idx))
                    if role == _PATTERN_MAP:
                        self.patterns.append((idx, key, key))
                    child_role = _DATA if role == _DEPS and _is_list(value) else _SCHEMA
                    stack.append((value, idx, key, depth + 1, child_role))

    def _scalar(self, node: Any, parent: int, label: str | int, role: int) -> None:
        if parent >= 0:
            self.count[parent] += 1
        if isinstance(node, str) and self.ctx.chars_over(len(node)):
            self.ctx.too_many_chars(self.path_of(parent, label) if parent >= 0 else self.path)
        if role == _SCHEMA and not isinstance(node, bool):
            path = self.path if parent < 0 else self.path_of(parent, label)
            _invalid("guided_schema_invalid", "a schema must be an object or a boolean", path)
        if role in (_MAP, _PATTERN_MAP, _DEPS, _LIST):
            _invalid(
                "guided_schema_invalid",
                "expected an object" if role != _LIST else "expected a list of schemas",
                self.path_of(parent, label),
            )

    def _schema(
        self,
        node: Mapping[Any, Any],
        idx: int,
        depth: int,
        stack: list[tuple[Any, int, str | int, int, int]],
    ) -> None:
        limits = self.limits
        for key, value in reversed(list(node.items())):
            if not isinstance(key, str):
                _invalid("guided_schema_invalid", "keys must be strings", self.path_of(idx))
            if self.ctx.chars_over(len(key)):
                self.ctx.too_many_chars(self.path_of(idx))
            role = _DATA
            if key == "pattern":
                if not isinstance(value, str):
                    _invalid(
                        "guided_regex_invalid", "a regex must be a string", self.path_of(idx, key)
                    )
                self.patterns.append((idx, key, value))
            elif key == "patternProperties":
                role = _PATTERN_MAP
            elif key in _MAP_KEYWORDS:
                role = _MAP
            elif key == "dependencies":
                role = _DEPS
            elif key == "items":
                role = _LIST if _is_list(value) else _SCHEMA
            elif key in _LIST_KEYWORDS:
                role = _LIST
            elif key in _SCHEMA_KEYWORDS:
                role = _SCHEMA
            elif key in _REF_KEYWORDS:
                if not isinstance(value, str):
                    _invalid(
                        "guided_schema_invalid", "$ref must be a string", self.path_of(idx, key)
                    )
                self.refs.append((idx, value, key))
            elif key == "enum":
                if not _is_list(value):
                    _invalid("guided_schema_invalid", "enum must be a list", self.path_of(idx, key))
                if len(value) > limits.max_schema_enum:
                    _limit(
                        "guided_schema_too_large",
                        f"enum with more than {limits.max_schema_enum} values",
                        self.path_of(idx, key),
                    )
            elif key in _LENGTH_KEYWORDS:
                self._bound(value, limits.max_schema_length_bound, idx, key)
            elif key in _COUNT_KEYWORDS:
                self._bound(value, limits.max_schema_items_bound, idx, key)
            elif key in _NUMBER_KEYWORDS:
                self._number(value, idx, key)
            stack.append((value, idx, key, depth + 1, role))

    def _bound(self, value: Any, cap: int, idx: int, key: str) -> None:
        """A count that grammar compilers unroll (``maxLength`` 10**9 becomes 10**9 states)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            _invalid("guided_schema_invalid", f"{key} must be a number", self.path_of(idx, key))
        if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
            _invalid("guided_schema_invalid", f"{key} must be an integer", self.path_of(idx, key))
        if value < 0:
            _invalid("guided_schema_invalid", f"{key} must not be negative", self.path_of(idx, key))
        if value > cap:
            _limit(
                "guided_schema_too_large", f"{key} above the limit of {cap}", self.path_of(idx, key)
            )

    def _number(self, value: Any, idx: int, key: str) -> None:
        if isinstance(value, bool) and key in ("exclusiveMinimum", "exclusiveMaximum"):
            return  # draft 4 spells these as booleans
        if isinstance(value, bool) or not isinstance(value, int | float):
            _invalid("guided_schema_invalid", f"{key} must be a number", self.path_of(idx, key))
        if isinstance(value, float) and not math.isfinite(value):
            _invalid("guided_schema_invalid", f"{key} must be finite", self.path_of(idx, key))
        if abs(value) > self.limits.max_schema_number:
            _limit(
                "guided_schema_too_large",
                f"{key} beyond ±{self.limits.max_schema_number:g}",
                self.path_of(idx, key),
            )
        if key == "multipleOf" and value <= 0:
            _invalid("guided_schema_invalid", "multipleOf must be positive", self.path_of(idx, key))

    # -- $ref ----------------------------------------------------------------------------------

    def _resolve(self, ref: str, site: int, key: str, resolved: dict[str, int]) -> int:
        """The index of the schema ``ref`` names (``resolved`` caches it by the ref's text: a
        ref bomb repeats a few refs many times); the error's path is built only on failure."""
        target = resolved.get(ref)
        if target is None:
            target = self._lookup(ref)
            if target in _REF_ERRORS:
                _invalid("guided_schema_invalid", _REF_ERRORS[target], self.path_of(site, key))
            resolved[ref] = target
        return target

    def _lookup(self, ref: str) -> int:
        """The index of the schema ``ref`` names, or a negative key of ``_REF_ERRORS``."""
        if not ref.startswith("#"):
            return _REF_NOT_LOCAL
        if ref == "#":
            return 0
        if not ref.startswith("#/"):
            return _REF_ANCHOR
        node: Any = self.root
        tokens = ref[2:].split("/", self.limits.max_schema_depth + 1)
        if len(tokens) > self.limits.max_schema_depth:
            return _REF_UNRESOLVED
        for raw in tokens:
            token = unquote(raw).replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and token in node:
                node = node[token]
            elif _is_list(node) and token.isdigit() and len(token) < 10 and int(token) < len(node):
                node = node[int(token)]
            else:
                return _REF_UNRESOLVED
        if isinstance(node, bool):
            return _BOOL_TARGET
        return self.schema_index.get(id(node), _REF_UNRESOLVED)

    def _expand_refs(self) -> None:
        """Size and depth of the schema with every $ref inlined, by dynamic programming over the
        (small) graph of ref targets; a cycle is infinite expansion."""
        limits = self.limits
        if not self.parent:
            return
        end, total, deepest = self._subtrees()
        if not self.refs:
            return
        self.ctx.refs += len(self.refs)
        if self.ctx.refs > limits.max_schema_refs:
            site, _, key = self.refs[0]
            _limit(
                "guided_schema_too_large",
                f"more than {limits.max_schema_refs} $ref in the request",
                self.path_of(site, key),
            )
        resolved: dict[str, int] = {}
        targets = [self._resolve(ref, site, key, resolved) for site, ref, key in self.refs]
        size, span = self._expanded(targets, end, total, deepest)
        if self.ctx.nodes_over(size - total[0]):
            _limit(
                "guided_schema_too_large",
                f"JSON schemas exceed {limits.max_schema_nodes} nodes once $ref is expanded",
                self.path,
            )
        if span > limits.max_schema_depth:
            _limit(
                "guided_schema_too_deep",
                f"schema nested deeper than {limits.max_schema_depth} levels once $ref is expanded",
                self.path,
            )

    def _subtrees(self) -> tuple[list[int], list[int], list[int]]:
        """Per node: the end of its subtree's interval, its node count and its deepest level
        (children come after their parents, so one backward pass sums them)."""
        n = len(self.parent)
        end = list(range(1, n + 1))
        total = list(self.count)
        deepest = list(self.depth)
        for i in range(n - 1, 0, -1):
            p = self.parent[i]
            if end[i] > end[p]:
                end[p] = end[i]
            total[p] += total[i]
            if deepest[i] > deepest[p]:
                deepest[p] = deepest[i]
        return end, total, deepest

    def _expanded(
        self, targets: list[int], end: list[int], total: list[int], deepest: list[int]
    ) -> tuple[int, int]:
        """The root's node count and depth with every $ref inlined (both capped just past the
        limit), by an iterative DFS over ref targets; refuses a recursive $ref unless allowed."""
        limits = self.limits
        sites = [site for site, _, _ in self.refs]  # ascending: recorded in pre-order
        cap = limits.max_schema_nodes + 1
        size: dict[int, int] = {}
        span: dict[int, int] = {}
        state: dict[int, int] = {0: 1}  # 1: on the DFS path, 2: done
        stack: list[tuple[int, int]] = [(0, bisect.bisect_left(sites, 0))]
        while stack:
            node, pos = stack[-1]
            stop = bisect.bisect_left(sites, end[node])
            if pos < stop:
                stack[-1] = (node, pos + 1)
                child = targets[pos]
                if child == _BOOL_TARGET or state.get(child) == 2:
                    continue
                if state.get(child) == 1:
                    if limits.allow_recursive_refs:
                        continue
                    site, _, key = self.refs[pos]
                    _limit(
                        "guided_schema_too_deep",
                        "recursive $ref (the schema would expand without end)",
                        self.path_of(site, key),
                    )
                state[child] = 1
                stack.append((child, bisect.bisect_left(sites, child)))
                continue
            stack.pop()
            state[node] = 2
            s = total[node]
            d = deepest[node] - self.depth[node] + 1
            for k in range(bisect.bisect_left(sites, node), stop):
                child = targets[k]
                if child == _BOOL_TARGET:
                    child_size, child_depth = 1, 1
                elif child in size:
                    child_size, child_depth = size[child], span[child]
                else:
                    continue  # a back edge, allowed by policy: counted once
                s = min(s + child_size, cap)
                d = max(d, self.depth[sites[k]] - self.depth[node] + child_depth)
            size[node], span[node] = s, min(d, cap)
        return size[0], span[0]


# Roles of a schema object's keywords in the fast walk (the exact walk's _schema, as a table).
_K_PATTERN, _K_REF, _K_ENUM, _K_LENGTH, _K_COUNT, _K_NUMBER, _K_ITEMS = range(10, 17)
_KEY_ROLE: dict[str, int] = {
    "pattern": _K_PATTERN,
    "patternProperties": _PATTERN_MAP,
    "dependencies": _DEPS,
    "items": _K_ITEMS,
    "enum": _K_ENUM,
    **{k: _MAP for k in _MAP_KEYWORDS},
    **{k: _LIST for k in _LIST_KEYWORDS},
    **{k: _SCHEMA for k in _SCHEMA_KEYWORDS},
    **{k: _K_REF for k in _REF_KEYWORDS},
    **{k: _K_LENGTH for k in _LENGTH_KEYWORDS},
    **{k: _K_COUNT for k in _COUNT_KEYWORDS},
    **{k: _K_NUMBER for k in _NUMBER_KEYWORDS},
}


def _bound_ok(value: Any, cap: int) -> bool:
    t = type(value)
    if t is int:
        return bool(0 <= value <= cap)
    if t is float:
        return bool(math.isfinite(value) and value == int(value) and 0 <= value <= cap)
    return False


def _number_ok(value: Any, key: str, limit: float) -> bool:
    t = type(value)
    if t is bool:
        return key in ("exclusiveMinimum", "exclusiveMaximum")
    if t is not int and not (t is float and math.isfinite(value)):
        return False
    return abs(value) <= limit and not (key == "multipleOf" and value <= 0)


def _fast_schema(ctx: _Ctx, root: Mapping[str, Any], path: _Path) -> SchemaFacts | None:
    """The schema check of a plain JSON schema (dicts, lists and scalars) in one walk that also
    gathers its :class:`~guard.guided.schema._facts.SchemaFacts`; None at the first sign of a
    problem (then nothing it counted stands: the caller restores the counters and runs the
    exact walk, which reports the first problem in document order).

    Same counts as :class:`_SchemaWalk` (every value is a node, every key and string counts
    its characters), but scalars are counted where their container is read instead of being
    pushed, and objects are visited children last-first (the order the cost estimates add
    up their terms); a schema that passes gets the same counters either way."""
    if type(root) is not dict:
        return None
    limits = ctx.limits
    max_nodes = limits.max_schema_nodes
    max_chars = limits.max_schema_chars
    max_depth = limits.max_schema_depth
    max_enum = limits.max_schema_enum
    length_cap = limits.max_schema_length_bound
    items_cap = limits.max_schema_items_bound
    number_cap = limits.max_schema_number
    walk = _SchemaWalk(ctx, root, path)
    parent, label, depths, counts = walk.parent, walk.label, walk.depth, walk.count
    schema_index, refs, patterns = walk.schema_index, walk.refs, walk.patterns
    facts = SchemaFacts()
    best = 1
    bound_ref = False
    nodes = ctx.schema_nodes
    chars = ctx.schema_chars
    # (value, parent index, label, depth, role, nested-bound product above it; 0: outside)
    stack: list[tuple[Any, int, str | int, int, int, int]] = [(root, -1, "", 1, _SCHEMA, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        node, par, lab, depth, role, product = pop()
        nodes += 1
        idx = len(parent)
        parent.append(par)
        label.append(lab)
        depths.append(depth)
        if depth > max_depth or nodes + len(stack) + len(node) > max_nodes:
            return None
        cnt = 1
        child_depth = depth + 1
        if type(node) is dict:
            here = product
            if not FACT_KEYS.isdisjoint(node):
                add_node(node, facts)
                if product:
                    if type(node.get("$ref")) is str:
                        bound_ref = True
                    here = bound_here(node, product)
                    if here > best:
                        best = here
            if role == _SCHEMA:
                schema_index[id(node)] = idx
                for key, value in node.items():
                    if type(key) is not str:
                        return None
                    chars += len(key)
                    child_role = _KEY_ROLE.get(key, _DATA)
                    if child_role >= _K_PATTERN:
                        if child_role == _K_ITEMS:
                            child_role = _LIST if type(value) is list else _SCHEMA
                        elif child_role == _K_PATTERN:
                            if type(value) is not str:
                                return None
                            patterns.append((idx, key, value))
                            child_role = _DATA
                        elif child_role == _K_REF:
                            if type(value) is not str:
                                return None
                            refs.append((idx, value, key))
                            child_role = _DATA
                        elif child_role == _K_ENUM:
                            if type(value) is not list or len(value) > max_enum:
                                return None
                            child_role = _DATA
                        elif child_role == _K_LENGTH:
                            if not _bound_ok(value, length_cap):
                                return None
                            child_role = _DATA
                        elif child_role == _K_COUNT:
                            if not _bound_ok(value, items_cap):
                                return None
                            child_role = _DATA
                        else:  # _K_NUMBER
                            if not _number_ok(value, key, number_cap):
                                return None
                            child_role = _DATA
                    t = type(value)
                    if t is dict or t is list:
                        push(
                            (
                                value,
                                idx,
                                key,
                                child_depth,
                                child_role,
                                0 if key in BOUND_SKIP else here,
                            )
                        )
                        continue
                    cnt += 1
                    if child_role == _DATA:
                        if t is str:
                            chars += len(value)
                        elif (
                            t is not bool and t is not int and t is not float and value is not None
                        ):
                            return None  # not a JSON value
                    elif child_role != _SCHEMA or t is not bool:
                        return None  # a scalar where a schema or a container must be
            elif role == _DATA:
                for key, value in node.items():
                    if type(key) is not str:
                        return None
                    chars += len(key)
                    t = type(value)
                    if t is dict or t is list:
                        push(
                            (value, idx, key, child_depth, _DATA, 0 if key in BOUND_SKIP else here)
                        )
                    else:
                        cnt += 1
                        if t is str:
                            chars += len(value)
                        elif (
                            t is not bool and t is not int and t is not float and value is not None
                        ):
                            return None
            elif role == _LIST:
                return None
            else:  # _MAP, _PATTERN_MAP, _DEPS: objects whose values are schemas
                for key, value in node.items():
                    if type(key) is not str:
                        return None
                    chars += len(key)
                    if role == _PATTERN_MAP:
                        patterns.append((idx, key, key))
                    t = type(value)
                    if t is dict:
                        child_role = _SCHEMA
                    elif t is list:
                        if role != _DEPS:
                            return None  # the exact walk: "a schema must be an object"
                        child_role = _DATA
                    elif t is bool:
                        cnt += 1
                        continue
                    else:
                        return None
                    push(
                        (value, idx, key, child_depth, child_role, 0 if key in BOUND_SKIP else here)
                    )
        elif type(node) is list:
            if role != _DATA and role != _LIST:
                return None
            child_role = _SCHEMA if role == _LIST else _DATA
            for i, value in enumerate(node):
                t = type(value)
                if t is dict or t is list:
                    push((value, idx, i, child_depth, child_role, product))
                    continue
                cnt += 1
                if t is str:
                    chars += len(value)
                    if child_role == _SCHEMA:
                        return None
                elif child_role == _SCHEMA:
                    if t is not bool:
                        return None
                elif t is not bool and t is not int and t is not float and value is not None:
                    return None
        else:
            return None
        nodes += cnt - 1
        counts.append(cnt)
        if chars > max_chars:
            return None
    if nodes > max_nodes:
        return None
    ctx.schema_nodes = nodes
    ctx.schema_chars = chars
    if refs:
        if limits.allow_recursive_refs:
            return None  # which recursive $ref counts once depends on the exact walk's order
        walk._expand_refs()
    for _, _, pattern in patterns:
        _check_regex(ctx, pattern, path)
    facts.bound = None if bound_ref else best
    return facts


def _check_schema(ctx: _Ctx, value: Any, path: _Path) -> None:
    if value is None:
        return
    ctx.schemas += 1
    if ctx.schemas > ctx.limits.max_schemas:
        _limit("guided_schema_too_large", f"more than {ctx.limits.max_schemas} schemas", path)
    if isinstance(value, str):
        value = _parse_json_text(ctx, value, path)
    if not (isinstance(value, Mapping | bool)):
        _invalid("guided_schema_invalid", "a schema must be an object or a boolean", path)
    if isinstance(value, bool):
        if ctx.nodes_over(1):
            ctx.too_many_nodes(path)
        return
    saved = ctx.snapshot()
    try:
        facts = _fast_schema(ctx, value, path)
    except GuardError:
        facts = None
    if facts is None:
        # Something is wrong (or unusual): the exact walk finds the first problem in order.
        ctx.restore(saved)
        _SchemaWalk(ctx, value, path).run()
    elif ctx.facts is not None:
        ctx.facts[id(value)] = (value, facts)


# ---- grammars ----------------------------------------------------------------------------------


def _check_grammar(ctx: _Ctx, text: Any, path: _Path, *, gbnf_only: bool) -> None:
    limits = ctx.limits
    if not isinstance(text, str):
        _invalid("guided_grammar_invalid", "a grammar must be a string", path)
    if len(text) > limits.max_grammar_chars:
        _limit(
            "guided_grammar_too_large",
            f"grammar longer than {limits.max_grammar_chars} characters",
            path,
        )
    try:
        scan_gbnf(
            text,
            max_depth=limits.max_grammar_depth,
            max_rules=limits.max_grammar_rules,
            max_repeat=limits.max_grammar_repeat,
            max_repeat_total=limits.max_grammar_repeat_total,
        )
        if not gbnf_only:
            scan_nesting(text, max_depth=limits.max_grammar_depth)
        else:  # llama.cpp's own reading: what its parser refuses crashes llama-cpp-python
            parse_gbnf(
                text,
                GbnfLimits.of(limits, limits.max_grammar_depth),
            )
    except RegexRejected as e:
        if e.code == "guided_grammar_invalid":
            _invalid(e.code, e.message, path)
        _limit(e.code, e.message, path)


def _check_llama_cpp_schemas(ctx: _Ctx, body: Mapping[str, Any]) -> None:
    """The grammars llama-cpp-python would make of the request's schemas (after the schema
    limits, so the converter only sees bounded schemas)."""
    if not ctx.limits.llama_cpp_schemas:
        return
    for schema, path in llama_cpp_schemas(body):
        problem = schema_grammar_problem(schema, ctx.limits)
        if problem is None:
            continue
        message = f"the grammar llama-cpp-python makes of this schema: {problem.message}"
        if problem.code == "guided_grammar_invalid":
            _invalid("guided_schema_grammar_invalid", message, path)
        _limit("guided_schema_grammar_too_large", message, path)


# ---- choices and structural tags ---------------------------------------------------------------


def _check_choice(ctx: _Ctx, choices: Any, path: _Path) -> None:
    limits = ctx.limits
    if not _is_list(choices):
        _invalid("guided_choice_invalid", "choices must be a list of strings", path)
    if len(choices) > limits.max_choices:
        _limit("guided_choice_too_large", f"more than {limits.max_choices} choices", path)
    total = 0
    for i, choice in enumerate(choices):
        if not isinstance(choice, str):
            _invalid("guided_choice_invalid", "choices must be strings", (*path, i))
        total += len(choice)
        if total > limits.max_choice_chars:
            _limit(
                "guided_choice_too_large",
                f"choices exceed {limits.max_choice_chars} characters in total",
                (*path, i),
            )


_TAG_SCHEMA_KEYS = frozenset({"schema", "json_schema", "parameters"})
_TAG_REGEX_KEYS = frozenset({"pattern", "regex"})
_TAG_GRAMMAR_KEYS = frozenset({"grammar", "ebnf", "lark"})


def _check_structural_tag(ctx: _Ctx, value: Any, path: _Path) -> None:
    """vLLM/xgrammar structural tags nest schemas, regexes and grammars in a free-form tree:
    walk it (iteratively, under the schema caps) and check every constraint found."""
    if value is None:
        return
    if isinstance(value, str):
        value = _parse_json_text(ctx, value, path)
    stack: list[tuple[Any, _Path, int]] = [(value, path, 1)]
    while stack:
        node, at, depth = stack.pop()
        if ctx.nodes_over(1):
            ctx.too_many_nodes(at)
        if depth > ctx.limits.max_schema_depth:
            _limit(
                "guided_schema_too_deep",
                f"structural tag nested deeper than {ctx.limits.max_schema_depth} levels",
                at,
            )
        if (isinstance(node, Mapping) or _is_list(node)) and (
            ctx.schema_nodes + len(stack) + len(node) > ctx.limits.max_schema_nodes
        ):
            ctx.too_many_nodes(at)
        if isinstance(node, Mapping):
            for key, child in node.items():
                if not isinstance(key, str):
                    continue
                child_at = (*at, key)
                if key in _TAG_SCHEMA_KEYS and isinstance(child, Mapping | bool):
                    _check_schema(ctx, child, child_at)
                elif key in _TAG_REGEX_KEYS and isinstance(child, str):
                    _check_regex(ctx, child, child_at)
                elif key in _TAG_GRAMMAR_KEYS and isinstance(child, str):
                    _check_grammar(ctx, child, child_at, gbnf_only=False)
                elif isinstance(child, Mapping) or _is_list(child):
                    stack.append((child, child_at, depth + 1))
        elif _is_list(node):
            for i, child in enumerate(node):
                if isinstance(child, Mapping) or _is_list(child):
                    stack.append((child, (*at, i), depth + 1))


# ---- the request -------------------------------------------------------------------------------


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def check_guided_decoding(
    body: Mapping[str, Any], limits: GuidedLimits, facts: Memo | None = None
) -> None:
    """Refuse unsafe guided-decoding constraints in an OpenAI / vLLM / SGLang / llama.cpp / TGI
    request body; return None when every constraint is within ``limits``.

    Raises :class:`~guard.errors.LimitExceeded` (``*_too_long``, ``*_too_large``,
    ``*_too_deep``, ``*_unsafe``) or :class:`~guard.errors.GuardError` (``*_invalid``).
    Constraints are checked in a fixed order (choices, grammars, regexes, schemas, tools,
    structural tags), so a body crossing several limits always gets the same refusal.
    ``facts``, when given, receives the :class:`~guard.guided.schema._facts.SchemaFacts` of
    the schemas walked (by ``id``).
    """
    ctx = _Ctx(limits, facts)
    so = _get(body, "structured_outputs")
    for value, path in (
        (body.get("guided_choice"), ("guided_choice",)),
        (_get(so, "choice"), ("structured_outputs", "choice")),
    ):
        if value is not None:
            _check_choice(ctx, value, path)
    _check_grammars(ctx, body, so)
    for value, path in (
        (body.get("guided_regex"), ("guided_regex",)),
        (_get(so, "regex"), ("structured_outputs", "regex")),
        (body.get("regex"), ("regex",)),
        (body.get("guided_whitespace_pattern"), ("guided_whitespace_pattern",)),
        (_get(so, "whitespace_pattern"), ("structured_outputs", "whitespace_pattern")),
    ):
        if value is not None:
            _check_regex(ctx, value, path)
    _check_schemas(ctx, body, so)
    for field in ("tools", "functions"):
        entries = body.get(field)
        if isinstance(entries, list | tuple):
            _check_tools(ctx, entries, field)
    _check_structural_tag(ctx, body.get("structural_tag"), ("structural_tag",))
    _check_structural_tag(ctx, _get(so, "structural_tag"), ("structured_outputs", "structural_tag"))
    _check_llama_cpp_schemas(ctx, body)


def _check_grammars(ctx: _Ctx, body: Mapping[str, Any], so: Any) -> None:
    grammar = body.get("grammar")
    if isinstance(grammar, Mapping):  # TGI: {"type": "json" | "regex", "value": ...}
        kind = grammar.get("type")
        if kind == "regex":
            _check_regex(ctx, grammar.get("value"), ("grammar", "value"))
        elif grammar.get("value") is not None:
            _check_schema(ctx, grammar.get("value"), ("grammar", "value"))
    elif grammar is not None:
        _check_grammar(ctx, grammar, ("grammar",), gbnf_only=True)
    for value, path in (
        (body.get("guided_grammar"), ("guided_grammar",)),
        (_get(so, "grammar"), ("structured_outputs", "grammar")),
        (body.get("ebnf"), ("ebnf",)),
    ):
        if value is not None:
            _check_grammar(ctx, value, path, gbnf_only=False)


def _check_schemas(ctx: _Ctx, body: Mapping[str, Any], so: Any) -> None:
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        json_schema = response_format.get("json_schema")
        if isinstance(json_schema, Mapping):
            _check_schema(
                ctx, json_schema.get("schema"), ("response_format", "json_schema", "schema")
            )
        _check_schema(ctx, response_format.get("schema"), ("response_format", "schema"))
        _check_schema(ctx, response_format.get("value"), ("response_format", "value"))
        if response_format.get("type") == "structural_tag":
            _check_structural_tag(
                ctx,
                {k: v for k, v in response_format.items() if k != "type"},
                ("response_format",),
            )
    _check_schema(ctx, body.get("guided_json"), ("guided_json",))
    _check_schema(ctx, _get(so, "json"), ("structured_outputs", "json"))
    _check_schema(ctx, body.get("json_schema"), ("json_schema",))
    text_format = _get(_get(body, "text"), "format")
    if isinstance(text_format, Mapping):
        _check_schema(ctx, text_format.get("schema"), ("text", "format", "schema"))


def _check_tools(ctx: _Ctx, entries: list[Any] | tuple[Any, ...], field: str) -> None:
    """Function parameters (schemas) and custom tools' formats (regex or grammar)."""
    for i, tool in enumerate(entries):
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        if isinstance(function, Mapping):
            _check_schema(ctx, function.get("parameters"), (field, i, "function", "parameters"))
        _check_schema(ctx, tool.get("parameters"), (field, i, "parameters"))
        fmt = tool.get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "grammar":
            definition = fmt.get("definition")
            at: _Path = (field, i, "format", "definition")
            if fmt.get("syntax") == "regex":
                _check_regex(ctx, definition, at)
            else:
                _check_grammar(ctx, definition, at, gbnf_only=False)

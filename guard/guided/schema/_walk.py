"""One JSON schema checked against the policy's schema limits: the schema walk.

The walk visits the schema once, with an explicit stack (no recursion), and refuses in time
linear in the schema: depth, nodes and characters (every value is a node, every key and string
counts its characters), ``$ref`` count, expansion (size and depth, by dynamic programming over
the graph of reference targets, so no billion laughs) and recursion, ``enum`` size, the numbers
that drive grammar size (``maxLength``, ``minItems``, ...), and the regexes of ``pattern`` and
``patternProperties`` (:func:`guard.guided.regex.check_regex`). Containers get pre-order
indices, so that a subtree is an index interval (``$ref`` is expanded without materialising
anything).

One walk, taken in one of two orders (:func:`check_schema` takes the fast one first):

- **fast**, for a plain schema (dicts, lists and JSON scalars): children visited last-first,
  scalars counted where their container is read rather than pushed, and the schema's
  :class:`~guard.guided.schema.SchemaFacts` (what the backend checks read) and nested-bound
  product gathered on the way, in the order their estimates add them up. It stops at the first
  problem, or at anything it does not take (another Mapping, a tuple, a ``$ref`` cycle the
  policy allows);
- **exact**: every value pushed and visited in document order, any Mapping and tuple taken, so
  that a refusal is the first problem in document order, with its path.

A schema that passes gets the same counters in either order. The fast order is what a benign
request takes: ~8x the exact order on 16 KB of properties (issue 16; ``bench/guided_check.py
--against REV`` times the check beside an earlier revision).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from guard.errors import GuardError
from guard.guided._budget import ParamPath, RequestBudget, refuse, refuse_invalid
from guard.guided.regex import check_regex
from guard.guided.schema._bounds import BOUND_SKIP, bound_here
from guard.guided.schema._facts import FACT_KEYS, SchemaFacts, add_node
from guard.guided.schema._text import parse_json_text

__all__ = ["check_schema"]

# What a walked value is: a schema, a map or list of schemas, or plain data (counted only).
_SCHEMA, _MAP, _LIST, _PATTERN_MAP, _DEPS, _DATA = range(6)
# Keywords whose values are checked before they are walked (then walked as plain data).
_K_PATTERN, _K_REF, _K_ENUM, _K_LENGTH, _K_COUNT, _K_NUMBER, _K_ITEMS = range(10, 17)
# Each keyword's role: one table lookup per key.
_KEY_ROLE: dict[str, int] = {
    "pattern": _K_PATTERN,
    "patternProperties": _PATTERN_MAP,
    "dependencies": _DEPS,
    "items": _K_ITEMS,
    "enum": _K_ENUM,
    **dict.fromkeys(("properties", "$defs", "definitions", "dependentSchemas"), _MAP),
    **dict.fromkeys(("allOf", "anyOf", "oneOf", "prefixItems"), _LIST),
    **dict.fromkeys(
        (
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
        ),
        _SCHEMA,
    ),
    **dict.fromkeys(("$ref", "$dynamicRef", "$recursiveRef"), _K_REF),
    **dict.fromkeys(("minLength", "maxLength"), _K_LENGTH),
    **dict.fromkeys(
        ("minItems", "maxItems", "minProperties", "maxProperties", "minContains", "maxContains"),
        _K_COUNT,
    ),
    **dict.fromkeys(
        ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"), _K_NUMBER
    ),
}
_BOOL_TARGET = -2
# What _lookup returns for a $ref it cannot resolve, and the message each gets.
_REF_NOT_LOCAL, _REF_ANCHOR, _REF_UNRESOLVED = -3, -4, -5
_REF_ERRORS = {
    _REF_NOT_LOCAL: "only local $ref values ('#' or '#/...') are allowed",
    _REF_ANCHOR: "$ref anchors are not supported",
    _REF_UNRESOLVED: "$ref does not resolve to a schema",
}


class _Unusual(Exception):
    """The fast order stops: something it does not take (the exact order then decides)."""


def check_schema(ctx: RequestBudget, value: Any, path: ParamPath) -> None:
    """Check one schema constraint (an object, a boolean or JSON text; None: absent) against
    ``ctx``'s limits and add it to ``ctx``'s counters; a plain schema's facts go to
    ``ctx.facts`` for the backend checks.

    The fast order first; when it stops, the counters are put back and the exact order finds
    the first problem in document order (and refuses), or passes an unusual but valid schema.
    Raises :class:`~guard.errors.LimitExceeded` or :class:`~guard.errors.GuardError`
    (``*_invalid``).
    """
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
        facts = _SchemaWalk(ctx, value, path).walk(True)
    except (GuardError, _Unusual):
        ctx.restore(saved)
        _SchemaWalk(ctx, value, path).walk(False)
        return
    if ctx.facts is not None:
        ctx.facts[id(value)] = (value, facts)


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


class _SchemaWalk:
    """One schema's walk: the pre-order arrays of its containers, its references and patterns."""

    def __init__(self, ctx: RequestBudget, root: Any, path: ParamPath) -> None:
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

    def path_of(self, idx: int, *extra: str | int) -> ParamPath:
        parts: list[str | int] = []
        while idx > 0:
            parts.append(self.label[idx])
            idx = self.parent[idx]
        parts.reverse()
        return self.path + tuple(parts) + extra

    # -- the walk ------------------------------------------------------------------------------

    def walk(self, fast: bool) -> SchemaFacts:
        """Walk the schema in the fast or the exact order (see the module docstring), then
        expand its ``$ref`` and check its regexes, and return the facts gathered (in the order
        the estimates add them up after the fast order only). The fast order raises
        :class:`_Unusual` (or the refusal of a problem, not necessarily the first) where it
        stops; the exact order refuses at the first problem.

        The loop runs once per value of the schema, so it keeps to locals, tests a container's
        limits at once, and checks the characters once per container: before any refusal in
        it (an earlier key may have crossed the limit) and after it (same path either way)."""
        ctx = self.ctx
        limits = self.limits
        max_nodes = limits.max_schema_nodes
        max_chars = limits.max_schema_chars
        max_depth = limits.max_schema_depth
        max_enum = limits.max_schema_enum
        length_cap = limits.max_schema_length_bound
        items_cap = limits.max_schema_items_bound
        number_cap = limits.max_schema_number
        parent, label, depths, counts = self.parent, self.label, self.depth, self.count
        schema_index, refs, patterns = self.schema_index, self.refs, self.patterns
        facts = SchemaFacts()
        best = 1
        bound_ref = False
        nodes = ctx.schema_nodes
        chars = ctx.schema_chars
        # (value, parent index, label, depth, role, nested-bound product above it; 0: outside)
        stack: list[tuple[Any, int, Any, int, int, int]] = [(self.root, -1, "", 1, _SCHEMA, 1)]
        pop, push = stack.pop, stack.append
        while stack:
            node, par, lab, depth, role, product = pop()
            nodes += 1
            t = type(node)
            if t is not dict and t is not list:
                if fast:
                    raise _Unusual  # a Mapping that is not a dict, at the root
                if isinstance(node, Mapping):
                    t = dict  # walked as one below
                elif isinstance(node, list | tuple):
                    t = list
                else:
                    self._scalar(node, par, lab, role, nodes, chars)
                    if par >= 0:
                        counts[par] += 1
                    if isinstance(node, str):
                        chars += len(node)
                    continue
            idx = len(parent)
            parent.append(par)
            label.append(lab)
            depths.append(depth)
            # Every value on the stack is charged when popped: refuse a container whose
            # children cannot all fit before pushing any of them.
            if depth > max_depth or nodes + len(stack) + len(node) > max_nodes:
                if nodes > max_nodes:
                    ctx.too_many_nodes(self.path_of(idx))
                if depth > max_depth:
                    refuse(
                        "guided_schema_too_deep",
                        f"schema nested deeper than {max_depth} levels",
                        self.path_of(idx),
                    )
                ctx.too_many_nodes(self.path_of(idx))
            cnt = 1
            child_depth = depth + 1
            if t is dict:
                here = product
                if not FACT_KEYS.isdisjoint(node):
                    add_node(node, facts)
                    if product:
                        if type(node.get("$ref")) is str:
                            bound_ref = True
                        here = bound_here(node, product)
                        if here > best:
                            best = here
                items = node.items() if fast else reversed(list(node.items()))
                if role == _SCHEMA:
                    schema_index[id(node)] = idx
                    for key, value in items:
                        if type(key) is not str and (fast or not isinstance(key, str)):
                            self._chars_first(chars, idx)
                            refuse_invalid(
                                "guided_schema_invalid", "keys must be strings", self.path_of(idx)
                            )
                        chars += len(key)
                        child_role = _KEY_ROLE.get(key, _DATA)
                        if child_role >= _K_PATTERN:
                            if child_role == _K_ITEMS:
                                child_role = _LIST if isinstance(value, list | tuple) else _SCHEMA
                            elif child_role == _K_LENGTH:
                                if not _bound_ok(value, length_cap):
                                    self._chars_first(chars, idx)
                                    self._bound(value, length_cap, idx, key)
                                child_role = _DATA
                            elif child_role == _K_COUNT:
                                if not _bound_ok(value, items_cap):
                                    self._chars_first(chars, idx)
                                    self._bound(value, items_cap, idx, key)
                                child_role = _DATA
                            elif child_role == _K_NUMBER:
                                if not _number_ok(value, key, number_cap):
                                    self._chars_first(chars, idx)
                                    self._number(value, idx, key)
                                child_role = _DATA
                            elif child_role == _K_PATTERN:
                                if not isinstance(value, str):
                                    self._chars_first(chars, idx)
                                    refuse_invalid(
                                        "guided_regex_invalid",
                                        "a regex must be a string",
                                        self.path_of(idx, key),
                                    )
                                patterns.append((idx, key, value))
                                child_role = _DATA
                            elif child_role == _K_REF:
                                if not isinstance(value, str):
                                    self._chars_first(chars, idx)
                                    refuse_invalid(
                                        "guided_schema_invalid",
                                        "$ref must be a string",
                                        self.path_of(idx, key),
                                    )
                                refs.append((idx, value, key))
                                child_role = _DATA
                            else:  # _K_ENUM
                                if not isinstance(value, list | tuple) or len(value) > max_enum:
                                    self._chars_first(chars, idx)
                                    self._enum(value, idx, key)
                                child_role = _DATA
                        t = type(value)
                        if t is dict or t is list or not fast:
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
                                t is not bool
                                and t is not int
                                and t is not float
                                and value is not None
                            ):
                                raise _Unusual  # not a JSON value
                        elif child_role != _SCHEMA or t is not bool:
                            raise _Unusual  # a scalar where a schema or a container must be
                elif role == _DATA:
                    for key, value in items:
                        if type(key) is str or isinstance(key, str):
                            chars += len(key)
                        elif fast:
                            raise _Unusual  # not a JSON object
                        elif not isinstance(key, int):
                            key = "?"  # the label of a key that is neither text nor a number
                        t = type(value)
                        if t is dict or t is list or not fast:
                            push(
                                (
                                    value,
                                    idx,
                                    key,
                                    child_depth,
                                    _DATA,
                                    0 if key in BOUND_SKIP else here,
                                )
                            )
                            continue
                        cnt += 1
                        if t is str:
                            chars += len(value)
                        elif (
                            t is not bool and t is not int and t is not float and value is not None
                        ):
                            raise _Unusual
                elif role == _LIST:
                    refuse_invalid(
                        "guided_schema_invalid", "expected a list of schemas", self.path_of(idx)
                    )
                else:  # _MAP, _PATTERN_MAP, _DEPS: objects whose values are schemas
                    for key, value in items:
                        if type(key) is not str and (fast or not isinstance(key, str)):
                            self._chars_first(chars, idx)
                            refuse_invalid(
                                "guided_schema_invalid", "keys must be strings", self.path_of(idx)
                            )
                        chars += len(key)
                        if role == _PATTERN_MAP:
                            patterns.append((idx, key, key))
                        t = type(value)
                        child_role = _SCHEMA
                        if role == _DEPS and isinstance(value, list | tuple):
                            child_role = _DATA
                        if t is dict or t is list or not fast:
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
                        if child_role != _SCHEMA or t is not bool:
                            raise _Unusual  # a scalar where a schema must be
            else:
                if role == _SCHEMA:
                    refuse_invalid(
                        "guided_schema_invalid",
                        "a schema must be an object or a boolean",
                        self.path_of(idx),
                    )
                if role != _DATA and role != _LIST:
                    refuse_invalid("guided_schema_invalid", "expected an object", self.path_of(idx))
                child_role = _SCHEMA if role == _LIST else _DATA
                for i in range(len(node)) if fast else range(len(node) - 1, -1, -1):
                    value = node[i]
                    t = type(value)
                    if t is dict or t is list or not fast:
                        push((value, idx, i, child_depth, child_role, product))
                        continue
                    cnt += 1
                    if t is str:
                        chars += len(value)
                        if child_role == _SCHEMA:
                            raise _Unusual
                    elif child_role == _SCHEMA:
                        if t is not bool:
                            raise _Unusual
                    elif t is not bool and t is not int and t is not float and value is not None:
                        raise _Unusual
            if chars > max_chars:
                ctx.too_many_chars(self.path_of(idx))
            counts.append(cnt)
            nodes += cnt - 1
        ctx.schema_nodes = nodes
        ctx.schema_chars = chars
        if refs:
            if fast and limits.recursive_refs_allowed:
                raise _Unusual  # which recursive $ref counts once depends on the exact order
            self._expand_refs()
        for idx, lab, pattern in patterns:
            check_regex(ctx, pattern, self.path if fast else self.path_of(idx, lab))
        facts.bound = None if bound_ref else best
        return facts

    def _scalar(self, node: Any, par: int, lab: Any, role: int, nodes: int, chars: int) -> None:
        """Refuse a scalar the exact order popped (it pushes every value): over the node or
        character limit, or where a schema or a container must be. ``nodes`` counts it,
        ``chars`` does not yet."""
        if nodes > self.limits.max_schema_nodes:
            self.ctx.too_many_nodes(self.path if par < 0 else self.path_of(par, lab))
        if isinstance(node, str) and chars + len(node) > self.limits.max_schema_chars:
            self.ctx.too_many_chars(self.path if par < 0 else self.path_of(par, lab))
        if role == _SCHEMA and not isinstance(node, bool):
            refuse_invalid(
                "guided_schema_invalid",
                "a schema must be an object or a boolean",
                self.path if par < 0 else self.path_of(par, lab),
            )
        if role != _SCHEMA and role != _DATA:
            why = "expected a list of schemas" if role == _LIST else "expected an object"
            refuse_invalid("guided_schema_invalid", why, self.path_of(par, lab))

    def _chars_first(self, chars: int, idx: int) -> None:
        """Before a refusal inside container ``idx``: an earlier key of it may have crossed the
        character limit, which is then the first problem (characters are compared once per
        container, after its keys)."""
        if chars > self.limits.max_schema_chars:
            self.ctx.too_many_chars(self.path_of(idx))

    def _enum(self, value: Any, idx: int, key: str) -> None:
        if not isinstance(value, list | tuple):
            refuse_invalid("guided_schema_invalid", "enum must be a list", self.path_of(idx, key))
        refuse(
            "guided_schema_too_large",
            f"enum with more than {self.limits.max_schema_enum} values",
            self.path_of(idx, key),
        )

    def _bound(self, value: Any, cap: int, idx: int, key: str) -> None:
        """A count that grammar compilers unroll (``maxLength`` 10**9 becomes 10**9 states)."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            refuse_invalid(
                "guided_schema_invalid", f"{key} must be a number", self.path_of(idx, key)
            )
        if isinstance(value, float) and not (math.isfinite(value) and value == int(value)):
            refuse_invalid(
                "guided_schema_invalid", f"{key} must be an integer", self.path_of(idx, key)
            )
        if value < 0:
            refuse_invalid(
                "guided_schema_invalid", f"{key} must not be negative", self.path_of(idx, key)
            )
        if value > cap:
            refuse(
                "guided_schema_too_large", f"{key} above the limit of {cap}", self.path_of(idx, key)
            )

    def _number(self, value: Any, idx: int, key: str) -> None:
        if isinstance(value, bool) and key in ("exclusiveMinimum", "exclusiveMaximum"):
            return  # draft 4 spells these as booleans
        if isinstance(value, bool) or not isinstance(value, int | float):
            refuse_invalid(
                "guided_schema_invalid", f"{key} must be a number", self.path_of(idx, key)
            )
        if isinstance(value, float) and not math.isfinite(value):
            refuse_invalid("guided_schema_invalid", f"{key} must be finite", self.path_of(idx, key))
        if abs(value) > self.limits.max_schema_number:
            refuse(
                "guided_schema_too_large",
                f"{key} beyond ±{self.limits.max_schema_number:g}",
                self.path_of(idx, key),
            )
        if key == "multipleOf" and value <= 0:
            refuse_invalid(
                "guided_schema_invalid", "multipleOf must be positive", self.path_of(idx, key)
            )

    # -- $ref ----------------------------------------------------------------------------------

    def _resolve(self, ref: str, site: int, key: str, resolved: dict[str, int]) -> int:
        """The index of the schema ``ref`` names (``resolved`` caches it by the ref's text: a
        ref bomb repeats a few refs many times); the error's path is built only on failure."""
        target = resolved.get(ref)
        if target is None:
            target = self._lookup(ref)
            if target in _REF_ERRORS:
                refuse_invalid(
                    "guided_schema_invalid", _REF_ERRORS[target], self.path_of(site, key)
                )
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
            elif (
                isinstance(node, list | tuple)
                and token.isdigit()
                and len(token) < 10
                and int(token) < len(node)
            ):
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
            refuse(
                "guided_schema_too_large",
                f"more than {limits.max_schema_refs} $ref in the request",
                self.path_of(site, key),
            )
        resolved: dict[str, int] = {}
        targets = [self._resolve(ref, site, key, resolved) for site, ref, key in self.refs]
        size, span = self._expanded(targets, end, total, deepest)
        if self.ctx.nodes_over(size - total[0]):
            refuse(
                "guided_schema_too_large",
                f"JSON schemas exceed {limits.max_schema_nodes} nodes once $ref is expanded",
                self.path,
            )
        if span > limits.max_schema_depth:
            refuse(
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
                    if limits.recursive_refs_allowed:
                        continue
                    site, _, key = self.refs[pos]
                    refuse(
                        "guided_schema_too_deep",
                        "outlines expands a recursive $ref into a regex without end"
                        if limits.backends == ("outlines",)
                        else "recursive $ref (the schema would expand without end)",
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

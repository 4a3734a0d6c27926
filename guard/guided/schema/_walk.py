"""One JSON schema checked against the policy's schema limits, walked with an explicit stack.

Depth, nodes, characters (after ``$ref`` expansion too: size and depth by dynamic programming
over the graph of reference targets, so no billion laughs), ``$ref`` count and recursion,
``enum`` size, the numbers that drive grammar size (``maxLength``, ``minItems``, ...), and the
regexes of ``pattern`` and ``patternProperties`` (:func:`guard.guided.regex.check_regex`).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote

from guard.guided._budget import ParamPath, RequestBudget, refuse, refuse_invalid
from guard.guided.regex import check_regex
from guard.guided.schema._bounds import BOUND_SKIP, bound_here
from guard.guided.schema._facts import FACT_KEYS, SchemaFacts, add_node

__all__ = ["exact_schema_walk", "fast_schema_walk"]

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

    def run(self) -> None:
        self._walk()
        self._expand_refs()
        for idx, label, pattern in self.patterns:
            check_regex(self.ctx, pattern, self.path_of(idx, label))

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
                refuse(
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
                    refuse_invalid(
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
                    refuse_invalid(
                        "guided_schema_invalid", "expected a list of schemas", self.path_of(idx)
                    )
                for i in range(len(node) - 1, -1, -1):
                    stack.append((node[i], idx, i, depth + 1, _SCHEMA))
            else:  # _MAP, _PATTERN_MAP, _DEPS: objects whose values are schemas
                if not is_map:
                    refuse_invalid("guided_schema_invalid", "expected an object", self.path_of(idx))
                for key, value in reversed(list(node.items())):
                    if not isinstance(key, str):
                        refuse_invalid(
                            "guided_schema_invalid", "keys must be strings", self.path_of(idx)
                        )
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
            refuse_invalid("guided_schema_invalid", "a schema must be an object or a boolean", path)
        if role in (_MAP, _PATTERN_MAP, _DEPS, _LIST):
            refuse_invalid(
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
                refuse_invalid("guided_schema_invalid", "keys must be strings", self.path_of(idx))
            if self.ctx.chars_over(len(key)):
                self.ctx.too_many_chars(self.path_of(idx))
            role = _DATA
            if key == "pattern":
                if not isinstance(value, str):
                    refuse_invalid(
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
                    refuse_invalid(
                        "guided_schema_invalid", "$ref must be a string", self.path_of(idx, key)
                    )
                self.refs.append((idx, value, key))
            elif key == "enum":
                if not _is_list(value):
                    refuse_invalid(
                        "guided_schema_invalid", "enum must be a list", self.path_of(idx, key)
                    )
                if len(value) > limits.max_schema_enum:
                    refuse(
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
                    if limits.allow_recursive_refs:
                        continue
                    site, _, key = self.refs[pos]
                    refuse(
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


def fast_schema_walk(
    ctx: RequestBudget, root: Mapping[str, Any], path: ParamPath
) -> SchemaFacts | None:
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
        check_regex(ctx, pattern, path)
    facts.bound = None if bound_ref else best
    return facts


def exact_schema_walk(ctx: RequestBudget, root: Mapping[str, Any], path: ParamPath) -> None:
    """The schema check in document order: refuses at the first problem, with its path."""
    _SchemaWalk(ctx, root, path).run()

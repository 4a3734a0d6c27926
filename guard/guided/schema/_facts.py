"""What the backend routing, the backend cost models and the nested-bound check read from a JSON
schema, gathered in one walk.

vLLM's routing (:func:`guard.guided.backends._routing.route_auto`), xgrammar's and llguidance's cost
estimates (:mod:`guard.guided.backends._cost`) and the nested-bound product
(:mod:`guard.guided.schema._bounds`) each used to walk the whole schema again. They read a few
keywords per object, the same whatever the object's place in the schema: :func:`add_node` reads
them from one object into a :class:`SchemaFacts`, in the order the estimates add them up
(objects in pre-order, children right to left), so the sums are the same to the last bit. The
schema check's own walk (:mod:`guard.guided.schema._walk`) calls it on every object it visits, and
:func:`facts_of` walks a schema the check did not see (the schema vLLM builds from forced tool
calls, which holds the tools' parameters: their facts are reused, not walked again).

The nested-bound product is the largest product of ``minItems``/``maxItems`` and
``minLength``/``maxLength`` along one path; without a ``$ref`` it is found in the same walk.
With one, :attr:`SchemaFacts.bound` is None and the caller follows the references
(:func:`guard.guided.schema._bounds.largest_bound_product`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guard.guided.regex import guidance_rejects_regex, xgrammar_rejects_regex
from guard.guided.schema._bounds import BOUND_CAP, BOUND_SKIP, bound_here

__all__ = ["FACT_KEYS", "SchemaFacts", "add_node", "facts_of"]

_ARRAY_KEYS = ("minItems", "maxItems")

_STRING_FORMATS = frozenset(
    {
        "email",
        "date",
        "time",
        "date-time",
        "duration",
        "ipv4",
        "ipv6",
        "hostname",
        "uuid",
        "uri",
        "uri-reference",
        "uri-template",
        "json-pointer",
        "relative-json-pointer",
    }
)
_GUIDANCE_UNIMPLEMENTED = frozenset(
    {
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "propertyNames",
        "not",
        "if",
        "then",
        "else",
        "dependentRequired",
        "dependentSchemas",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
# Keys that can make an object unsupported by xgrammar (vLLM's pre-check and xgrammar's own).
_XGR_KEYS = frozenset(
    {
        "multipleOf",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "format",
        "propertyNames",
        "patternProperties",
        "allOf",
        "pattern",
        "minProperties",
        "$ref",
    }
)
FACT_KEYS = (
    _XGR_KEYS
    | _GUIDANCE_UNIMPLEMENTED
    | frozenset({"maxLength", "minLength", "enum", "properties", "minItems", "maxItems", "if"})
)
"""An object with none of these keys adds nothing to any fact (``type`` alone never does)."""


class SchemaFacts:
    """The facts of one schema (or subtree).

    - ``xgr``: xgrammar's cost terms, in order: ``("L", count, weight, key, bounds)`` a string
      length bound (``bounds``: the node's minLength and maxLength, which rule it makes), ``("P", pattern)``, ``("E", values)`` an enum, ``("O", optional)`` properties;
    - ``g_items``: ``minItems`` / ``maxItems`` counts, in order (llguidance);
    - ``xgr_unsupported``, ``pattern_properties``, ``guidance_rejects``: what vLLM's ``auto``
      routing reads (any object);
    - ``not_if``: an object has ``not`` or ``if`` (outlines-core refuses the schema);
    - ``bound``: the largest nested-bound product from the root, or None when a ``$ref`` must
      be followed.
    """

    __slots__ = (
        "bound",
        "g_items",
        "guidance_rejects",
        "not_if",
        "pattern_properties",
        "xgr",
        "xgr_unsupported",
    )

    def __init__(self) -> None:
        self.xgr: list[tuple[Any, ...]] = []
        self.g_items: list[int] = []
        self.xgr_unsupported = False
        self.pattern_properties = False
        self.guidance_rejects = False
        self.not_if = False
        self.bound: int | None = 1

    def extend(self, other: SchemaFacts) -> None:
        """Append a subtree's facts (its bound is combined by the caller)."""
        self.xgr.extend(other.xgr)
        self.g_items.extend(other.g_items)
        self.xgr_unsupported = self.xgr_unsupported or other.xgr_unsupported
        self.pattern_properties = self.pattern_properties or other.pattern_properties
        self.guidance_rejects = self.guidance_rejects or other.guidance_rejects
        self.not_if = self.not_if or other.not_if


def count_of(value: Any) -> int | None:
    """A count keyword's value as the estimates read it (None: not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(max(0, min(value, 1e12)))  # clamped before int(): -Infinity and NaN parse as JSON


def _types(node: Mapping[str, Any]) -> set[str]:
    t = node.get("type")
    if isinstance(t, str):
        return {t}
    if isinstance(t, list):
        return {x for x in t if isinstance(x, str)}
    return set()


def _pattern_and_length(node: Mapping[str, Any]) -> bool:
    return ("pattern" in node or "format" in node) and ("minLength" in node or "maxLength" in node)


def _unsupported_format(fmt: Any) -> bool:
    try:
        return fmt not in _STRING_FORMATS
    except TypeError:  # an unhashable "format" (a list or an object) is no known format
        return True


def xgrammar_unsupported_node(node: Mapping[str, Any]) -> bool:
    """vLLM's ``has_xgrammar_unsupported_json_features`` for one node, plus what xgrammar's
    ``Grammar.from_json_schema`` itself raises on (measured)."""
    types = _types(node)
    if types & {"integer", "number"} and "multipleOf" in node:
        return True
    if "array" in types and any(
        k in node for k in ("uniqueItems", "contains", "minContains", "maxContains")
    ):
        return True
    if "string" in types:
        if "format" in node and _unsupported_format(node.get("format")):
            return True
        if _pattern_and_length(node):
            return True
    if "object" in types:
        if "propertyNames" in node:
            names = node.get("propertyNames")
            if isinstance(names, Mapping) and _pattern_and_length(names):
                return True
            if "patternProperties" in node or "properties" in node:
                return True
            if node.get("unevaluatedProperties", True) is not True:
                return True
        pp = node.get("patternProperties")
        if isinstance(pp, Mapping) and ("properties" in node or len(pp) > 1):
            return True
    all_of = node.get("allOf")
    if isinstance(all_of, list) and len(all_of) >= 2:
        return True
    pattern = node.get("pattern")
    if isinstance(pattern, str) and xgrammar_rejects_regex(pattern):
        return True
    props = node.get("properties")
    min_props = node.get("minProperties")
    if (
        isinstance(min_props, int)
        and not isinstance(min_props, bool)
        and min_props > (len(props) if isinstance(props, Mapping) else 0)
        and node.get("additionalProperties", False) is False
    ):
        return True
    ref = node.get("$ref")
    return isinstance(ref, str) and not ref.startswith("#")


def guidance_rejects_node(node: Mapping[str, Any]) -> bool:
    if not _GUIDANCE_UNIMPLEMENTED.isdisjoint(node):
        return True
    pattern = node.get("pattern")
    if isinstance(pattern, str) and guidance_rejects_regex(pattern):
        return True
    ref = node.get("$ref")
    if isinstance(ref, str) and not ref.startswith("#"):
        return True
    return node.get("format") == "regex"


_GUIDANCE_KEYS = _GUIDANCE_UNIMPLEMENTED | frozenset({"pattern", "$ref", "format"})
_XGR_TERM_KEYS = frozenset({"maxLength", "minLength", "pattern", "enum", "properties"})


def add_node(node: Mapping[str, Any], f: SchemaFacts) -> None:
    """Add one object's facts (call it only when the object has a key in :data:`FACT_KEYS`)."""
    if not f.xgr_unsupported and not _XGR_KEYS.isdisjoint(node):
        f.xgr_unsupported = xgrammar_unsupported_node(node)
    if "patternProperties" in node:
        f.pattern_properties = True
    if not f.guidance_rejects and not _GUIDANCE_KEYS.isdisjoint(node):
        f.guidance_rejects = guidance_rejects_node(node)
    if "not" in node or "if" in node:
        f.not_if = True
    if not _XGR_TERM_KEYS.isdisjoint(node):
        # xgrammar, in the order its estimate adds them
        # the node's (minLength, maxLength): xgrammar builds one rule per distinct pair and
        # shares it between strings with the same bounds (twelve maxLength-100 strings: 2.2 s
        # at 100k, like one; twelve of distinct bounds: 29.5 s)
        bounds = (node.get("minLength"), node.get("maxLength"))
        for key, weight in (("maxLength", 1.0), ("minLength", 0.35)):
            if key in node:
                count = count_of(node[key])
                if count is not None and count >= 2:
                    f.xgr.append(("L", count, weight, key, repr(bounds)))
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            f.xgr.append(("P", pattern))
        enum = node.get("enum")
        if isinstance(enum, list):
            f.xgr.append(("E", len(enum)))
        props = node.get("properties")
        if isinstance(props, Mapping):
            required = node.get("required")
            req = {r for r in required if isinstance(r, str)} if isinstance(required, list) else ()
            f.xgr.append(("O", sum(1 for k in props if k not in req)))
    # llguidance
    if "minItems" in node or "maxItems" in node:
        for key in _ARRAY_KEYS:
            if key in node:
                count = count_of(node[key])
                if count:
                    f.g_items.append(count)


Memo = dict[int, tuple[Any, SchemaFacts]]
"""Facts already gathered, by ``id`` of the object (kept alive beside them)."""


def facts_of(schema: Any, memo: Memo | None = None) -> SchemaFacts:
    """The facts of ``schema`` (any JSON value), reusing those of any subtree in ``memo``."""
    if memo is not None:
        got = memo.get(id(schema))
        if got is not None and got[0] is schema:
            return got[1]
    f = SchemaFacts()
    best = 1
    # (value, product above it; 0: outside the nested-bound walk)
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, product = stack.pop()
        if memo is not None and node is not schema:
            got = memo.get(id(node))
            if got is not None and got[0] is node:
                sub = got[1]
                f.extend(sub)
                if product:
                    if sub.bound is None:
                        f.bound = None
                    else:
                        best = max(best, min(BOUND_CAP, product * sub.bound))
                continue
        t = type(node)
        if t is dict or (t is not list and isinstance(node, Mapping)):
            here = product
            if not FACT_KEYS.isdisjoint(node):
                add_node(node, f)
                if product:
                    if isinstance(node.get("$ref"), str):
                        f.bound = None
                    here = bound_here(node, product)
                    if here > best:
                        best = here
            for key, value in node.items():
                if _is_container(value):
                    stack.append((value, 0 if key in BOUND_SKIP else here))
        elif t is list or t is tuple:
            stack.extend((value, product) for value in node if _is_container(value))
    if f.bound is not None:
        f.bound = best
    return f


_SCALARS = frozenset({str, int, float, bool, type(None)})


def _is_container(value: Any) -> bool:
    t = type(value)
    if t is dict or t is list:
        return True
    return t not in _SCALARS and isinstance(value, Mapping | list | tuple)

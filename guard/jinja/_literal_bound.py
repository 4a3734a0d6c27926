"""The most literal text a chat template can print: its longest path through its static strings.

When no render of a conversation succeeds, the prompt count falls back to a bound: every field
the request carries counted once, plus what the template prints of its own. The second part is
read from the template's syntax tree (:func:`literal_program`), once per template:

- text between tags and string constants in ``{{ ... }}`` (and in ``{% set %}`` values, as if
  printed once) are literals; an ``if`` takes its longest branch, a conditional expression too;
- a ``for`` loop repeats its body as many times as the collection it walks can hold:
  ``messages`` (and names assigned from it), ``tools``, ``documents``, a message's ``content``
  parts or ``tool_calls``, ``range(N)`` for a constant N, and anything else (``.items()`` of a
  schema, a list built in the template) the largest list or mapping in the request
  (:class:`LoopSizes`); ``join``/``replace`` separators repeat the same way;
- a macro call prints the macro's body (a recursive macro repeats it as a loop); ``caller()``
  the call block's body; ``strftime_now(f)`` a long date in format ``f``.

Printing each literal once per pass bounds the template's own text for templates that do not
build text out of loops over characters; tokens are weighed per literal plus one for a token
merged across each edge (:meth:`LiteralProgram.weighed`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, Union

import jinja2
import jinja2.nodes as nodes
from jinja2.ext import loopcontrols

__all__ = ["LiteralProgram", "LoopSizes", "literal_program"]

LoopKind = Literal["messages", "tools", "documents", "parts", "calls", "items"]


@dataclass(frozen=True, slots=True)
class LoopSizes:
    """How many times each kind of loop can run for one request."""

    messages: int = 0
    tools: int = 0
    documents: int = 0
    parts: int = 0  # most content parts in one message
    calls: int = 0  # most tool calls in one message
    items: int = 0  # the largest list or mapping anywhere in the request

    def of(self, kind: LoopKind | int) -> int:
        if isinstance(kind, int):
            return kind
        value: int = getattr(self, kind)
        # Other loops may walk lists the template builds itself: at least one pass.
        return max(value, 1) if kind == "items" else value


# The program: literals, sequences, longest-of alternatives, loops.
@dataclass(frozen=True, slots=True)
class _Lit:
    text: str


@dataclass(frozen=True, slots=True)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Alt:
    items: tuple[_Node, ...]


@dataclass(frozen=True, slots=True)
class _Loop:
    kind: LoopKind | int
    body: _Node


_Node = Union[_Lit, _Seq, _Alt, _Loop]  # noqa: UP007 (a runtime alias of dataclasses)
_EMPTY = _Seq(())
# Most iterations read from a constant range(): beyond it, the request's sizes decide.
_MAX_CONST_RANGE = 1 << 16
# A date whose names are the longest (Wednesday, September), for strftime_now.
_LONG_DATE = datetime(2026, 9, 30, 23, 59, 59)


def _seq(items: Iterable[_Node]) -> _Node:
    kept = tuple(i for i in items if i != _EMPTY)
    return kept[0] if len(kept) == 1 else _Seq(kept)


def _alt(items: Iterable[_Node]) -> _Node:
    kept = tuple(items)
    if all(i == _EMPTY for i in kept):
        return _EMPTY
    return _Alt(kept)


class LiteralProgram:
    """A template's literal text as a program over :class:`LoopSizes`."""

    def __init__(self, root: _Node) -> None:
        self._root = root

    def literals(self) -> set[str]:
        out: set[str] = set()
        stack: list[_Node] = [self._root]
        while stack:
            node = stack.pop()
            if isinstance(node, _Lit):
                out.add(node.text)
            elif isinstance(node, _Seq | _Alt):
                stack.extend(node.items)
            else:
                stack.append(node.body)
        return out

    def weighed(self, weigh: Callable[[str], int]) -> Callable[[LoopSizes], int]:
        """An evaluator of the bound, each literal weighed once by ``weigh`` (plus one edge)."""
        weights = {text: weigh(text) + 1 for text in self.literals() if text}
        root = self._root

        def bound(sizes: LoopSizes) -> int:
            return _evaluate(root, sizes, weights, {})

        return bound


def _evaluate(node: _Node, sizes: LoopSizes, weights: dict[str, int], memo: dict[int, int]) -> int:
    key = id(node)
    cached = memo.get(key)
    if cached is not None:
        return cached
    if isinstance(node, _Lit):
        value = weights.get(node.text, 0)
    elif isinstance(node, _Seq):
        value = sum(_evaluate(i, sizes, weights, memo) for i in node.items)
    elif isinstance(node, _Alt):
        value = max((_evaluate(i, sizes, weights, memo) for i in node.items), default=0)
    else:
        value = sizes.of(node.kind) * _evaluate(node.body, sizes, weights, memo)
    memo[key] = value
    return value


# -- from the syntax tree ------------------------------------------------------------------------

_ENVIRONMENT = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
_NAMED_KINDS: dict[str, LoopKind] = {
    "messages": "messages",
    "tools": "tools",
    "documents": "documents",
}
_KEYED_KINDS: dict[str, LoopKind] = {"content": "parts", "tool_calls": "calls"}


def _unwrap(node: nodes.Node) -> nodes.Node:
    """The collection under filters, tests and slices (``messages[1:] | reverse``)."""
    while True:
        inner: nodes.Node | None = None
        if isinstance(node, nodes.Filter | nodes.Test) or (
            isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)
        ):
            inner = node.node
        if inner is None:
            return node
        node = inner


class _Builder:
    def __init__(self, root: nodes.Template) -> None:
        self._macros = {m.name: m for m in root.find_all(nodes.Macro)}
        self._built: dict[str, _Node] = {}
        self._building: set[str] = set()
        self._recursive: set[str] = set()
        self._callers: list[_Node] = []
        self._aliases = self._collection_aliases(root)

    @staticmethod
    def _collection_aliases(root: nodes.Template) -> dict[str, LoopKind]:
        """Names assigned from messages, tools or documents (``loop_messages = messages[1:]``)."""
        aliases: dict[str, LoopKind] = dict(_NAMED_KINDS)
        changed = True
        while changed:
            changed = False
            for assign in root.find_all(nodes.Assign):
                target, value = assign.target, _unwrap(assign.node)
                if (
                    isinstance(target, nodes.Name)
                    and isinstance(value, nodes.Name)
                    and value.name in aliases
                    and target.name not in aliases
                ):
                    aliases[target.name] = aliases[value.name]
                    changed = True
        return aliases

    def loop_kind(self, iterable: nodes.Node) -> LoopKind | int:
        node = _unwrap(iterable)
        if isinstance(node, nodes.Name):
            return self._aliases.get(node.name, "items")
        if isinstance(node, nodes.Getattr):
            return _KEYED_KINDS.get(node.attr, "items")
        if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            return _KEYED_KINDS.get(str(node.arg.value), "items")
        if (
            isinstance(node, nodes.Call)
            and isinstance(node.node, nodes.Name)
            and node.node.name == "range"
            and node.args
            and all(isinstance(a, nodes.Const) and isinstance(a.value, int) for a in node.args)
        ):
            bounds = [int(a.value) for a in node.args if isinstance(a, nodes.Const)]
            span = bounds[0] if len(bounds) == 1 else bounds[1] - bounds[0]
            if 0 <= span <= _MAX_CONST_RANGE:
                return span
        return "items"

    # statements

    def body(self, statements: Iterable[nodes.Node]) -> _Node:
        return _seq(self.statement(s) for s in statements)

    def statement(self, node: nodes.Node) -> _Node:
        if isinstance(node, nodes.Output):
            return _seq(
                _Lit(child.data) if isinstance(child, nodes.TemplateData) else self.expr(child)
                for child in node.nodes
            )
        if isinstance(node, nodes.If):
            branches = [self.body(node.body)]
            branches += [self.body(e.body) for e in node.elif_]
            branches.append(self.body(node.else_))
            return _alt(branches)
        if isinstance(node, nodes.For):
            loop = _Loop(self.loop_kind(node.iter), self.body(node.body))
            return _alt([loop, self.body(node.else_)]) if node.else_ else loop
        if isinstance(node, nodes.Assign):
            return self.expr(node.node)
        if isinstance(node, nodes.CallBlock):
            self._callers.append(self.body(node.body))
            try:
                return self.expr(node.call)
            finally:
                self._callers.pop()
        if isinstance(node, nodes.With):
            return _seq([*(self.expr(v) for v in node.values), self.body(node.body)])
        if isinstance(node, nodes.Macro | nodes.ExprStmt):
            return _EMPTY  # a macro prints where it is called; `do` prints nothing
        body = getattr(node, "body", None)
        if isinstance(body, list):  # blocks, filter blocks, scopes, set blocks
            return self.body(body)
        return _EMPTY

    # expressions

    def expr(self, node: nodes.Node) -> _Node:
        if isinstance(node, nodes.Const):
            return _Lit(node.value if isinstance(node.value, str) else str(node.value))
        if isinstance(node, nodes.CondExpr):
            return _alt(
                [self.expr(node.expr1), _EMPTY if node.expr2 is None else self.expr(node.expr2)]
            )
        if isinstance(node, nodes.Or | nodes.And):
            return _alt([self.expr(node.left), self.expr(node.right)])
        if isinstance(node, nodes.Mul):
            for times, text in ((node.left, node.right), (node.right, node.left)):
                if isinstance(times, nodes.Const) and isinstance(times.value, int):
                    return _Loop(max(0, min(times.value, _MAX_CONST_RANGE)), self.expr(text))
            return _Loop("items", _seq([self.expr(node.left), self.expr(node.right)]))
        if isinstance(node, nodes.Compare | nodes.Test | nodes.Not):
            return _EMPTY  # a boolean
        if isinstance(node, nodes.Filter):
            inner = _EMPTY if node.node is None else self.expr(node.node)
            args = [self.expr(a) for a in node.args] + [self.expr(k.value) for k in node.kwargs]
            if node.name in ("join", "replace"):  # a separator per item, a replacement per match
                return _seq([inner, _Loop("items", _seq(args))])
            return _seq([inner, *args])
        if isinstance(node, nodes.Call):
            return self.call(node)
        if isinstance(node, nodes.Getattr | nodes.Getitem):
            return self.expr(node.node)
        if isinstance(node, nodes.Concat):
            return _seq(self.expr(n) for n in node.nodes)
        if isinstance(node, nodes.BinExpr):
            return _seq([self.expr(node.left), self.expr(node.right)])
        if isinstance(node, nodes.List | nodes.Tuple):
            return _seq(self.expr(n) for n in node.items)
        if isinstance(node, nodes.Dict):
            return _seq(_seq([self.expr(p.key), self.expr(p.value)]) for p in node.items)
        return _EMPTY  # names, loop variables, slices: the request's values, counted elsewhere

    def call(self, node: nodes.Call) -> _Node:
        args = [self.expr(a) for a in node.args] + [self.expr(k.value) for k in node.kwargs]
        target = node.node
        if isinstance(target, nodes.Name):
            if target.name in self._macros:
                return _seq([self.macro(target.name), *args])
            if target.name == "caller":
                return self._callers[-1] if self._callers else _EMPTY
            if target.name == "raise_exception":
                return _EMPTY  # the render stops
            if target.name == "strftime_now":
                formats = [a.value for a in node.args if isinstance(a, nodes.Const)]
                if formats and isinstance(formats[0], str):
                    return _Lit(_LONG_DATE.strftime(formats[0]))
                return _Loop("items", _Lit(" "))
        if isinstance(target, nodes.Getattr):
            inner = self.expr(target.node)
            if target.attr in ("join", "replace"):
                return _seq([inner, _Loop("items", _seq(args))])
            return _seq([inner, *args])
        return _seq(args)

    def macro(self, name: str) -> _Node:
        built = self._built.get(name)
        if built is not None:
            return built
        if name in self._building:
            self._recursive.add(name)
            return _EMPTY  # counted by repeating the macro's body as a loop
        self._building.add(name)
        try:
            body = self.body(self._macros[name].body)
        finally:
            self._building.discard(name)
        if name in self._recursive:
            body = _Loop("items", body)
        self._built[name] = body
        return body


@functools.lru_cache(maxsize=64)
def literal_program(source: str) -> LiteralProgram:
    """The literal text of ``source`` as a :class:`LiteralProgram` (raises
    jinja2.TemplateSyntaxError when the template does not parse)."""
    root = _ENVIRONMENT.parse(source)
    return LiteralProgram(_Builder(root).body(root.body))

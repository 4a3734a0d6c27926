"""Expanding parsed ``{{name}}`` templates, iteratively, charging the work to a Budget.

One explicit stack of frames replaces recursion. A placeholder pushes a *name* frame that renders
its parts into a name buffer (so ``{{ {{lang}}_greeting }}`` resolves ``lang`` first); when the
name is complete, the frame is replaced by an *expansion* frame that renders the variable's value,
itself a template, into wherever the placeholder stood. The nesting depth of a placeholder is the
number of name and expansion frames around it: nesting in the text and nesting through variable
values count against the same limit.

The :class:`RenderPolicy` holds every difference between the profiles; the code is the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from guard.budget import Budget
from guard.errors import LimitExceeded, TemplateError
from guard.template_scan import TEMPLATE_DEPTH_EXCEEDED, check_template

from ._placeholder_syntax import Arena, TemplatePart, Text, parse

# Error codes introduced here (the scan adds template_depth_exceeded and template_unbalanced).
TEMPLATE_TOO_LARGE = "template_too_large"
TEMPLATE_RECURSION = "template_recursion"
TEMPLATE_UNKNOWN_VARIABLE = "template_unknown_variable"
TEMPLATE_NAME_TOO_LONG = "template_name_too_long"
TEMPLATE_VARIABLE_INVALID = "template_variable_invalid"

TEMPLATE_PARAM = "prompt_template"
# Variable names in messages and `param` are cut to this many characters.
_SHOWN_NAME_CHARS = 64


@dataclass(frozen=True, slots=True)
class RenderPolicy:
    """The parsing choices and limits of one profile. ``None`` is unlimited."""

    # Tolerate unclosed openers by backtracking (and stray closers as text), or reject them.
    lenient: bool
    # Scan delimiters (guard.template_scan) before parsing anything.
    scan_first: bool
    # Nesting depth, in the text and through variable values together.
    max_depth: int | None
    # UTF-8 bytes read as template source: the template plus every variable value it expands.
    max_source_bytes: int | None
    # Unknown variables raise (else they render as "", as Mustache does).
    strict_variables: bool
    # A variable expanded inside its own expansion raises (else it expands forever).
    detect_cycles: bool
    # Longest variable name (after expanding inner placeholders) before giving up.
    max_name_chars: int | None


class _Sink:
    """Where rendered text goes: the prompt itself, or the name of an enclosing placeholder."""

    __slots__ = ("chars", "is_output", "parts")

    def __init__(self, is_output: bool) -> None:
        self.parts: list[str] = []
        self.chars = 0
        self.is_output = is_output


class _RenderFrame:
    __slots__ = ("index", "nodes", "sink", "target", "variable")

    def __init__(
        self,
        nodes: list[TemplatePart],
        sink: _Sink,
        *,
        target: _Sink | None = None,
        variable: str | None = None,
    ) -> None:
        self.nodes = nodes
        self.index = 0
        self.sink = sink
        # Set on name frames: the sink the variable's value will be rendered into.
        self.target = target
        # Set on expansion frames: the variable being expanded.
        self.variable = variable


def _shown(name: str) -> str:
    return name if len(name) <= _SHOWN_NAME_CHARS else name[:_SHOWN_NAME_CHARS] + "…"


class _Engine:
    def __init__(self, variables: Mapping[str, str], policy: RenderPolicy, budget: Budget) -> None:
        self.variables = variables
        self.policy = policy
        self.budget = budget
        self.arena = Arena()
        self.source_bytes = 0
        self.parsed: dict[str, list[TemplatePart]] = {}

    # ------------------------------------------------------------------------------- sources

    def load(self, source: str, param: str) -> list[TemplatePart]:
        """Check (per the policy) and parse one template source: the template or a value."""
        policy = self.policy
        limit = policy.max_source_bytes
        if limit is not None:
            remaining = limit - self.source_bytes
            # len() is a lower bound on the UTF-8 length: refuse a huge source without encoding.
            size = len(source)
            if size <= remaining and not source.isascii():
                size = len(source.encode("utf-8", "surrogatepass"))
            if size > remaining:
                raise LimitExceeded(
                    TEMPLATE_TOO_LARGE,
                    f"template source exceeds {limit} bytes (the template and the variable "
                    "values it expands count together)",
                    param=param,
                )
            self.source_bytes += size
        if policy.scan_first:
            scan = check_template(source, max_depth=policy.max_depth, param=param)
            # Parsing costs a step per placeholder: charge it up front, so a template with more
            # placeholders than the budget allows is refused before the parser loops over them.
            self.budget.charge_steps(scan.placeholders)
        return parse(source, self.arena, lenient=policy.lenient)

    def value_nodes(self, name: str, value: object) -> list[TemplatePart]:
        nodes = self.parsed.get(name)
        if nodes is None:
            if not isinstance(value, str):
                if self.policy.strict_variables:
                    raise TemplateError(
                        TEMPLATE_VARIABLE_INVALID,
                        f"template variable {_shown(name)!r} must be a string, "
                        f"not {type(value).__name__}",
                        param=_shown(name),
                    )
                value = str(value)
            nodes = self.load(value, _shown(name))
            self.parsed[name] = nodes
        return nodes

    # ------------------------------------------------------------------------------ emitting

    def emit(self, text: str, sink: _Sink) -> None:
        if sink.is_output:
            # Charged before it is kept: the budget stops the expansion at its token limit.
            self.budget.charge_text(text)
            self.arena.tokens += text.encode("utf-8", "surrogatepass")
        else:
            limit = self.policy.max_name_chars
            if limit is not None and sink.chars + len(text) > limit:
                raise LimitExceeded(
                    TEMPLATE_NAME_TOO_LONG,
                    f"a template variable name grew past {limit} characters",
                )
        sink.parts.append(text)
        sink.chars += len(text)

    def check_depth(self, depth: int) -> None:
        limit = self.policy.max_depth
        if limit is not None and depth > limit:
            raise LimitExceeded(
                TEMPLATE_DEPTH_EXCEEDED,
                f"template nesting depth {depth} exceeds the limit of {limit} "
                "(placeholders in variable values count too)",
            )
        self.budget.check_depth(depth)

    # ----------------------------------------------------------------------------- rendering

    def render(self, root: list[TemplatePart]) -> tuple[str, int]:
        policy = self.policy
        budget = self.budget
        variables = self.variables
        output = _Sink(is_output=True)
        stack = [_RenderFrame(root, output)]
        expanding: list[str] = []  # variables being expanded, outermost first (cycle checks)
        resolved = 0
        while stack:
            frame = stack[-1]
            if frame.index < len(frame.nodes):
                node = frame.nodes[frame.index]
                frame.index += 1
                budget.charge_steps()
                if isinstance(node, Text):
                    self.emit(node.text, frame.sink)
                else:
                    self.check_depth(len(stack))
                    stack.append(
                        _RenderFrame(node.parts, _Sink(is_output=False), target=frame.sink)
                    )
                continue
            stack.pop()
            budget.charge_steps()
            if frame.variable is not None:
                if policy.detect_cycles:
                    expanding.pop()
                continue
            if frame.target is None:
                continue  # the root
            name = "".join(frame.sink.parts).strip()
            resolved += 1
            value = variables.get(name)
            if value is None:
                if policy.strict_variables:
                    raise TemplateError(
                        TEMPLATE_UNKNOWN_VARIABLE,
                        f"unknown template variable {_shown(name)!r}",
                        param=_shown(name),
                    )
                continue  # renders as ""
            if policy.detect_cycles:
                if name in expanding:
                    cycle = " -> ".join(_shown(v) for v in [*expanding, name])
                    raise TemplateError(
                        TEMPLATE_RECURSION,
                        f"template variable {_shown(name)!r} expands into itself: {cycle}",
                        param=_shown(name),
                    )
                expanding.append(name)
            # The value takes the place of the name frame, at the same depth.
            stack.append(_RenderFrame(self.value_nodes(name, value), frame.target, variable=name))
        return "".join(output.parts), resolved


def render_template(
    template: str, variables: Mapping[str, str], policy: RenderPolicy, budget: Budget
) -> tuple[str, int, Arena]:
    """Parse and expand ``template``; return the text, placeholders resolved and the arena."""
    engine = _Engine(variables, policy, budget)
    root = engine.load(template, TEMPLATE_PARAM)
    text, resolved = engine.render(root)
    return text, resolved, engine.arena

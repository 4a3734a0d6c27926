"""The hardened Jinja sandbox: an ``ImmutableSandboxedEnvironment`` whose every costly step is metered.

What the stock sandbox leaves open, and where it is closed here:

- arithmetic: all binary operators are intercepted (``call_binop``), so ``*``, ``**``, ``+`` and
  ``%`` are sized before they run, and nothing is folded at compile time (intercepted operators
  are never folded, and the optimizer is off, so ``{{ 10**(10**7) }}`` costs nothing to compile);
- ``~`` concatenation, slicing, output conversion and block buffers do not go through the
  environment in stock Jinja; the code generator here routes them through sized hooks;
- loops: every ``{% for %}`` iterable (and every recursive ``loop()`` call and every filter that
  iterates) is wrapped in a counting iterator charged to one budget for the whole render, so
  nested loops that print nothing are stopped as well;
- calls (macros included) count as iterations and their depth is capped;
- filters, ``str`` methods and ``str.format`` check their sizing arguments first;
- output is charged chunk by chunk as ``generate()`` yields it, with a deadline.
"""

from __future__ import annotations

import types
from collections.abc import Generator, Iterable, Iterator
from functools import update_wrapper
from string import Formatter
from typing import Any, cast

from jinja2 import nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.environment import Template
from jinja2.exceptions import SecurityError
from jinja2.ext import loopcontrols
from jinja2.runtime import Context, LoopContext, Macro, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from markupsafe import EscapeFormatter, Markup, escape

from guard.errors import FormatRefused, TemplateError
from guard.jinja._filters import (
    check_method_call,
    check_printf,
    check_text,
    guarded_filters,
    guarded_range,
    guarded_strftime_now,
    raise_exception,
)
from guard.jinja._meters import (
    CODE_SECURITY,
    DEFAULT_LIMITS,
    ITEM_WEIGHT,
    ChatTemplateLimits,
    RenderState,
    active_state,
    current_state,
    reset_state,
    set_state,
    value_too_large,
)
from guard.jinja._sizes import Mode, check_format_spec, size_bound

ALL_BINOPS = frozenset({"+", "-", "*", "/", "//", "%", "**"})
_SEQUENCES = (str, bytes, list, tuple)


class GuardedCodeGenerator(CodeGenerator):
    """Routes the operations stock Jinja inlines through the environment's sized hooks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._loop_iters: set[int] = set()

    def visit_Template(self, node: nodes.Template, frame: Frame | None = None) -> None:
        # Every {% for %} iterable is written as environment.guard_iter(<iterable>). Jinja forbids
        # custom node types, so the iterables are recognised by identity in visit().
        self._loop_iters = {id(loop.iter) for loop in node.find_all(nodes.For)}
        super().visit_Template(node, frame)

    def visit(self, node: nodes.Node, *args: Any, **kwargs: Any) -> Any:
        if id(node) in self._loop_iters:
            self.write("environment.guard_iter(")
            result = super().visit(node, *args, **kwargs)
            self.write(")")
            return result
        return super().visit(node, *args, **kwargs)

    def _escape_flag(self, frame: Frame, volatile_expr: str) -> str:
        # The same runtime/compile-time choice stock Jinja makes between escaping or not.
        if frame.eval_ctx.volatile:
            return volatile_expr
        return "True" if frame.eval_ctx.autoescape else "False"

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:
        # Stock Jinja tests eval_ctx.volatile here (not autoescape); kept as it is.
        self.write(
            f"environment.guard_concat({self._escape_flag(frame, 'context.eval_ctx.volatile')}, ("
        )
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")

    def visit_Getitem(self, node: nodes.Getitem, frame: Frame) -> None:
        if not isinstance(node.arg, nodes.Slice):
            super().visit_Getitem(node, frame)
            return
        # Slices bypass environment.getitem in stock Jinja; here they are sized.
        self.write("environment.guard_slice(")
        self.visit(node.node, frame)
        for part in (node.arg.start, node.arg.stop, node.arg.step):
            self.write(", ")
            if part is None:
                self.write("None")
            else:
                self.visit(part, frame)
        self.write(")")

    def buffer(self, frame: Frame) -> None:
        frame.buffer = self.temporary_identifier()
        self.writeline(f"{frame.buffer} = environment.guard_buffer()")

    def _output_child_to_const(self, node: nodes.Expr, frame: Frame, finalize: Any) -> str:
        # Evaluate nothing at compile time but literal template text.
        if not isinstance(node, nodes.TemplateData):
            raise nodes.Impossible()
        return super()._output_child_to_const(node, frame, finalize)

    def _output_child_pre(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        flag = self._escape_flag(frame, "context.eval_ctx.autoescape")
        self.write(f"environment.guard_output({flag}, ")

    def _output_child_post(self, node: nodes.Expr, frame: Frame, finalize: Any) -> None:
        self.write(")")


class _GuardedBuffer(list[str]):
    """A macro/block output buffer that charges what is appended to it."""

    __slots__ = ("_state",)

    def __init__(self, state: RenderState) -> None:
        super().__init__()
        self._state = state

    def append(self, item: str) -> None:
        self._state.materialize(len(item) + ITEM_WEIGHT)
        super().append(item)

    def extend(self, items: Iterable[str]) -> None:
        for item in items:
            self.append(item)


class _GuardedFormatter(SandboxedFormatter):
    """``str.format`` with field count, widths, conversions and total length checked."""

    def __init__(self, env: Any, state: RenderState, **kwargs: Any) -> None:
        super().__init__(env, **kwargs)
        self._state = state
        self._total = 0

    def vformat(self, format_string: str, args: Any, kwargs: Any) -> str:
        fields = format_string.count("{")
        if fields > 2 * self._state.limits.max_format_fields:
            raise value_too_large(
                f"str.format with more than {self._state.limits.max_format_fields} fields"
            )
        self._total = len(format_string)
        self._state.check_chars(self._total, "str.format")
        return super().vformat(format_string, args, kwargs)

    def convert_field(self, value: Any, conversion: str | None) -> Any:
        if conversion in ("r", "a", "s"):
            limit = self._state.limits.max_value_chars
            mode: Mode = "str" if conversion == "s" else "repr"
            self._state.check_chars(size_bound(value, limit, mode=mode), "str.format")
        return super().convert_field(value, conversion)

    def format_field(self, value: Any, format_spec: str) -> Any:
        state = self._state
        try:
            check_format_spec(format_spec, state.limits.max_width)
        except FormatRefused as exc:
            raise value_too_large(f"str.format: {exc}") from None
        if not isinstance(value, (str, int, float)):
            check_text(state, value, "str.format")
        rv = super().format_field(value, format_spec)
        self._total += len(rv)
        state.check_chars(self._total, "str.format")
        return rv


class _GuardedEscapeFormatter(_GuardedFormatter, EscapeFormatter):
    pass


class GuardedTemplate(Template):
    """A template whose ``generate``/``render`` always run under a :class:`RenderState`.

    The chat-template API sets up the state (with the request's Budget); used directly, a
    template gets a fresh state with its environment's default limits.
    """

    environment: HardenedEnvironment

    def generate(self, *args: Any, **kwargs: Any) -> Iterator[str]:
        state = active_state()
        owned = state is None
        if state is None:
            state = RenderState(self.environment.default_limits)
        inner = cast(Generator[str, None, None], super().generate(*args, **kwargs))
        try:
            while True:
                token = set_state(state) if owned else None
                try:
                    chunk = next(inner)
                except StopIteration:
                    return
                finally:
                    if token is not None:
                        reset_state(token)
                state.emit(chunk)
                yield chunk
        finally:
            inner.close()

    def render(self, *args: Any, **kwargs: Any) -> str:
        return "".join(self.generate(*args, **kwargs))


class HardenedEnvironment(ImmutableSandboxedEnvironment):
    """The hardened sandbox, configured as Hugging Face configures its chat-template sandbox."""

    intercepted_binops = ALL_BINOPS
    code_generator_class = GuardedCodeGenerator
    template_class = GuardedTemplate

    def __init__(self, default_limits: ChatTemplateLimits = DEFAULT_LIMITS) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[loopcontrols],
            optimized=False,
            cache_size=0,
            auto_reload=False,
        )
        self.default_limits = default_limits
        self.filters = guarded_filters(self.filters)
        self.globals.pop("lipsum", None)
        self.globals["range"] = guarded_range
        self.globals["raise_exception"] = raise_exception
        self.globals["strftime_now"] = guarded_strftime_now

    # -- hooks called by the generated code

    def guard_iter(self, iterable: Any) -> Iterator[Any]:
        return current_state().counted(iterable)

    def guard_output(self, autoescape: bool, value: Any) -> str:
        if type(value) is str and not autoescape:
            return value
        state = current_state()
        if not isinstance(value, (str, int, float)):
            check_text(state, value, "output")
        text: str = escape(value) if autoescape else str(value)
        state.check_chars(len(text), "output")
        state.materialize(len(text))
        return text

    def guard_concat(self, markup: bool, parts: tuple[Any, ...]) -> str:
        state = current_state()
        state.tick()
        limit = state.limits.max_value_chars
        total = 0
        for part in parts:
            total += len(part) if type(part) is str else size_bound(part, limit - total)
            state.check_chars(total, "the ~ operator")
        result: str = markup_join(parts) if markup else str_join(parts)
        state.check_chars(len(result), "the ~ operator")  # escaping may have lengthened it
        state.materialize(len(result))
        return result

    def guard_slice(self, obj: Any, start: Any, stop: Any, step: Any) -> Any:
        state = current_state()
        state.tick()
        result = obj[start:stop:step]
        if isinstance(result, _SEQUENCES):
            state.check_result(result, "a slice")
        return result

    def guard_buffer(self) -> list[str]:
        return _GuardedBuffer(current_state())

    def concat(self, parts: Iterable[str]) -> str:
        """Joins a macro's or block's buffer; sized as it goes."""
        state = current_state()
        limit = state.limits.max_value_chars
        total = 0
        collected: list[str] = []
        for part in parts:
            total += len(part)
            if total > limit:
                state.check_chars(total, "a block's output")
            collected.append(part)
        result = "".join(collected)
        state.materialize(len(result))
        return result

    # -- sandbox overrides

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        state = current_state()
        state.tick()
        if operator == "*":
            _check_mul(state, left, right)
        elif operator == "**":
            _check_pow(state, left, right)
        elif operator == "+":
            _check_add(state, left, right)
        elif operator == "%":
            if isinstance(left, str):
                check_printf(state, left, right, "the % operator")
            elif isinstance(left, bytes):
                raise TemplateError(CODE_SECURITY, "bytes formatting is not available")
        result = self.binop_table[operator](left, right)
        return state.check_result(result, f"the {operator} operator")

    def call(
        self, context: Context, obj: Any, /, *args: Any, **kwargs: Any
    ) -> Any:  # the sandbox's hook for every call a template makes
        state = current_state()
        if not self.is_safe_callable(obj):
            raise SecurityError(f"{obj!r} is not safely callable")
        if isinstance(obj, LoopContext) and args:
            # A recursive loop's loop(children): its items are iterations too.
            args = (state.counted(args[0]), *args[1:])
        args, makes_value = check_method_call(state, obj, args, kwargs)
        state.enter_call()
        try:
            result = context.call(obj, *args, **kwargs)
        finally:
            state.exit_call()
        if makes_value:
            return state.check_result(result, f"{getattr(obj, '__name__', 'a call')}()")
        if not isinstance(obj, (Macro, LoopContext)):
            _check_size_only(state, result)
        return result

    def wrap_str_format(self, value: Any) -> Any:
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) or (
            value.__name__ not in ("format", "format_map")
        ):
            return None
        owner: Any = value.__self__
        if not isinstance(owner, str):
            return None
        state = current_state()
        str_type: type[str] = type(owner)
        is_format_map = value.__name__ == "format_map"
        formatter: Formatter
        if isinstance(owner, Markup):
            formatter = _GuardedEscapeFormatter(self, state, escape=owner.escape)
        else:
            formatter = _GuardedFormatter(self, state)

        def wrapper(*args: Any, **kwargs: Any) -> str:
            if is_format_map:
                if kwargs:
                    raise TypeError("format_map() takes no keyword arguments")
                if len(args) != 1:
                    raise TypeError(f"format_map() takes exactly one argument ({len(args)} given)")
                kwargs = args[0]
                args = ()
            return str_type(formatter.vformat(owner, args, kwargs))

        return update_wrapper(wrapper, value)


def _check_size_only(state: RenderState, value: Any) -> None:
    if isinstance(value, (str, bytes)):
        state.check_chars(len(value), "a call")
    elif isinstance(value, (list, tuple, dict)):
        state.check_items(len(value), "a call")


def _check_mul(state: RenderState, left: Any, right: Any) -> None:
    if isinstance(left, _SEQUENCES) and isinstance(right, int):
        seq, times = left, right
    elif isinstance(right, _SEQUENCES) and isinstance(left, int):
        seq, times = right, left
    else:
        if isinstance(left, int) and isinstance(right, int):
            bits = left.bit_length() + right.bit_length()
            if bits > state.limits.max_int_bits + 1:
                raise value_too_large(
                    f"the * operator would make a {bits}-bit integer; the limit is "
                    f"{state.limits.max_int_bits} bits"
                )
        return
    size = len(seq) * max(times, 0)
    if isinstance(seq, (str, bytes)):
        state.check_chars(size, "the * operator")
    else:
        state.check_items(size, "the * operator")


def _check_pow(state: RenderState, base: Any, exp: Any) -> None:
    if not (isinstance(base, int) and isinstance(exp, int)) or exp <= 0 or abs(base) <= 1:
        return  # floats overflow quickly; 0, 1, -1 and negative exponents stay small
    limit = state.limits.max_int_bits
    # The result has at least (bits(base) - 1) * exp + 1 bits; refuse without computing.
    if exp > limit or (abs(base).bit_length() - 1) * exp + 1 > limit:
        raise value_too_large(f"the ** operator would make an integer of more than {limit} bits")


def _check_add(state: RenderState, left: Any, right: Any) -> None:
    if isinstance(left, (str, bytes)) and isinstance(right, (str, bytes)):
        state.check_chars(len(left) + len(right), "the + operator")
    elif isinstance(left, (list, tuple)) and isinstance(right, (list, tuple)):
        state.check_items(len(left) + len(right), "the + operator")

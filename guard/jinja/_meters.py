"""Limits, error codes and the per-render meters of the hardened chat-template sandbox.

The compiled template and its environment are shared between requests; what one render has used
(iterations, characters made, output, call depth, time) lives in a :class:`RenderState` that the
sandbox's hooks find through a context variable. Templates cannot reach it: it is not in their
context and has no name they can resolve.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from pydantic import Field
from pydantic.dataclasses import dataclass

from guard._limits import LIMITS_CONFIG, PosFloat, PosInt
from guard.budget import Budget
from guard.errors import LimitExceeded, TemplateError

T = TypeVar("T")

# Stable error codes (also Prometheus label values).
CODE_NOT_ALLOWED = "chat_template_not_allowed"
CODE_KWARG_NOT_ALLOWED = "chat_template_kwarg_not_allowed"
CODE_INVALID = "chat_template_invalid"
CODE_TOO_LARGE = "chat_template_too_large"
CODE_NESTING = "chat_template_nesting_exceeded"
CODE_VALUE_TOO_LARGE = "chat_template_value_too_large"
CODE_EXPANSION = "chat_template_expansion_exceeded"
CODE_LOOP_BUDGET = "chat_template_loop_budget_exceeded"
CODE_SECURITY = "chat_template_security"
CODE_RAISED = "chat_template_exception"
CODE_RENDER_FAILED = "chat_template_render_failed"
CODE_DEADLINE = "deadline_exceeded"


@dataclass(frozen=True, config=LIMITS_CONFIG)
class ChatTemplateLimits:
    """Limits of the hardened sandbox (the policy's ``limits.templates.chat_template`` section,
    with the guard's own deadline). Sizes are in characters; a container item counts as
    ``ITEM_WEIGHT`` towards ``max_materialized``."""

    # Checked by a linear scan before compiling.
    max_source_bytes: PosInt = Field(
        default=64 * 1024, description="Largest request chat template (real ones are 1 to 10 KB)."
    )
    max_block_nesting: PosInt = Field(default=16, description="Deepest `{% %}` block nesting.")
    max_expr_nesting: PosInt = Field(
        default=16, description="Deepest bracket nesting in expressions."
    )
    max_syntax_tokens: PosInt = Field(default=6_000, description="Most Jinja syntax tokens.")
    # Checked while rendering.
    max_iterations: PosInt = Field(
        default=50_000,
        description="Loop items plus calls over one whole render (nested loops count).",
    )
    max_range: PosInt = Field(default=10_000, description="Largest `range()`.")
    max_value_chars: PosInt = Field(
        default=256 * 1024, description="Longest string the template makes (`'A' * 10**10` stops)."
    )
    max_items: PosInt = Field(default=65_536, description="Longest list, tuple or dict it makes.")
    max_int_bits: PosInt = Field(
        default=4096, description="Largest integer, in bits (`10**(10**7)`)."
    )
    max_width: PosInt = Field(
        default=1024,
        description="Widest padding, indent, format width or precision (`center`, ...).",
    )
    max_format_fields: PosInt = Field(
        default=256, description="Most fields in one `format` string."
    )
    max_call_depth: PosInt = Field(default=64, description="Deepest macro and call nesting.")
    max_materialized: PosInt = Field(
        default=16 * 1024 * 1024,
        description="Everything the render makes, summed (characters; 8 per container item).",
    )
    max_output_chars: PosInt = Field(default=1024 * 1024, description="Longest rendered prompt.")
    deadline_s: PosFloat | None = Field(
        default=1.0,
        description="Seconds one render may take. `null`: none of its own (a `Budget`'s "
        "deadline still applies).",
    )


DEFAULT_LIMITS = ChatTemplateLimits()

# Weight of one container item against max_materialized (a pointer is 8 bytes).
ITEM_WEIGHT = 8
# The Budget's own deadline is checked on every 32nd tick (its clock call is not free).
_BUDGET_DEADLINE_EVERY = 32


def value_too_large(message: str) -> LimitExceeded:
    return LimitExceeded(CODE_VALUE_TOO_LARGE, message)


class RenderState:
    """What one render has used so far; every ``check``/``charge`` raises at its limit."""

    __slots__ = (
        "_clock",
        "_deadline",
        "budget",
        "call_depth",
        "iterations",
        "limits",
        "materialized",
        "output_chars",
        "ticks",
    )

    def __init__(
        self,
        limits: ChatTemplateLimits = DEFAULT_LIMITS,
        budget: Budget | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self.budget = budget
        self._clock = clock
        self._deadline = None if limits.deadline_s is None else clock() + limits.deadline_s
        self.iterations = 0
        self.materialized = 0
        self.output_chars = 0
        self.call_depth = 0
        self.ticks = 0

    # -- time

    def tick(self) -> None:
        """One unit of template work: check the deadlines."""
        self.ticks += 1
        if self._deadline is not None and self._clock() > self._deadline:
            raise LimitExceeded(
                CODE_DEADLINE,
                f"rendering the chat template exceeded its deadline of "
                f"{(self.limits.deadline_s or 0) * 1000:.0f} ms",
                status=408,
            )
        if self.budget is not None and self.ticks % _BUDGET_DEADLINE_EVERY == 0:
            self.budget.check_deadline()

    # -- counts

    def iterate(self) -> None:
        self.iterations += 1
        if self.iterations > self.limits.max_iterations:
            raise LimitExceeded(
                CODE_LOOP_BUDGET,
                f"the chat template exceeded its budget of {self.limits.max_iterations} loop "
                "iterations and calls",
            )
        self.tick()

    def enter_call(self) -> None:
        self.iterate()
        self.call_depth += 1
        if self.call_depth > self.limits.max_call_depth:
            raise LimitExceeded(
                CODE_NESTING,
                f"the chat template's calls nest deeper than {self.limits.max_call_depth}",
            )

    def exit_call(self) -> None:
        self.call_depth -= 1

    def materialize(self, units: int) -> None:
        self.materialized += units
        if self.materialized > self.limits.max_materialized:
            raise LimitExceeded(
                CODE_EXPANSION,
                f"the chat template made more than {self.limits.max_materialized} characters "
                "of values while rendering",
            )

    def emit(self, chunk: str) -> None:
        """Charge one chunk of rendered output (and the Budget's tokens/bytes)."""
        self.output_chars += len(chunk)
        if self.output_chars > self.limits.max_output_chars:
            raise LimitExceeded(
                CODE_EXPANSION,
                f"the rendered chat template exceeds {self.limits.max_output_chars} characters",
            )
        if self.budget is not None:
            self.budget.charge_text(chunk)
            self.budget.check_deadline()
        self.tick()

    # -- sizes

    def check_chars(self, n: int, what: str) -> None:
        if n > self.limits.max_value_chars:
            raise value_too_large(
                f"{what} would make a string of {n} characters; the limit is "
                f"{self.limits.max_value_chars}"
            )

    def check_items(self, n: int, what: str) -> None:
        if n > self.limits.max_items:
            raise value_too_large(
                f"{what} would make {n} items; the limit is {self.limits.max_items}"
            )

    def check_width(self, width: Any, what: str) -> None:
        if isinstance(width, int) and abs(width) > self.limits.max_width:
            raise value_too_large(
                f"{what} width {width} exceeds the limit of {self.limits.max_width}"
            )

    def check_result(self, value: Any, what: str) -> Any:
        """Check and charge a value an operation made; return it."""
        if isinstance(value, (str, bytes)):
            self.check_chars(len(value), what)
            self.materialize(len(value))
        elif isinstance(value, (list, tuple, dict, set, frozenset)):
            self.check_items(len(value), what)
            self.materialize(ITEM_WEIGHT * len(value))
        elif isinstance(value, int) and value.bit_length() > self.limits.max_int_bits:
            raise value_too_large(
                f"{what} would make a {value.bit_length()}-bit integer; the limit is "
                f"{self.limits.max_int_bits} bits"
            )
        return value

    # -- loops

    def counted(self, iterable: Iterable[T]) -> Iterator[T]:
        return CountingIterator(iterable, self)


class CountingIterator(Iterator[T]):
    """Charges one iteration per item pulled (so nested loops that print nothing still pay).

    ``iter()`` is taken on the first pull, as a lazy filter (``map``) would take it.
    """

    __slots__ = ("_it", "_source", "_state")

    def __init__(self, iterable: Iterable[T], state: RenderState) -> None:
        self._source: Iterable[T] | None = iterable
        self._it: Iterator[T] | None = None
        self._state = state

    def __iter__(self) -> CountingIterator[T]:
        return self

    def __next__(self) -> T:
        it = self._it
        if it is None:
            assert self._source is not None
            it = self._it = iter(self._source)
            self._source = None
        item = next(it)
        self._state.iterate()
        return item


_STATE: ContextVar[RenderState | None] = ContextVar("schedguard_chat_template_state", default=None)


def current_state() -> RenderState:
    state = _STATE.get()
    if state is None:
        # Only reachable outside a guarded render (e.g. Jinja trying to fold a constant at
        # compile time, which then simply does not fold).
        raise TemplateError(CODE_SECURITY, "the hardened sandbox ran outside a guarded render")
    return state


def active_state() -> RenderState | None:
    return _STATE.get()


def set_state(state: RenderState) -> Any:
    return _STATE.set(state)


def reset_state(token: Any) -> None:
    _STATE.reset(token)

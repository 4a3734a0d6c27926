"""Prompt templates: ``{{name}}`` placeholders that nest and expand variables that are templates.

``{{ name }}`` is replaced by the variable ``name`` (surrounding whitespace ignored). Placeholders
nest: ``{{ {{lang}}_greeting }}`` renders the inner one first and its result names the variable.
A variable's value is itself a template, expanded in turn. Delimiters are read leftmost first
without overlap (``{{{a}}}`` is the placeholder ``{a`` then ``}``; see :mod:`guard.template_scan`).
Parsing and expansion are iterative: nothing here recurses in Python.

The two profiles run the same engine with different choices (:func:`policy_for`):

==========================  ======================================  =============================
                            vulnerable                              hardened
==========================  ======================================  =============================
unclosed ``{{``             backtrack, re-read it as text           ``template_unbalanced``
stray ``}}``                text                                    ``template_unbalanced``
nesting depth               unlimited                               8 (``template_depth_exceeded``),
                                                                    values' nesting included
template size               unlimited                               256 KiB with the values read
                                                                    (``template_too_large``)
expansion                   unlimited                               2048 tokens counted as it is
                                                                    produced (``prompt_tokens_exceeded``),
                                                                    steps, 250 ms deadline
unknown variable            ``""`` (as Mustache)                    ``template_unknown_variable``
self-reference              expands forever                         ``template_recursion``
==========================  ======================================  =============================

The vulnerable engine is a PEG parser without memoisation: on the seed payload
(``"{{" * 1024 + "system_prompt}}" * 512``) its backtracking is exponential in the 512 unclosed
openers, and every node it allocates stays in an arena that is never rolled back, so it runs
until the memory cap or the clock stops it. Self-referencing and billion-laughs variables
exhaust it through expansion. The hardened profile scans the delimiters first (linear, a few
microseconds for the seed) and never materialises more than its token budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from guard.budget import Budget, IncrementalCount, Limits

from ._placeholder_render import (
    TEMPLATE_NAME_TOO_LONG,
    TEMPLATE_RECURSION,
    TEMPLATE_TOO_LARGE,
    TEMPLATE_UNKNOWN_VARIABLE,
    TEMPLATE_VARIABLE_INVALID,
    RenderPolicy,
    render_template,
)
from .profiles import Profile

__all__ = [
    "DEFAULT_VARIABLES",
    "MAX_NAME_CHARS",
    "MAX_RENDER_STEPS",
    "TEMPLATE_NAME_TOO_LONG",
    "TEMPLATE_RECURSION",
    "TEMPLATE_TOO_LARGE",
    "TEMPLATE_UNKNOWN_VARIABLE",
    "TEMPLATE_VARIABLE_INVALID",
    "TOKEN_ENCODING",
    "RenderedPrompt",
    "budget_for",
    "policy_for",
    "render_prompt_template",
]

# Variables the reference server supplies; a request's own variables take precedence.
DEFAULT_VARIABLES: Mapping[str, str] = MappingProxyType(
    {"system_prompt": "You are a helpful assistant."}
)
# Hardened only. Every placeholder parsed, node visited and frame finished is a step (~1 µs):
# a template that expands many placeholders into nothing (which costs no tokens) stops here
# after ~15 ms of work. A 2048-token prompt with a thousand placeholders takes ~5000 steps.
MAX_RENDER_STEPS = 1 << 14
MAX_NAME_CHARS = 256
TOKEN_ENCODING = "cl100k_base"


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    """A rendered prompt and what rendering it cost.

    ``tokens``: the exact prompt token count from the budget's incremental counter, or ``None``
    when the profile counts none while rendering (vulnerable: the server counts afterwards).
    With a caller's budget it is that budget's count so far (0 if it has no counter).
    ``max_depth``: the deepest nesting reached, through variable values included.
    ``placeholders``: placeholders resolved. ``nodes``: parse nodes allocated, including those
    a backtracking parse threw away. ``buffered_tokens``: size of the engine's byte-level token
    buffer (literal text pre-tokenised while parsing, plus the rendered output).
    """

    text: str
    tokens: int | None
    max_depth: int
    placeholders: int
    nodes: int
    buffered_tokens: int


def policy_for(profile: Profile) -> RenderPolicy:
    """The engine's parsing choices and limits for ``profile``."""
    return RenderPolicy(
        lenient=not profile.reject_unbalanced_delimiters,
        scan_first=profile.reject_unbalanced_delimiters,
        max_depth=profile.max_template_depth,
        max_source_bytes=profile.max_template_bytes,
        strict_variables=profile.hardened,
        detect_cycles=profile.hardened,
        max_name_chars=MAX_NAME_CHARS if profile.hardened else None,
    )


def budget_for(profile: Profile) -> Budget:
    """A fresh render budget: depth, ``max_prompt_tokens`` counted incrementally, steps, deadline.

    All unlimited (and no token counter) for the vulnerable profile.
    """
    counter: IncrementalCount | None = None
    if profile.max_prompt_tokens is not None:
        from guard.tokens import get_counter  # loads the BPE ranks: the hardened path alone

        counter = get_counter(TOKEN_ENCODING).incremental(
            profile.max_prompt_tokens, param="prompt_template"
        )
    limits = Limits(
        max_depth=profile.max_template_depth,
        max_tokens=profile.max_prompt_tokens,
        max_steps=MAX_RENDER_STEPS if profile.hardened else None,
        deadline_s=profile.render_deadline_s,
    )
    return Budget(limits, counter)


def render_prompt_template(
    template: str,
    variables: Mapping[str, str],
    profile: Profile,
    *,
    budget: Budget | None = None,
    defaults: Mapping[str, str] = DEFAULT_VARIABLES,
) -> RenderedPrompt:
    """Render ``template`` with ``variables`` (over ``defaults``) under ``profile``.

    Raises a :class:`~guard.errors.GuardError` subclass with a stable code when the hardened
    profile refuses the template (see the module docstring); the vulnerable profile raises
    nothing of its own and may not return at all. ``budget`` defaults to :func:`budget_for`.
    """
    own_budget = budget is None
    if budget is None:
        budget = budget_for(profile)
    merged = {**defaults, **variables}
    text, resolved, arena = render_template(template, merged, policy_for(profile), budget)
    counted = not own_budget or profile.max_prompt_tokens is not None
    return RenderedPrompt(
        text=text,
        tokens=budget.tokens_used() if counted else None,
        max_depth=budget.max_depth_seen,
        placeholders=resolved,
        nodes=len(arena.nodes),
        buffered_tokens=len(arena.tokens),
    )

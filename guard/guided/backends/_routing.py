"""Which structured-output backend a request reaches on vLLM 0.32, and what it costs there.

vLLM's ``auto`` (``SamplingParams._validate_structured_outputs``, ``vllm/sampling_params.py``)
decides from the request alone, for a non-Mistral tokenizer:

- xgrammar, when its validation accepts the constraint (``validate_xgrammar_grammar``: vLLM's
  ``has_xgrammar_unsupported_json_features`` and xgrammar's own converters, which also refuse a
  schema for its form: :mod:`guard.guided.schema._malformed`);
- otherwise llguidance ("guidance"), except a JSON schema that has ``patternProperties``
  anywhere (``has_guidance_unsupported_json_features``): that one goes to **outlines**;
- what guidance refuses too is a 400 (there is no outlines fallback for it).

**The engine's backend is sticky** (``StructuredOutputManager.grammar_init``,
``vllm/v1/structured_output/__init__.py``): the engine builds one backend object from the first
structured request after it starts and compiles every later request with it, whatever ``auto``
decided for that later request. So under ``auto`` every request may be compiled by xgrammar or
by guidance (whichever came first), and one outlines-routed request admitted first would turn
every later schema or regex into an outlines index build. The guard therefore bounds each
request for every backend the policy names that a request can make sticky (xgrammar and
guidance), and refuses outright a request that ``auto`` would send to outlines
(``limits.guided.outlines_fallback: refuse``, the default), which keeps the engine off outlines.
A policy that names one backend (vLLM pinned with ``--structured-outputs-config``) bounds that
backend only.

Refusals: ``guided_backend_cost_exceeded`` (HTTP 400), the backend named first in the message;
``param`` is the constraint's field. The compile-CPU limit is a per-constraint ceiling:
``backend_max_compile_s`` for xgrammar and guidance, on the estimate at a 100,000-token
vocabulary (:data:`CEILING_VOCAB`: the constraint's shape, whatever the model), and
``outlines_max_compile_s``, stricter, on outlines' estimate at the model's vocabulary. What a
tenant spends over time is the compile budget's (guard/admission/_compile.py), which charges
the estimate at the model's vocabulary that :func:`check_constraint` returns.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

from guard.errors import LimitExceeded
from guard.guided._limits import GuidedLimits
from guard.guided.backends._cost import Estimate, guidance_cost, outlines_cost, xgrammar_cost
from guard.guided.regex import guidance_rejects_regex, xgrammar_rejects_regex
from guard.guided.schema import Memo, facts_of, xgrammar_refuses_form

__all__ = [
    "BACKEND_COST_CODE",
    "CEILING_VOCAB",
    "check_backend_costs",
    "check_constraint",
    "constraints",
    "fmt_path",
    "reachable_backends",
    "route_auto",
]

BACKEND_COST_CODE = "guided_backend_cost_exceeded"
# The vocabulary the xgrammar/guidance ceiling is stated at: a property of the constraint's shape
# (what no ordinary application sends), whatever the model; the compile budget charges the
# estimate at the model's own vocabulary.
CEILING_VOCAB = 100_000
_ESTIMATORS = {"outlines": outlines_cost, "xgrammar": xgrammar_cost, "guidance": guidance_cost}

# ---- vLLM 0.32's routing helpers (request-only): guard/guided/schema/_facts.py (schemas) and
# guard/guided/regex/_syntax.py (regexes)


def route_auto(kind: str, spec: Any, facts: Memo | None = None) -> str:
    """The backend vLLM 0.32's ``auto`` picks for one constraint (non-Mistral tokenizer):
    ``xgrammar``, ``guidance``, ``outlines``, or ``reject`` (a 400 from vLLM). ``facts``:
    schema facts already gathered (see :func:`guard.guided.schema._facts.facts_of`)."""
    if kind == "json":
        if not isinstance(spec, Mapping):
            return "xgrammar" if spec is True else "reject"
        f = facts_of(spec, facts)
        # A schema xgrammar refuses for its form goes the same way; judged only where it
        # decides for outlines (a schema without patternProperties xgrammar refuses goes to
        # guidance, which the guard bounds whatever the route).
        if not f.xgr_unsupported and not (f.pattern_properties and xgrammar_refuses_form(spec)):
            return "xgrammar"
        if f.pattern_properties:
            return "outlines"
        if f.guidance_rejects:
            return "reject"
        return "guidance"
    if kind == "regex":
        if not isinstance(spec, str):
            return "reject"
        if not xgrammar_rejects_regex(spec):
            return "xgrammar"
        return "reject" if guidance_rejects_regex(spec) else "guidance"
    return "xgrammar"  # grammar, choice, structural_tag, json_object: guidance only as fallback


def reachable_backends(
    kind: str, spec: Any, limits: GuidedLimits, facts: Memo | None = None
) -> tuple[list[str], bool]:
    """The backends that may compile this constraint under the policy, and whether it is
    routed to outlines by ``auto``'s fallback (see the module docstring)."""
    named: list[str] = list(dict.fromkeys(limits.backends))
    if len(named) == 1:
        return named, False
    route = route_auto(kind, spec, facts) if "outlines" in named else ""
    reach: list[str] = [b for b in named if b != "outlines"]
    if route == "outlines":
        reach.append("outlines")
    return reach, route == "outlines"


# ---- the constraints of a request, as vLLM reads them --------------------------------------------


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def _tool_schema(body: Mapping[str, Any]) -> tuple[Any, tuple[str | int, ...]] | None:
    """The schema vLLM builds from ``tools`` when ``tool_choice`` forces a call."""
    tools = body.get("tools")
    choice = body.get("tool_choice")
    if not isinstance(tools, list) or choice in (None, "none", "auto"):
        return None
    params = []
    for i, tool in enumerate(tools):
        fn = _get(tool, "function")
        p = _get(fn, "parameters") if fn is not None else _get(tool, "parameters")
        name = _get(fn, "name") if fn is not None else _get(tool, "name")
        if isinstance(choice, Mapping):
            wanted = _get(_get(choice, "function"), "name") or _get(choice, "name")
            if wanted == name:
                return (p if p is not None else {"type": "object"}), ("tools", i, "parameters")
        elif p is not None:
            params.append(p)
    if choice == "required" and params:
        schema = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": params}}
        return schema, ("tools",)
    return None


def constraints(body: Mapping[str, Any]) -> Iterator[tuple[str, Any, tuple[str | int, ...]]]:
    """(kind, spec, path) of every structured-output constraint vLLM would compile; schemas
    given as JSON text are parsed (the check has already bounded and parsed them once)."""
    import json

    def schema(value: Any) -> Any:
        if isinstance(value, str):
            try:
                return json.loads(value)
            except (ValueError, RecursionError):
                return None
        return value

    so = body.get("structured_outputs")
    path: tuple[str | int, ...]
    for value, path in (
        (_get(so, "regex"), ("structured_outputs", "regex")),
        (body.get("guided_regex"), ("guided_regex",)),
    ):
        if isinstance(value, str):
            yield "regex", value, path
    for value, path in (
        (_get(so, "json"), ("structured_outputs", "json")),
        (body.get("guided_json"), ("guided_json",)),
        (
            _get(_get(body.get("response_format"), "json_schema"), "schema"),
            ("response_format", "json_schema", "schema"),
        ),
        (_get(_get(_get(body, "text"), "format"), "schema"), ("text", "format", "schema")),
    ):
        value = schema(value)
        if value is not None:
            yield "json", value, path
    for value, path in (
        (_get(so, "choice"), ("structured_outputs", "choice")),
        (body.get("guided_choice"), ("guided_choice",)),
    ):
        if isinstance(value, list):
            yield "choice", value, path
    for value, path in (
        (_get(so, "grammar"), ("structured_outputs", "grammar")),
        (body.get("guided_grammar"), ("guided_grammar",)),
    ):
        if isinstance(value, str):
            yield "grammar", value, path
    tools = body.get("tools")
    if isinstance(tools, list):
        for i, tool in enumerate(tools):
            fmt = _get(tool, "format")  # Responses API custom tool
            at: tuple[str | int, ...] = ("tools", i, "format", "definition")
            if _get(_get(tool, "custom"), "format") is not None:  # Chat Completions spelling
                fmt = _get(_get(_get(tool, "custom"), "format"), "grammar")
                at = ("tools", i, "custom", "format", "grammar", "definition")
            definition = _get(fmt, "definition")
            if isinstance(definition, str):
                kind = "regex" if _get(fmt, "syntax") == "regex" else "grammar"
                yield kind, definition, at
    forced = _tool_schema(body)
    if forced is not None:
        yield "json", forced[0], forced[1]


# ---- the check --------------------------------------------------------------------------------


def fmt_path(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else part)
    return out[:300]


def _refuse(backend: str, message: str, path: tuple[str | int, ...]) -> NoReturn:
    raise LimitExceeded(BACKEND_COST_CODE, f"{backend}: {message}", param=fmt_path(path))


def _over(est: Estimate, limits: GuidedLimits, backend: str, at_ref: float | None) -> str | None:
    """Why ``est`` is over a ceiling, or None; ``at_ref``: the compile estimate at
    :data:`CEILING_VOCAB` (xgrammar and guidance), None for outlines (its own vocabulary)."""
    why = f" ({est.why[0]})" if est.why else ""
    if est.compile_s == float("inf"):
        return f"its compile cost cannot be bounded{why}"
    if at_ref is None and est.compile_s > limits.outlines_max_compile_s:
        return (
            f"compiling it would take ~{est.compile_s:.3g} s of CPU, over the ceiling of "
            f"{limits.outlines_max_compile_s:g} s{why}"
        )
    if at_ref is not None and at_ref > limits.backend_max_compile_s:
        return (
            f"compiling it would take ~{at_ref:.3g} s of CPU at a {CEILING_VOCAB:,}-token "
            f"vocabulary, over the ceiling of {limits.backend_max_compile_s:g} s{why}"
        )
    if est.mem_mb > limits.backend_max_compile_mb:
        shown = "unbounded" if est.mem_mb == float("inf") else f"~{est.mem_mb:.3g} MiB"
        return (
            f"compiling it would take {shown} of memory, over the budget of "
            f"{limits.backend_max_compile_mb:g} MiB{why}"
        )
    if est.mask_s > limits.backend_max_mask_s:
        return (
            f"each generated token would cost ~{est.mask_s:.3g} s of mask computation, over "
            f"the budget of {limits.backend_max_mask_s:g} s{why}"
        )
    return None


def check_constraint(
    kind: str,
    spec: Any,
    path: tuple[str | int, ...],
    limits: GuidedLimits,
    facts: Memo | None = None,
    *,
    vocab: int | None = None,
) -> float:
    """Refuse one constraint over a reachable backend's ceilings; return its estimated cold
    compile (CPU seconds, the largest over the backends that may compile it), which the
    compile budget charges. ``facts``: schema facts the check gathered (a schema's objects are
    then not walked again); ``vocab``: the configured tokenizer's size (see
    :meth:`GuidedLimits.vocabulary`)."""
    if kind == "json" and isinstance(spec, Mapping):
        # one walk for the route and every estimate (the tools' parameters reused)
        got = facts_of(spec, facts)
        facts = {id(spec): (spec, got)}
    reach, to_outlines = reachable_backends(kind, spec, limits, facts)
    if to_outlines and limits.outlines_fallback == "refuse":
        _refuse(
            "outlines",
            "vLLM's auto backend would compile this schema with outlines (xgrammar does not "
            "support it and it has patternProperties), and the engine keeps the first "
            "backend it builds for every later request",
            path,
        )
    size = limits.vocabulary(vocab)
    cold = 0.0
    for backend in reach:
        estimate = _ESTIMATORS[backend]
        est = estimate(kind, spec, size, facts)
        if not est.accepted:
            continue
        at_ref: float | None = None
        if backend != "outlines":
            # The estimates grow with the vocabulary: at the reference one it is lower when
            # the model's is larger and within the ceiling, higher when smaller and over it.
            ceiling = limits.backend_max_compile_s
            at_ref = est.compile_s
            if (size > CEILING_VOCAB and at_ref > ceiling) or (
                size < CEILING_VOCAB and at_ref <= ceiling
            ):
                at_ref = estimate(kind, spec, CEILING_VOCAB, facts).compile_s
        over = _over(est, limits, backend, at_ref)
        if over is not None:
            _refuse(backend, over, path)
        cold = max(cold, est.compile_s)
    return cold


def check_backend_costs(
    body: Mapping[str, Any], limits: GuidedLimits, *, vocab: int | None = None
) -> None:
    """Refuse (``guided_backend_cost_exceeded``) a constraint whose estimated cost on a
    backend that may compile it is over the policy's ceilings."""
    if not limits.backends:
        return
    for kind, spec, path in constraints(body):
        check_constraint(kind, spec, path, limits, vocab=vocab)

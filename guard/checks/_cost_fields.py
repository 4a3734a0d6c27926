"""vLLM's per-request fields that change its cost, bounded by value (issue 14 item 5).

Each field of vLLM 0.32's request models that changes what a request costs or reaches behind
the guard was decided from those models (research note: vLLM 0.32's request fields) as one of:

- **denied** whatever its value: listed in ``limits.schema.denied_fields`` by default
  (``kv_transfer_params``, ``vllm_xargs``, ``media_io_kwargs``, a client ``request_id``, ...),
  refused in every ``unknown_fields`` mode;
- **bounded**: the values that cost nothing are accepted, the others refused here, whatever
  the policy (:data:`RULES`): ``use_beam_search`` false only,
  ``watermarking`` not false, embeddings ``padding`` not ``max_length``,
  ``repetition_detection.max_pattern_size`` at most 64; on the Responses API ``background``
  and ``store`` not true (``store: false`` is injected when absent: vLLM defaults it to true
  and keeps every stored response in memory) and only ``function`` and ``custom`` tools;
- **allowed**: the rest (sampling parameters vLLM validates itself, ``cache_salt``,
  ``truncate_prompt_tokens``, ...), bounded where they multiply work by the fan-out, tokens
  and guided checks.

``priority`` is bounded by the caller's key where the upstream schedules by it, 0 only
elsewhere: :mod:`guard.checks._priority`.

docs/POLICY.md ("vLLM's cost fields") has the table with each field's reason. Refusals are
``field_not_allowed`` (400) naming the field in ``param``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from guard.checks._result import Mutation
from guard.errors import GuardError
from guard.request import Endpoint

__all__ = ["MAX_REPETITION_PATTERN", "RESPONSES_TOOL_TYPES", "RULES", "check_cost_fields"]

FIELD_NOT_ALLOWED = "field_not_allowed"
# vLLM checks repetition_detection's n-gram window on every generated token; no upper bound.
MAX_REPETITION_PATTERN = 64
# Responses tool types that are a schema or a grammar the guided check bounds; the built-in
# ones (web_search, code_interpreter, mcp, file_search, ...) run loops or fetches upstream.
RESPONSES_TOOL_TYPES = frozenset({"function", "custom"})


def _refuse(param: str, message: str) -> GuardError:
    return GuardError(FIELD_NOT_ALLOWED, message, param=param)


def _beam_search(value: Any) -> None:
    if value is not False:
        raise _refuse(
            "use_beam_search",
            "use_beam_search is not accepted: vLLM runs one engine request per beam and step",
        )


def _watermarking(value: Any) -> None:
    if value is False:
        raise _refuse("watermarking", "watermarking: false (the server's watermark off) is refused")


def _padding(value: Any) -> None:
    if value == "max_length":
        raise _refuse(
            "padding",
            "padding: max_length is refused: it pads every input to the model's whole context",
        )


def _repetition(value: Any) -> None:
    size = value.get("max_pattern_size") if isinstance(value, dict) else None
    if not (size is None or (type(size) is int and 0 <= size <= MAX_REPETITION_PATTERN)):
        raise _refuse(
            "repetition_detection.max_pattern_size",
            f"repetition_detection.max_pattern_size must be an integer from 0 to "
            f"{MAX_REPETITION_PATTERN} (vLLM checks that window on every generated token)",
        )


def _not_true(name: str, why: str) -> Callable[[Any], None]:
    def check(value: Any) -> None:
        if value is True:
            raise _refuse(name, f"{name}: true is refused ({why})")

    return check


def _responses_tools(value: Any) -> None:
    if not isinstance(value, list):
        return  # the schema check types it
    for i, tool in enumerate(value):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and kind not in RESPONSES_TOOL_TYPES:
            raise _refuse(
                f"tools[{i}].type",
                f"tools of type {kind[:40]!r} are not accepted (only function and custom tools: "
                "built-in tools make the upstream run tool loops and fetches)",
            )


_ANY: dict[str, Callable[[Any], None]] = {
    "use_beam_search": _beam_search,
    "watermarking": _watermarking,
    "repetition_detection": _repetition,
}

# The value rules by endpoint: each runs when its field is present and not null.
RULES: Mapping[Endpoint, Mapping[str, Callable[[Any], None]]] = {
    "chat": _ANY,
    "completions": _ANY,
    "embeddings": {**_ANY, "padding": _padding},
    # vLLM's pooling requests all take `padding` (PoolingBasicRequestMixin).
    "pooling": {**_ANY, "padding": _padding},
    "score": {**_ANY, "padding": _padding},
    "rerank": {**_ANY, "padding": _padding},
    "tokenize": _ANY,
    "other": _ANY,
    "responses": {
        **_ANY,
        "background": _not_true("background", "the upstream keeps generating after the answer"),
        "store": _not_true("store", "the upstream keeps every stored response in memory"),
        "tools": _responses_tools,
    },
}

_STORE_OFF = (Mutation(("store",), False, "responses_store"),)


def check_cost_fields(body: Mapping[str, Any], endpoint: Endpoint) -> tuple[Mutation, ...]:
    """Raise ``field_not_allowed`` for a bounded field with a value that costs; return the
    mutations to apply (``store: false`` on a Responses request without ``store``)."""
    rules = RULES.get(endpoint)
    if rules is None:
        return ()
    for name, rule in rules.items():
        value = body.get(name)
        if value is not None:
            rule(value)
    if endpoint == "responses" and body.get("store") is None:
        return _STORE_OFF
    return ()

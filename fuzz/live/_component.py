"""Which part of the upstream a live finding is in: what a report and its SARIF point at.

A live finding is a bug in the server, not in this project: its location is the upstream's
module that failed. From the server's own stack when the log shows one (the culprit frame of
:class:`fuzz.live._evidence.Evidence`); else from the request field that selects the code path
(``grammar`` on llama-cpp-python is its grammar module, ``allowed_token_ids`` with structured
outputs on vLLM is ``vllm/v1/structured_output``), by the server's kind (vllm, llama_cpp:
:func:`fuzz.live._environment.server_kind`); else the field itself, as ``upstream:FIELD``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FIELD_COMPONENTS", "component_of"]

# (top-level request field, component) per server kind, the most specific first: a request
# with structured outputs and allowed_token_ids fails in the structured-output code.
FIELD_COMPONENTS: dict[str, tuple[tuple[str, str], ...]] = {
    "llama_cpp": (
        ("grammar", "llama_cpp/llama_grammar.py"),
        ("response_format", "llama_cpp/llama_grammar.py"),
        ("tools", "llama_cpp/llama_chat_format.py"),
        ("functions", "llama_cpp/llama_chat_format.py"),
        ("tool_choice", "llama_cpp/llama_chat_format.py"),
        ("top_logprobs", "llama_cpp/llama_chat_format.py"),
        ("logprobs", "llama_cpp/llama.py"),
        ("logit_bias", "llama_cpp/llama.py"),
        ("messages", "llama_cpp/llama_chat_format.py"),
        ("prompt", "llama_cpp/llama.py"),
    ),
    "vllm": (
        ("structured_outputs", "vllm/v1/structured_output"),
        ("response_format", "vllm/v1/structured_output"),
        ("guided_json", "vllm/v1/structured_output"),
        ("guided_regex", "vllm/v1/structured_output"),
        ("guided_grammar", "vllm/v1/structured_output"),
        ("guided_choice", "vllm/v1/structured_output"),
        ("allowed_token_ids", "vllm/v1/sample"),
        ("bad_words", "vllm/v1/sample"),
        ("top_logprobs", "vllm/v1/sample"),
        ("logprobs", "vllm/v1/sample"),
        ("tools", "vllm/entrypoints/openai/serving_chat.py"),
        ("tool_choice", "vllm/entrypoints/openai/serving_chat.py"),
        ("messages", "vllm/entrypoints/chat_utils.py"),
        ("prompt", "vllm/entrypoints/openai/serving_completion.py"),
    ),
}
_PACKAGES = {"llama_cpp": ("llama_cpp/",), "vllm": ("vllm/",)}


def component_of(
    evidence: dict[str, Any] | None, body: Any, kind: str | None
) -> dict[str, str | None]:
    """``component`` (a module path or package directory of the upstream), ``function`` (when
    the stack names one) and ``basis`` (``stack`` or ``request field NAME``)."""
    ev = evidence or {}
    culprit = _culprit(ev.get("frames") or [], ev.get("culprit"), kind)
    if culprit is not None:
        module, function = culprit
        return {"component": module, "function": function, "basis": "stack"}
    fields = list(body) if isinstance(body, dict) else []
    for name, component in FIELD_COMPONENTS.get(kind or "", ()):
        if name in fields:
            return {"component": component, "function": None, "basis": f"request field {name}"}
    unusual = [f for f in fields if f not in ("model", "max_tokens", "stream", "temperature")]
    name = unusual[0] if unusual else "body"
    return {"component": f"upstream:{name}", "function": None, "basis": f"request field {name}"}


def _culprit(frames: list[str], culprit: str | None, kind: str | None) -> tuple[str, str] | None:
    """The innermost frame in the upstream's own package when there is one, else the evidence's
    culprit (its innermost frame outside the standard library and the plumbing); frames are
    ``module:line function``, innermost first."""
    own = _PACKAGES.get(kind or "", ())
    for text in [*(frames if own else []), *([culprit] if culprit else [])]:
        where, _, function = text.partition(" ")
        module = where.rsplit(":", 1)[0]
        if text == culprit or module.startswith(own):
            return module, function
    return None

"""Which benign look-alikes of the corpus a load test sends to each kind of upstream.

The look-alikes (``payloads/benign/``) were written against the reference scheduler: its model,
its ``prompt_template`` extension, embeddings and media it accepts. Sent to a real server they
fail for reasons of the server's, not the guard's (vLLM answers ``prompt_template`` with 400: no
prompt), and a benign error is a failed gate. So, per kind (:data:`loadtests.target.KINDS`):

- ``reference``: every look-alike the profile serves (its ``profiles`` note; the caller filters);
- any other kind: only generation requests (``POST`` chat or completions: what a deployment
  serves on embeddings or ``/v1/models/{id}`` depends on its model), without the reference's
  own fields (:data:`REFERENCE_ONLY_FIELDS`) and without media parts (the served model may be
  text-only);
- ``vllm`` besides: no tools of a type other than ``function`` (vLLM 0.32 answers 400);
- ``llama_cpp`` besides: nothing the guard refuses for llama-cpp-python (its request models,
  mirrored by ``guard.checks.check_llama_cpp_shapes``: one definition of what it does not
  take).

The model name is swapped by :mod:`loadtests.replay`; this module only chooses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from guard.checks import check_llama_cpp_shapes
from guard.errors import GuardError
from payloads.loader import Payload

__all__ = ["GENERATION_ROUTES", "REFERENCE_ONLY_FIELDS", "fit", "unfit_reason"]

# Body fields only the reference scheduler reads (scheduler_ref.api_models._GenerationRequest).
REFERENCE_ONLY_FIELDS = ("prompt_template", "template_vars")
GENERATION_ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
_TEXT_PARTS = {"text"}


def _media_part(body: Mapping[str, Any]) -> str | None:
    """The type of the first non-text content part of a chat body's messages, if any."""
    messages = body.get("messages")
    for message in messages if isinstance(messages, list) else []:
        content = message.get("content") if isinstance(message, dict) else None
        for part in content if isinstance(content, list) else []:
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in _TEXT_PARTS:
                return str(kind)
    return None


def _tool_type(body: Mapping[str, Any]) -> str | None:
    tools = body.get("tools")
    for tool in tools if isinstance(tools, list) else []:
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            return str(kind)
    return None


def unfit_reason(payload: Payload, kind: str) -> str | None:
    """Why ``payload`` is not sent to an upstream of ``kind``; None when it is."""
    if kind == "reference":
        return None
    endpoint = GENERATION_ROUTES.get(payload.endpoint)
    if payload.method != "POST" or endpoint is None:
        return f"{payload.method} {payload.endpoint}: not a generation request"
    try:
        body = payload.body_json()
    except ValueError:
        return "not a JSON body"
    if not isinstance(body, dict):
        return "not a JSON object"
    reference_only = [f for f in REFERENCE_ONLY_FIELDS if f in body]
    if reference_only:
        return f"{', '.join(reference_only)}: read only by the reference scheduler"
    media = _media_part(body)
    if media is not None:
        return f"a {media} part: the served model may be text-only"
    if kind == "vllm":
        tool = _tool_type(body)
        if tool is not None:
            return f"tools of type {tool}: vLLM 0.32 answers 400"
    if kind == "llama_cpp":
        try:
            check_llama_cpp_shapes(body, endpoint)  # type: ignore[arg-type]
        except GuardError as err:
            return f"llama-cpp-python does not take it ({err.code}: {err.message})"
    return None


def fit(payloads: Sequence[Payload], kind: str) -> tuple[list[Payload], dict[str, str]]:
    """(the payloads sent to ``kind``, {left-out id: why})."""
    kept: list[Payload] = []
    left: dict[str, str] = {}
    for p in payloads:
        why = unfit_reason(p, kind)
        if why is None:
            kept.append(p)
        else:
            left[p.id] = why
    return kept, left

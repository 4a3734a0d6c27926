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

Attacks too: some are another upstream's. The guard refuses a JSON schema that llama.cpp's
grammar converter would crash on, but vLLM reads schemas itself, so in front of vLLM the guard
lets it through on purpose (``limits.guided.llama_cpp_schemas: auto``). The gate counts any
attack served as a failure, so :func:`attacks_left_out` leaves out, for a kind, the attacks the
guard's own pipeline refuses in front of an upstream it does not know (``other``) and admits in
front of that kind: the guard's verdicts are the one definition of what is harmless where. An
attack admitted in front of every kind is still sent (and fails the gate).

The model name is swapped by :mod:`loadtests.replay`; this module only chooses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from guard.checks import check_llama_cpp_shapes
from guard.errors import GuardError
from guard.pipeline import evaluate_body
from guard.policy import Policy
from payloads.loader import Payload

__all__ = ["GENERATION_ROUTES", "REFERENCE_ONLY_FIELDS", "attacks_left_out", "fit", "unfit_reason"]

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


def attacks_left_out(
    attacks: Sequence[Payload], kind: str, policy: Policy, api_key: str
) -> dict[str, str]:
    """{attack id: why} of the ``attacks`` not sent to an upstream of ``kind``: those the
    guard's pipeline (``policy``, called with ``api_key``) refuses in front of an unknown
    upstream and admits in front of ``kind``. Attacks framed at the HTTP layer (a transport of
    their own) are judged there, the same for every kind: all are sent."""
    if kind in ("reference", "other"):
        return {}
    policies = {k: policy.with_upstream_kind(k) for k in ("other", kind)}  # type: ignore[arg-type]
    auth = ("authorization", f"Bearer {api_key}")
    left: dict[str, str] = {}
    for payload in attacks:
        if payload.transport is not None:
            continue
        headers = payload.header_items()
        if not any(name.lower() == "authorization" for name, _ in headers):
            headers = [*headers, auth]
        body = payload.body_bytes()
        verdicts = {
            k: evaluate_body(body, payload.endpoint, headers, p, method=payload.method)
            for k, p in policies.items()
        }
        refused = verdicts["other"].rejection
        if refused is not None and verdicts[kind].rejection is None:
            left[payload.id] = (
                f"the guard admits it in front of {kind} (elsewhere refused: {refused.code})"
            )
    return left

"""The schema check: the body is a JSON object whose known fields have the types upstreams expect.

Types are checked strictly (``"n": "2"`` and ``2.0`` are refused even though vLLM would coerce
them: a guard and an upstream must not read one field two ways). Only top-level fields and the
structure the other checks walk (messages and their content parts, prompts, tools) are checked;
everything deeper is the upstream's to validate.

Codes: ``body_not_object``, ``missing_field``, ``invalid_type``, ``invalid_value``,
``unknown_field`` (with ``limits.schema.unknown_fields: reject``), ``field_not_allowed``
(``limits.schema.denied_fields``, and vLLM's cost fields with a value that costs: see
:mod:`guard.checks._cost_fields`), ``priority_not_allowed`` (a priority better than the
caller's key allows: :mod:`guard.checks._priority`). All 400. The mutations: ``store: false``
on a Responses request that does not set it; under priority scheduling, the caller's
``priority`` where the body does not say it.

In front of llama-cpp-python (``upstream.kind: llama_cpp``, set or detected), what its request
models reject (it answers those with a 500) is refused too: ``unsupported_by_upstream``, and
``prompts_exceeded`` for a list of more than one prompt (see :mod:`guard.checks._llamacpp`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol

from pydantic import Field

from guard._limits import LimitsModel
from guard.checks import _schema_fields as fields
from guard.checks._cost_fields import check_cost_fields
from guard.checks._llamacpp import check_llama_cpp_shapes
from guard.checks._policy import PolicyView
from guard.checks._priority import check_priority
from guard.checks._result import CheckResult, pure_check
from guard.errors import GuardError
from guard.http import PRIORITY_HEADER
from guard.request import Endpoint, RequestView

__all__ = ["DENIED_FIELDS", "SchemaLimits", "SchemaReads", "check_schema"]


# The default `limits.schema.denied_fields` (reasons in its description).
DENIED_FIELDS: tuple[str, ...] = (
    "logits_processors",
    "mm_processor_kwargs",
    "media_io_kwargs",
    "kv_transfer_params",
    "ec_transfer_params",
    "vllm_xargs",
    "request_id",
    "session_id",
    "prompt_embeds",
    "return_prompt_text",
    "previous_response_id",
    "previous_input_messages",
)


class SchemaLimits(LimitsModel):
    unknown_fields: Literal["allow", "reject"] = Field(
        default="allow",
        description="Fields the guard does not know (OpenAI's, vLLM's, SGLang's, TGI's and "
        "llama.cpp's common parameters are known): `allow` forwards them (OpenAI SDKs send "
        "new parameters first), `reject` refuses the request (`unknown_field`), so that no "
        "parameter the guard cannot check reaches the upstream.",
    )
    extra_known_fields: tuple[str, ...] = Field(
        default=(),
        description="More top-level field names to treat as known (with `reject`): the "
        "upstream's own extensions you accept unchecked.",
    )
    denied_fields: tuple[str, ...] = Field(
        default=DENIED_FIELDS,
        description="Top-level fields refused whatever their value, in every `unknown_fields` "
        "mode (`field_not_allowed`): vLLM 0.32's fields that reach code, caches or limits "
        "behind the guard (the table of vLLM's cost fields above). `logits_processors` names "
        "code for vLLM to load; `mm_processor_kwargs` and `media_io_kwargs` override the "
        "media processor and loader (frames, pixels) behind the multimodal caps; "
        "`kv_transfer_params` (its `prompt_token_ids` replace the rendered prompt, past the "
        "token count), `ec_transfer_params` and `vllm_xargs` go to the engine and its plugins; "
        "a client `request_id` names the stored response on the Responses API (another "
        "tenant's, when it collides) and `session_id` routes; `prompt_embeds` is up to 2 GiB "
        "of tensor; `return_prompt_text` returns the server-side template and system prompt; "
        "`previous_response_id` and `previous_input_messages` replay server-stored history "
        "the guard never counted. Remove one only if a trusted client needs it.",
    )


_TABLES: dict[Endpoint, Mapping[str, fields.Validator]] = {
    "chat": fields.CHAT,
    "completions": fields.COMPLETIONS,
    "embeddings": fields.EMBEDDINGS,
    "responses": fields.RESPONSES,
    "tokenize": fields.TOKENIZE,
}
# Other allowlisted routes (vLLM's /pooling, /score, ...): the generation fields are typed,
# since the other checks read them, and nothing is unknown.
_OTHER: Mapping[str, fields.Validator] = {
    **fields.COMPLETIONS,
    **fields.CHAT,
    "logprobs": fields.anything,
    "input": fields.anything,
}


def _shown(name: str) -> str:
    return name if len(name) <= 64 else name[:64] + "..."


class SchemaReads(Protocol):
    """The limit sets the schema check reads."""

    @property
    def schema_(self) -> SchemaLimits: ...


@pure_check
def check_schema(view: RequestView, policy: PolicyView[SchemaReads]) -> CheckResult | None:
    body = view.body
    if body is None and view.method in ("GET", "HEAD", "DELETE"):
        return None
    if view.endpoint == "models":
        return None
    if not isinstance(body, dict):
        raise GuardError("body_not_object", "the request body must be a JSON object")
    settings = policy.limits.schema_
    denied = settings.denied_fields
    for name in denied:
        if name in body:
            raise GuardError(
                "field_not_allowed", f"the field {name!r} is not accepted here", param=name
            )
    table = _TABLES.get(view.endpoint, _OTHER)
    reject_unknown = settings.unknown_fields == "reject" and view.endpoint in _TABLES
    extra = settings.extra_known_fields
    for name, value in body.items():
        validator = table.get(name)
        if validator is None:
            if reject_unknown and name not in extra:
                raise GuardError(
                    "unknown_field",
                    f"unknown field {_shown(name)!r}; this server refuses fields it cannot check",
                    param=_shown(name),
                )
            continue
        if value is not None:
            validator(value, (name,))
    for group in fields.REQUIRED.get(view.endpoint, ()):
        if all(body.get(name) is None for name in group):
            names = " or ".join(group)
            raise GuardError("missing_field", f"{names} is required", param=group[0])
    for first, second in fields.EXCLUSIVE.get(view.endpoint, ()):
        if body.get(first) is not None and body.get(second) is not None:
            raise GuardError(
                "invalid_value", f"send either {first} or {second}, not both", param=second
            )
    if view.endpoint == "chat":
        fields.named_tool_choice(body)
        fields.named_function_call(body)
    if view.endpoint in ("chat", "completions"):
        fields.token_mask_combination(body)
    n, best_of = body.get("n"), body.get("best_of")
    if type(n) is int and type(best_of) is int and best_of < n:
        raise GuardError("invalid_value", "best_of must be >= n", param="best_of")
    if policy.upstream_kind == "llama_cpp":
        check_llama_cpp_shapes(body, view.endpoint)
    mutations = check_cost_fields(body, view.endpoint)
    header = view.headers.get(PRIORITY_HEADER)
    best = policy.priority_for(view.key)
    mutations += check_priority(body, view.endpoint, header, best)
    return CheckResult.passed(mutations=mutations) if mutations else None

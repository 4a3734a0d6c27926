"""The OpenAI wire format of the reference scheduler's API: request models and response bodies.

Requests are pydantic models that accept unknown fields (clients send many OpenAI parameters the
simulated model ignores) but type the fields the server acts on, including schedguard's extras:

- ``prompt_template`` + ``template_vars``: a ``{{name}}`` placeholder template rendered under the
  profile's budget; the rendered text becomes the prompt (completions) or a leading system
  message (chat).
- ``chat_template`` + ``chat_template_kwargs``: a Jinja chat template sent with the request
  (refused unless the profile allows it).
- ``priority``: an int, lower is more urgent (as in vLLM); default 0.

Responses are built as plain dicts: they are serialised once and never validated again.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Chat requests without max_tokens get this many at most (OpenAI leaves it to the model).
DEFAULT_CHAT_MAX_TOKENS = 256
# OpenAI's default for /v1/completions.
DEFAULT_COMPLETION_MAX_TOKENS = 16


class _OpenModel(BaseModel):
    # Unknown OpenAI parameters are accepted and ignored, as the OpenAI SDK sends many of them.
    model_config = ConfigDict(extra="allow")


class StreamOptions(_OpenModel):
    include_usage: bool = False


class _GenerationRequest(_OpenModel):
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    n: Annotated[int, Field(ge=1)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    # schedguard extras.
    priority: Annotated[int, Field(ge=-(2**31), le=2**31 - 1)] = 0
    prompt_template: str | None = None
    template_vars: dict[str, str] | None = None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_GenerationRequest):
    # A string, a list of strings, token ids, or a list of token-id lists; optional only when
    # prompt_template supplies the prompt.
    prompt: str | list[str] | list[int] | list[list[int]] | None = None
    echo: bool = False


class ContentPart(_OpenModel):
    # Only text parts are served; others (image_url, input_audio, ...) are parsed so the error
    # can name the part, then refused by the server.
    type: str
    text: str | None = None

    @model_validator(mode="after")
    def _text_has_text(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs a 'text' string")
        return self


class ChatMessage(_OpenModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(_GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    tools: list[dict[str, Any]] | None = None
    # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}; read by
    # scheduler_ref._tool_calls (anything else is "auto": plain text, as before).
    tool_choice: Any = None
    add_generation_prompt: bool = True
    # schedguard extras.
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @property
    def requested_max_tokens(self) -> int | None:
        # max_completion_tokens is the newer name; it wins when both are sent.
        return (
            self.max_completion_tokens
            if self.max_completion_tokens is not None
            else (self.max_tokens)
        )


# --- responses --------------------------------------------------------------------------------


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def new_tool_call_id() -> str:
    # OpenAI's shape: "call_" and 24 characters.
    return f"call_{uuid.uuid4().hex[:24]}"


def now() -> int:
    return int(time.time())


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def model_list(model_name: str, created: int) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"id": model_name, "object": "model", "created": created, "owned_by": "schedguard"}
        ],
    }


def response_body(
    object_: str,
    rid: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_body: dict[str, int],
) -> dict[str, Any]:
    """A whole (non-streamed) answer: ``object_`` is ``text_completion`` or
    ``chat.completion``."""
    return {
        "id": rid,
        "object": object_,
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage_body,
    }


def completion_choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}


def chat_choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {
        "index": index,
        "message": {"role": "assistant", "content": text},
        "logprobs": None,
        "finish_reason": finish_reason,
    }


def tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def chat_tool_call_choice(
    index: int, call: dict[str, Any], finish_reason: str | None
) -> dict[str, Any]:
    """A choice that calls a tool: ``content`` null, the call in ``tool_calls`` (OpenAI's
    shape)."""
    return {
        "index": index,
        "message": {"role": "assistant", "content": None, "tool_calls": [call]},
        "logprobs": None,
        "finish_reason": finish_reason,
    }


def tool_call_delta(
    arguments: str, *, call_id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """A streamed piece of a choice's (only) tool call, as vLLM streams a forced call: the first
    carries ``id``, ``type`` and the name with the first arguments, the rest arguments only."""
    if call_id is None:
        return {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}
    call = {
        "index": 0,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }
    return {"tool_calls": [call]}


def _chunk(
    obj: str, rid: str, created: int, model: str, choices: list[dict[str, Any]], with_usage: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": rid,
        "object": obj,
        "created": created,
        "model": model,
        "choices": choices,
    }
    if with_usage:
        # OpenAI sends "usage": null on every chunk when include_usage is set.
        body["usage"] = None
    return body


def completion_chunk(
    rid: str, created: int, model: str, choices: list[dict[str, Any]], with_usage_field: bool
) -> dict[str, Any]:
    return _chunk("text_completion", rid, created, model, choices, with_usage_field)


def chat_chunk(
    rid: str, created: int, model: str, choices: list[dict[str, Any]], with_usage_field: bool
) -> dict[str, Any]:
    return _chunk("chat.completion.chunk", rid, created, model, choices, with_usage_field)


def chat_delta_choice(
    index: int, delta: dict[str, Any], finish_reason: str | None
) -> dict[str, Any]:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

"""guard.checks._llamacpp: what llama-cpp-python 0.3.36's request models reject (its server
answers each with a pydantic 500) is refused as ``unsupported_by_upstream`` when
``upstream.kind`` is ``llama_cpp``, and its benign look-alikes pass. When the llama-cpp-python
venv that scripts/upstreams sets up is there, every case is also validated by its own models
(the oracle)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from guard.checks._llamacpp import check_llama_cpp_shapes
from guard.errors import GuardError
from guard.pipeline import evaluate_body
from guard.policy import default_policy, policy_from_yaml
from guard.request import Endpoint

LLAMA = policy_from_yaml("upstream: {kind: llama_cpp}")
U = {"role": "user", "content": "hi"}
CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
IMG = "data:image/png;base64,iVBORw0KGgo="


def chat(*messages: Any, **kw: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages) or [U], **kw}


# (endpoint, body, the param refused: None when llama-cpp-python accepts it)
CASES: list[tuple[Endpoint, dict[str, Any], str | None]] = [
    # messages and roles
    ("chat", chat(), None),
    ("chat", chat({"role": "developer", "content": "x"}, U), "messages[0].role"),
    ("chat", chat({"role": "system", "content": "s"}, U), None),
    ("chat", chat({"role": "system", "content": None}, U), None),
    ("chat", chat({"role": "system"}, U), "messages[0].content"),
    (
        "chat",
        chat({"role": "system", "content": [{"type": "text", "text": "s"}]}, U),
        "messages[0].content",
    ),
    ("chat", chat({"role": "user", "content": None}), None),
    ("chat", chat({"role": "user", "content": "x", "name": 5, "extra": [1]}), None),
    # assistant content and tool calls
    ("chat", chat(U, {"role": "assistant"}), None),
    ("chat", chat(U, {"role": "assistant", "content": "ok", "tool_calls": [CALL]}), None),
    ("chat", chat(U, {"role": "assistant", "content": "", "tool_calls": [CALL]}), None),
    ("chat", chat(U, {"role": "assistant", "tool_calls": [CALL]}), None),
    (
        "chat",
        chat(U, {"role": "assistant", "content": None, "tool_calls": [CALL]}),
        "messages[1].content",
    ),
    (
        "chat",
        chat(U, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}),
        "messages[1].content",
    ),
    ("chat", chat(U, {"role": "assistant", "tool_calls": [{**CALL, "extra": 1}]}), None),
    (
        "chat",
        chat(
            U,
            {
                "role": "assistant",
                "tool_calls": [{"type": "function", "function": CALL["function"]}],
            },
        ),
        "messages[1].tool_calls[0].id",
    ),
    (
        "chat",
        chat(
            U,
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "function": {"name": "f", "arguments": {"a": 1}}}],
            },
        ),
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "chat",
        chat(
            U,
            {
                "role": "assistant",
                "tool_calls": [{**CALL, "name": "f", "arguments": "{}", "function": {"name": "f"}}],
            },
        ),
        "messages[1].tool_calls[0].function.arguments",
    ),
    (
        "chat",
        chat(U, {"role": "assistant", "tool_calls": [{**CALL, "type": "custom"}]}),
        "messages[1].tool_calls[0].type",
    ),
    (
        "chat",
        chat(U, {"role": "assistant", "content": "x", "function_call": None}),
        "messages[1].function_call",
    ),
    (
        "chat",
        chat(
            U,
            {
                "role": "assistant",
                "content": "x",
                "function_call": {"name": "f", "arguments": "{}"},
            },
        ),
        None,
    ),
    # tool and function messages
    ("chat", chat(U, {"role": "tool", "tool_call_id": "c1", "content": "r"}), None),
    ("chat", chat(U, {"role": "tool", "tool_call_id": "c1", "content": None}), None),
    ("chat", chat(U, {"role": "tool", "content": "r"}), "messages[1].tool_call_id"),
    (
        "chat",
        chat(U, {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]}),
        "messages[1].content",
    ),
    ("chat", chat(U, {"role": "function", "name": "f", "content": "r"}), None),
    ("chat", chat(U, {"role": "function", "content": "r"}), "messages[1].name"),
    # content parts
    ("chat", chat({"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}), None),
    ("chat", chat({"role": "user", "content": [{"type": "image_url", "image_url": IMG}]}), None),
    (
        "chat",
        chat(
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": IMG, "detail": "low"}}],
            }
        ),
        None,
    ),
    (
        "chat",
        chat(
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": IMG, "detail": "original"}}],
            }
        ),
        "messages[0].content[0].image_url.detail",
    ),
    (
        "chat",
        chat({"role": "user", "content": [{"type": "tool_reference", "tool_name": "f"}]}),
        "messages[0].content[0].type",
    ),
    (
        "chat",
        chat(
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
                ],
            }
        ),
        "messages[0].content[0].type",
    ),
    (
        "chat",
        chat({"role": "user", "content": [{"type": "video_url", "video_url": {"url": IMG}}]}),
        "messages[0].content[0].type",
    ),
    ("chat", chat({"role": "user", "content": [{"type": "text"}]}), "messages[0].content[0].text"),
    # tools, tool_choice, functions
    ("chat", chat(tools=[TOOL]), None),
    ("chat", chat(tools=[TOOL], tool_choice="required"), None),
    ("chat", chat(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "f"}}), None),
    ("chat", chat(tools=[TOOL], tool_choice="any"), "tool_choice"),
    ("chat", chat(tools=[{"type": "custom", "custom": {"name": "g"}}]), "tools[0].type"),
    (
        "chat",
        chat(tools=[{"type": "function", "function": {"name": "f"}}]),
        "tools[0].function.parameters",
    ),
    (
        "chat",
        chat(tools=[{"type": "function", "function": {"name": "f", "parameters": {"x": 0.5}}}]),
        "tools[0].function.parameters.x",
    ),
    (
        "chat",
        chat(
            tools=[
                {
                    "type": "function",
                    "function": {"name": "f", "parameters": {"x": 2.0, "p": {"minimum": 0.5}}},
                }
            ]
        ),
        None,
    ),
    ("chat", chat(functions=[{"name": "f", "parameters": {}}], function_call="auto"), None),
    ("chat", chat(functions=[{"name": "f", "parameters": {}}], function_call={"name": "f"}), None),
    ("chat", chat(functions=[{"name": "f"}]), "functions[0].parameters"),
    ("chat", chat(function_call="required"), "function_call"),
    # response_format
    ("chat", chat(response_format={"type": "json_object"}), None),
    ("chat", chat(response_format={"type": "json_object", "schema": {"type": "object"}}), None),
    ("chat", chat(response_format={"type": "text"}), None),
    (
        "chat",
        chat(
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "object"}},
            }
        ),
        "response_format.type",
    ),
    (
        "chat",
        chat(response_format={"type": "json_object", "schema": 0.5}),
        "response_format.schema",
    ),
    # sampling parameters
    ("chat", chat(temperature=0.7, top_p=1, top_k=0, min_p=0.0, seed=2**70, n=1), None),
    ("chat", chat(max_tokens=-1, stream=1, logprobs=True, top_logprobs=0), None),
    ("chat", chat(user=None, model=None, stop=None, seed=None, logit_bias={"1": 2}), None),
    ("chat", chat(temperature=None), "temperature"),
    ("chat", chat(top_k=None), "top_k"),
    ("chat", chat(top_p=1.5), "top_p"),
    ("chat", chat(top_k=-1), "top_k"),
    ("chat", chat(presence_penalty=3), "presence_penalty"),
    ("chat", chat(stream=2), "stream"),
    ("chat", chat(seed=1.5), "seed"),
    ("chat", chat(top_logprobs=-1), "top_logprobs"),
    ("chat", chat(mirostat_mode=3), "mirostat_mode"),
    ("chat", chat(logit_bias_type="ids"), "logit_bias_type"),
    ("chat", chat(max_tokens=1e20), "max_tokens"),
    ("chat", chat(unknown_field={"anything": [1.5]}), None),
    # completions
    ("completions", {"prompt": "a", "max_tokens": 0}, None),
    ("completions", {"prompt": ["a"], "echo": True, "logprobs": 2, "suffix": "z"}, None),
    ("completions", {"prompt": []}, None),
    ("completions", {"prompt": [1, 2, 3]}, "prompt"),
    ("completions", {"prompt": None}, "prompt"),
    ("completions", {"prompt": "a", "max_tokens": -1}, "max_tokens"),
    ("completions", {"prompt": "a", "logprobs": -1}, "logprobs"),
    ("completions", {"prompt": "a", "echo": None}, "echo"),
    # embeddings
    ("embeddings", {"input": "a"}, None),
    ("embeddings", {"input": ["a", "b"], "user": "u"}, None),
    ("embeddings", {"input": [1, 2]}, "input"),
    ("embeddings", {"input": [{"role": "user", "content": "a"}]}, "input"),
    ("embeddings", {"messages": [U]}, "input"),
]


def _refused_param(endpoint: Endpoint, body: dict[str, Any]) -> str | None:
    try:
        check_llama_cpp_shapes(body, endpoint)
    except GuardError as exc:
        assert exc.code == "unsupported_by_upstream" and exc.status == 400
        return exc.param
    return None


@pytest.mark.parametrize(("endpoint", "body", "param"), CASES, ids=range(len(CASES)))
def test_each_shape(endpoint: Endpoint, body: dict[str, Any], param: str | None) -> None:
    assert _refused_param(endpoint, body) == param


def test_a_prompt_list_is_one_prompt_at_most() -> None:
    with pytest.raises(GuardError) as info:
        check_llama_cpp_shapes({"prompt": ["a", "b"]}, "completions")
    assert (info.value.code, info.value.status, info.value.param) == (
        "prompts_exceeded",
        400,
        "prompt",
    )
    # Embeddings take a list (llama-cpp-python embeds each).
    check_llama_cpp_shapes({"input": ["a", "b", "c"]}, "embeddings")


def test_only_in_front_of_llama_cpp() -> None:
    body = json.dumps(
        chat(U, {"role": "assistant", "content": None, "tool_calls": [CALL]}, max_tokens=8)
    ).encode()
    verdict = evaluate_body(body, "/v1/chat/completions", {}, LLAMA)
    assert verdict.rejection is not None
    assert verdict.rejection.code == "unsupported_by_upstream"
    assert verdict.rejection.param == "messages[1].content"
    for policy in (default_policy(), policy_from_yaml("upstream: {kind: vllm}")):
        assert evaluate_body(body, "/v1/chat/completions", {}, policy).allowed
    prompts = json.dumps({"model": "m", "prompt": ["a", "b"], "max_tokens": 4}).encode()
    verdict = evaluate_body(prompts, "/v1/completions", {}, LLAMA)
    assert verdict.rejection is not None and verdict.rejection.code == "prompts_exceeded"
    assert evaluate_body(prompts, "/v1/completions", {}, default_policy()).allowed


def _llama_python() -> Path | None:
    base = os.environ.get("SCHEDGUARD_UPSTREAMS_DIR") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "schedguard"
        / "upstreams"
    )
    python = Path(base) / "llamacpp" / "venv" / "bin" / "python"
    return python if python.exists() else None


_ORACLE = """
import json, sys
from llama_cpp.server.types import (
    CreateChatCompletionRequest, CreateCompletionRequest, CreateEmbeddingRequest)
models = {"chat": CreateChatCompletionRequest, "completions": CreateCompletionRequest,
          "embeddings": CreateEmbeddingRequest}
out = []
for endpoint, body in json.load(sys.stdin):
    try:
        models[endpoint].model_validate_json(json.dumps(body))
        out.append(True)
    except Exception:
        out.append(False)
print(json.dumps(out))
"""


def test_the_verdicts_are_llama_cpp_pythons_own() -> None:
    python = _llama_python()
    if python is None:
        pytest.skip("llama-cpp-python's venv is not set up (scripts/upstreams setup llamacpp)")
    cases = [(endpoint, body) for endpoint, body, _ in CASES]
    run = subprocess.run(
        [str(python), "-c", _ORACLE],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    accepted = json.loads(run.stdout)
    wrong = [
        (i, endpoint, body)
        for i, ((endpoint, body), ok) in enumerate(zip(cases, accepted, strict=True))
        if ok != (_refused_param(endpoint, body) is None)
    ]
    assert not wrong, wrong

"""guard.checks.fanout: every cap passes at the limit and fails one over."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from guard.checks import CheckResult, check_fanout
from guard.policy import Policy, default_policy, policy_from_yaml
from guard.request import RequestView

P = default_policy()
F = P.limits.fanout
SEED = policy_from_yaml("preset: seed")
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def run(body: Any, path: str = CHAT, policy: Policy = P) -> CheckResult:
    before = copy.deepcopy(body)
    result = check_fanout(RequestView.build(body, path=path), policy)
    assert body == before, "checks must not modify the body"
    return result


def code(body: Any, path: str = CHAT, policy: Policy = P) -> str | None:
    result = run(body, path, policy)
    return None if result.rejection is None else result.rejection.code


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": MSG, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


@pytest.mark.parametrize(
    ("field", "limit", "expected"),
    [
        ("n", F.max_n, "n_exceeded"),
        ("best_of", F.max_best_of, "best_of_exceeded"),
        ("top_logprobs", F.max_top_logprobs, "top_logprobs_exceeded"),
        ("top_n_tokens", F.max_top_logprobs, "top_logprobs_exceeded"),
        ("prompt_logprobs", F.max_prompt_logprobs, "prompt_logprobs_exceeded"),
    ],
)
def test_numeric_caps_at_and_over(field: str, limit: int, expected: str) -> None:
    assert code(completion(**{field: limit}), COMPLETIONS) is None
    result = run(completion(**{field: limit + 1}), COMPLETIONS)
    assert result.rejection is not None
    assert result.rejection.code == expected
    assert result.rejection.status == 400
    assert result.rejection.param == field


def test_completions_logprobs_is_a_count() -> None:
    assert code(completion(logprobs=F.max_logprobs), COMPLETIONS) is None
    assert code(completion(logprobs=F.max_logprobs + 1), COMPLETIONS) == "logprobs_exceeded"
    # Chat's logprobs is a switch: true is not 1 of a cap.
    assert code(chat(logprobs=True, top_logprobs=2)) is None


@pytest.mark.parametrize("field", ["logprobs", "top_logprobs", "prompt_logprobs"])
def test_negative_logprobs_mean_the_whole_vocabulary(field: str) -> None:
    result = run(completion(**{field: -1}), COMPLETIONS)
    assert result.rejection is not None
    assert result.rejection.code.endswith("logprobs_exceeded")
    assert "all of the vocabulary" in result.rejection.message


@pytest.mark.parametrize("value", ["1000000", 1e6, 16.5, "1e6", True])
def test_values_are_read_as_upstreams_coerce_them(value: Any) -> None:
    # vLLM's pydantic coerces "1000000" and 1e6 to ints; llama.cpp truncates floats. 16.5 is
    # read as 17 (away from zero: over the seed's 16), a conservative reading for a cap; True
    # is 1.
    expected = None if value is True else "n_exceeded"
    assert code(chat(n=value), policy=SEED) == expected
    assert code(chat(n=F.max_n + 0.5)) == "n_exceeded"


def test_published_api_limits_pass() -> None:
    # OpenAI's chat top_logprobs (20), n (128), best_of (20), logit_bias (300): the defaults.
    assert code(chat(logprobs=True, top_logprobs=20)) is None
    assert code(chat(logprobs=True, top_logprobs=21)) == "top_logprobs_exceeded"
    assert code(chat(n=128)) is None
    assert code(completion(best_of=20, n=20), COMPLETIONS) is None
    assert code(chat(logit_bias={str(i): 1 for i in range(300)})) is None
    # The seed preset keeps the seed's numbers.
    assert code(chat(logprobs=True, top_logprobs=6), policy=SEED) == "top_logprobs_exceeded"


def test_unreadable_values_are_left_to_the_schema_check() -> None:
    assert code(chat(n="lots", best_of=[1], top_logprobs={"a": 1})) is None


def test_list_valued_prompt() -> None:
    assert code(completion(prompt=["a"] * F.max_prompts), COMPLETIONS) is None
    assert code(completion(prompt=["a"] * (F.max_prompts + 1)), COMPLETIONS) == "prompts_exceeded"
    # A flat list of token ids is one prompt; a list of id lists is several.
    assert code(completion(prompt=[1] * 1000), COMPLETIONS) is None
    many = [[1, 2]] * (F.max_prompts + 1)
    assert code(completion(prompt=many), COMPLETIONS) == "prompts_exceeded"
    # Embeddings inputs have their own cap: OpenAI's 2048.
    body = {"model": "m", "input": ["x"] * F.max_embedding_inputs}
    assert code(body, "/v1/embeddings") is None
    body = {"model": "m", "input": ["x"] * (F.max_embedding_inputs + 1)}
    assert code(body, "/v1/embeddings") == "prompts_exceeded"


def test_min_tokens_against_max_tokens() -> None:
    assert code(chat(min_tokens=10, max_tokens=10)) is None
    assert code(chat(min_tokens=11, max_tokens=10)) == "min_tokens_exceeds_max_tokens"
    # max_completion_tokens counts as the cap too (the larger of the two is the one read).
    assert code(chat(min_tokens=50, max_completion_tokens=100)) is None
    # Without a cap, the default that will be injected is the cap (the seed preset injects
    # one); without a default, what the context window leaves.
    default = SEED.limits.tokens.default_max_tokens
    assert default is not None
    assert code(chat(min_tokens=default), policy=SEED) is None
    assert code(chat(min_tokens=default + 1), policy=SEED) == "min_tokens_exceeds_max_tokens"
    window = P.limits.tokens.context_length
    assert window is not None
    assert code(chat(min_tokens=window - 1)) is None
    assert code(chat(min_tokens=window)) == "min_tokens_exceeds_max_tokens"
    # A cap above the policy's is clamped (or refused by the tokens check): min_tokens is
    # compared with what can actually be generated.
    most = SEED.limits.tokens.max_output_tokens
    assert most is not None
    too_many = most + 1
    result = code(chat(min_tokens=too_many, max_tokens=10**9), policy=SEED)
    assert result == "min_tokens_exceeds_max_tokens"


def test_stop_sequences() -> None:
    assert code(chat(stop=["x"] * F.max_stop_sequences)) is None
    assert code(chat(stop=["x"] * (F.max_stop_sequences + 1))) == "stop_exceeded"
    assert code(chat(stop="a" * F.max_stop_bytes)) is None
    assert code(chat(stop="a" * (F.max_stop_bytes + 1))) == "stop_exceeded"
    # Measured in UTF-8 bytes: 86 three-byte characters are 258 bytes.
    assert code(chat(stop=["é" * (F.max_stop_bytes // 2)])) is None
    result = run(chat(stop=["ok", "語" * (F.max_stop_bytes // 3 + 1)]))
    assert result.rejection is not None and result.rejection.param == "stop[1]"


def test_logit_bias_size() -> None:
    at = {str(i): 1 for i in range(F.max_logit_bias)}
    assert code(chat(logit_bias=at)) is None
    over = {str(i): 1 for i in range(F.max_logit_bias + 1)}
    assert code(chat(logit_bias=over)) == "logit_bias_exceeded"


def test_messages_and_content_parts() -> None:
    assert code(chat(messages=MSG * F.max_messages)) is None
    assert code(chat(messages=MSG * (F.max_messages + 1))) == "messages_exceeded"
    part = {"type": "text", "text": "x"}
    per_message = F.max_content_parts // 4
    at = [{"role": "user", "content": [part] * per_message}] * 4
    assert code(chat(messages=at)) is None
    over = [*at, {"role": "user", "content": [part]}]
    result = run(chat(messages=over))
    assert result.rejection is not None
    assert result.rejection.code == "content_parts_exceeded"
    assert result.rejection.param == "messages[4].content"


def test_responses_input_items_count_as_messages() -> None:
    body = {"model": "m", "input": [{"role": "user", "content": "x"}] * (F.max_messages + 1)}
    assert code(body, "/v1/responses") == "messages_exceeded"
    assert code({"model": "m", "input": "plain text"}, "/v1/responses") is None


def test_policy_changes_the_caps() -> None:
    strict = policy_from_yaml("limits: {fanout: {max_n: 2, max_stop_sequences: 1}}")
    assert code(chat(n=2), policy=strict) is None
    assert code(chat(n=3), policy=strict) == "n_exceeded"
    assert code(chat(stop=["a", "b"]), policy=strict) == "stop_exceeded"


def test_benign_requests_pass() -> None:
    assert (
        code(chat(n=4, top_logprobs=3, logprobs=True, stop=["\n\n", "END"], max_tokens=100)) is None
    )
    assert code(completion(n=2, best_of=2, logprobs=2, prompt=["a", "b", "c"]), COMPLETIONS) is None
    assert code(None) is None
    assert code([1, 2, 3]) is None


def test_token_id_inputs_are_prompts_not_conversations() -> None:
    # [[ids], [ids], ...] is a batch of token-id inputs (held to the embeddings cap), not a
    # batch of conversations (held to max_prompts).
    body = {"model": "m", "input": [[1, 2, 3]] * (F.max_prompts + 1)}
    assert code(body, "/v1/embeddings") is None
    conversations = {"model": "m", "messages": [MSG] * (F.max_prompts + 1)}
    assert code(conversations, "/v1/embeddings") == "prompts_exceeded"

"""Log-probability work in front of llama-cpp-python (guard.checks._logprob_work, step 4 of
the tokens check)."""

from __future__ import annotations

from typing import Any

import pytest

from guard.checks import check_tokens
from guard.checks._logprob_work import (
    PREFIX_WEIGHT,
    logprob_positions_asked,
    logprob_work,
    most_positions,
)
from guard.policy import Policy, policy_from_yaml
from guard.request import RequestView
from guard.tokens import get_counter

LLAMA_CPP = policy_from_yaml("upstream: {kind: llama_cpp}")
VLLM = policy_from_yaml("upstream: {kind: vllm}")
OTHER = policy_from_yaml("upstream: {kind: other}")
BYTE_BOUND = policy_from_yaml(
    "{upstream: {kind: llama_cpp}, limits: {tokens: {exact_costs: false}}}"
)
NO_LIMIT = policy_from_yaml(
    "{upstream: {kind: llama_cpp}, limits: {tokens: {max_logprob_work: null}}}"
)
V = get_counter("cl100k_base").vocabulary_size
LIMIT = LLAMA_CPP.limits.tokens.max_logprob_work
WINDOW = LLAMA_CPP.limits.tokens.context_length
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MOST = most_positions(1 << 23, V)


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "Hi."}], **fields}


def completion(prompt: str, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": prompt, **fields}


def judge(body: dict[str, Any], path: str, policy: Policy = LLAMA_CPP) -> tuple[str | None, int]:
    result = check_tokens(RequestView.build(body, path=path), policy)
    code = None if result.rejection is None else result.rejection.code
    return code, int(result.costs.get("logprob_work", 0))


def test_the_vocabulary_is_the_tokenizers() -> None:
    assert V == 100_277  # cl100k_base: 100,256 ranks and the special tokens
    assert LIMIT == 1 << 23


@pytest.mark.parametrize("vocabulary", [1, 4096, 32_000, 100_277, 128_256])
@pytest.mark.parametrize("work", [0, 1, 4096, 1 << 20, 1 << 23, 10**12])
def test_most_positions_is_the_largest_that_fits(vocabulary: int, work: int) -> None:
    p = most_positions(work, vocabulary)
    assert logprob_work(p, vocabulary) <= work
    assert logprob_work(p + 1, vocabulary) > work


def test_the_work_grows_with_the_vocabulary_and_the_prefix() -> None:
    assert logprob_work(1, 4096) == 4096 + PREFIX_WEIGHT
    assert logprob_work(1000, 4096) == 1000 * (4096 + 3000)


@pytest.mark.parametrize(
    ("endpoint", "fields", "asked"),
    [
        ("chat", {"logprobs": True, "top_logprobs": 5}, True),
        ("chat", {"logprobs": True, "top_logprobs": 0}, True),  # 0 is not None to it
        ("chat", {"logprobs": "true", "top_logprobs": 1}, True),  # pydantic's lax bool
        ("chat", {"logprobs": True}, False),  # logprobs=top_logprobs: None
        ("chat", {"logprobs": False, "top_logprobs": 5}, False),
        ("chat", {"top_logprobs": 5}, False),
        ("completions", {"logprobs": 0}, True),
        ("completions", {"logprobs": 5}, True),
        ("completions", {"logprobs": None}, False),
        ("completions", {}, False),
        ("embeddings", {"logprobs": 5}, False),
    ],
)
def test_which_requests_ask_for_log_probabilities(
    endpoint: Any, fields: dict[str, Any], asked: bool
) -> None:
    assert logprob_positions_asked(fields, endpoint) is asked


def test_generated_positions_at_and_over_the_limit() -> None:
    assert judge(chat(logprobs=True, top_logprobs=5, max_tokens=MOST), CHAT) == (
        None,
        logprob_work(MOST, V),
    )
    code, _ = judge(chat(logprobs=True, top_logprobs=5, max_tokens=MOST + 1), CHAT)
    assert code == "logprob_work_exceeded"
    # completions: logprobs 0 still scores every token
    assert judge(completion("Hi", logprobs=0, max_tokens=MOST), COMPLETIONS)[0] is None
    code, _ = judge(completion("Hi", logprobs=0, max_tokens=MOST + 1), COMPLETIONS)
    assert code == "logprob_work_exceeded"


def test_without_max_tokens_the_window_remainder_is_scored() -> None:
    result = check_tokens(
        RequestView.build(chat(logprobs=True, top_logprobs=1), path=CHAT), LLAMA_CPP
    )
    assert result.rejection is not None
    assert result.rejection.code == "logprob_work_exceeded"
    assert f"ask for at most {MOST} output tokens" in result.rejection.message
    assert result.rejection.param == "top_logprobs"
    # without top_logprobs llama-cpp-python scores nothing: admitted, unchanged
    assert judge(chat(logprobs=True), CHAT) == (None, 0)


def test_echo_scores_the_prompt_tokens_unless_streamed() -> None:
    # " word" is one cl100k token; the count adds the tokenizer's special tokens (BOS, EOS: an
    # upper bound of the positions, llama-cpp-python drops the BOS), and one is generated
    fits = " word" * (MOST - 1 - get_counter("cl100k_base").special_tokens)
    assert judge(completion(fits, echo=True, logprobs=1, max_tokens=1), COMPLETIONS)[0] is None
    over = " word" * (MOST + 10)
    code, _ = judge(completion(over, echo=True, logprobs=1, max_tokens=1), COMPLETIONS)
    assert code == "logprob_work_exceeded"
    # streamed, only the generated tokens are scored; without logprobs nothing is
    assert judge(
        completion(over, echo=True, logprobs=1, max_tokens=1, stream=True), COMPLETIONS
    ) == (None, logprob_work(1, V))
    assert judge(completion(over, echo=True, max_tokens=1), COMPLETIONS) == (None, 0)


def test_echo_counts_the_prompt_exactly_when_the_byte_bound_would_refuse() -> None:
    prompt = " word" * (MOST // 2)
    code, work = judge(completion(prompt, echo=True, logprobs=1, max_tokens=1), COMPLETIONS)
    assert code is None
    code2, work2 = judge(
        completion(prompt, echo=True, logprobs=1, max_tokens=1), COMPLETIONS, BYTE_BOUND
    )
    assert (code2, work2) == (code, work)


def test_n_does_not_multiply_the_work() -> None:
    # llama-cpp-python's server leaves n and best_of out of its call: one sequence.
    assert judge(chat(logprobs=True, top_logprobs=5, max_tokens=MOST, n=4), CHAT)[0] is None


@pytest.mark.parametrize("policy", [VLLM, OTHER, NO_LIMIT])
def test_only_in_front_of_llama_cpp_and_only_with_a_limit(policy: Policy) -> None:
    code, _ = judge(chat(logprobs=True, top_logprobs=5, max_tokens=3000), CHAT, policy)
    assert code is None

"""Which upstream generates past ``max_tokens``, what the guard reserves and refuses (issue 22),
and what llama-cpp-python's log-probabilities cost per position.

llama-cpp-python 0.3.36 skips its ``max_tokens`` test while the text it generated ends inside a
UTF-8 character: a grammar of 4-byte characters gives ``completion_tokens`` up to 3 over the cap
(the guard reserves that overshoot in front of it), and a positive ``logit_bias`` on a lone
lead byte never lets the text end a character, so it generates until its context is full and
answers 500 (the guard refuses it: ``output_cap_bypass``), as does a penalty that rewards
repetition when the model repeats such a token. vLLM stops at the cap either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from guard.checks.tokens import OUTPUT_OVERSHOOT
from guard.tokens import get_counter
from loadtests.chat_accounting import post_json
from schedguard.servers import RunningServer
from tests._guard_process import guard_spec, start
from tests.e2e.conftest import RunningUpstream

# Four 4-byte characters: byte-level tokens, so the cap can fall inside one.
FOUR_BYTE_GRAMMAR = "root ::= " + " ".join(["[\\U00010000-\\U0001FFFF]"] * 6)


def _lead_byte(tokenizer: Path) -> int:
    """A token of the model's vocabulary that is one UTF-8 lead byte (0xF0)."""
    partial = get_counter(str(tokenizer)).partial_char_ids
    assert partial
    return 176 if 176 in partial else min(partial)


@pytest.fixture(scope="module")
def guarded_llamacpp(
    llamacpp_upstream: RunningUpstream, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    policy = tmp_path_factory.mktemp("output-caps") / "policy.yaml"
    policy.write_text(
        f"limits:\n  tokens:\n    tokenizer: {llamacpp_upstream.tokenizer_json}\n"
        "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
    )
    server: RunningServer = start(guard_spec("guard", llamacpp_upstream.base_url, policy))
    try:
        server.wait_ready(120)
        yield server.url
    finally:
        server.stop()


def test_llama_cpp_python_overshoots_by_at_most_what_the_guard_reserves(
    llamacpp_upstream: RunningUpstream, guarded_llamacpp: str
) -> None:
    over = []
    for max_tokens in (5, 6, 7, 9):
        body = {"prompt": "Hi", "max_tokens": max_tokens, "grammar": FOUR_BYTE_GRAMMAR, "seed": 1}
        _, verdict = post_json(f"{guarded_llamacpp}/guard/v1/check?path=/v1/completions", body)
        assert verdict["allowed"], verdict
        reserved = verdict["costs"]["output_tokens_reserved"]
        assert reserved == max_tokens + OUTPUT_OVERSHOOT
        status, reply = post_json(llamacpp_upstream.base_url + "/v1/completions", body)
        assert status == 200, reply
        completion = reply["usage"]["completion_tokens"]
        assert completion <= reserved, (max_tokens, completion)
        over.append(completion - max_tokens)
    assert max(over) > 0, over  # the overshoot is real (else the reservation is needless)


def test_a_lead_byte_bias_runs_llama_cpp_python_to_its_context_and_the_guard_refuses_it(
    llamacpp_upstream: RunningUpstream, guarded_llamacpp: str
) -> None:
    lead = _lead_byte(llamacpp_upstream.tokenizer_json)
    body = {
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "logit_bias": {str(lead): 5},
        "temperature": 0,
    }
    status, reply = post_json(guarded_llamacpp + "/v1/chat/completions", body)
    assert status == 400 and reply and "output_cap_bypass" in str(reply), reply
    # Straight to it: far past max_tokens (a 500 once its context is full).
    url = llamacpp_upstream.base_url + "/v1/chat/completions"
    status, reply = post_json(url, body, timeout_s=300.0)
    if status == 200:
        assert reply["usage"]["completion_tokens"] > 8 + OUTPUT_OVERSHOOT, reply
    else:
        assert status == 500 and "llama_decode" in str(reply), (status, reply)


def test_a_penalty_rewarding_repetition_does_the_same_and_the_guard_refuses_it(
    llamacpp_upstream: RunningUpstream, guarded_llamacpp: str
) -> None:
    """The black-box campaign's finding through the guard (payloads uc-*-penalty-*): a prompt
    of one phrase over and over and a penalty below 0 make the model repeat a lone lead byte."""
    prompt = ("request and server request and server from token " * 100)[:2048]
    for fields in ({"frequency_penalty": -2}, {"presence_penalty": -2}):
        body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, **fields}
        status, reply = post_json(guarded_llamacpp + "/v1/completions", body)
        assert status == 400 and reply and "output_cap_bypass" in str(reply), reply
        status, reply = post_json(
            llamacpp_upstream.base_url + "/v1/completions", body, timeout_s=300.0
        )
        if status == 200:
            assert reply["usage"]["completion_tokens"] > 2 + OUTPUT_OVERSHOOT, reply
        else:
            assert status == 500 and "llama_decode" in str(reply), (status, reply)
    # The look-alike: penalties that discourage repetition stop at the cap, through the guard.
    body = {"prompt": prompt, "max_tokens": 2, "temperature": 0, "frequency_penalty": 0.5}
    status, reply = post_json(guarded_llamacpp + "/v1/completions", body)
    assert status == 200 and reply["usage"]["completion_tokens"] <= 2 + OUTPUT_OVERSHOOT, reply


def test_vllm_stops_at_max_tokens_whatever_the_bias(vllm_upstream: RunningUpstream) -> None:
    lead = _lead_byte(vllm_upstream.tokenizer_json)
    body = {
        "model": vllm_upstream.model,
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "logit_bias": {str(lead): 100},
        "temperature": 0,
    }
    status, reply = post_json(vllm_upstream.base_url + "/v1/chat/completions", body)
    assert status == 200, reply
    assert reply["usage"]["completion_tokens"] == 8


def test_logprobs_score_every_echoed_and_generated_position_and_the_guard_bounds_them(
    llamacpp_upstream: RunningUpstream, guarded_llamacpp: str
) -> None:
    # The positions llama-cpp-python scores are the ones the guard counts: every echoed prompt
    # token (its BOS dropped) and every generated one.
    body = {"prompt": " fox" * 60, "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0}
    status, reply = post_json(llamacpp_upstream.base_url + "/v1/completions", body)
    assert status == 200, reply
    usage = reply["usage"]
    scored = reply["choices"][0]["logprobs"]["token_logprobs"]
    assert len(scored) == usage["prompt_tokens"] - 1 + usage["completion_tokens"]
    # A chat's logprobs without top_logprobs scores nothing there: admitted, nothing scored.
    chat = {"messages": [{"role": "user", "content": "Hi."}], "max_tokens": 8, "logprobs": True}
    status, reply = post_json(guarded_llamacpp + "/v1/chat/completions", chat)
    assert status == 200, reply
    assert reply["choices"][0]["logprobs"] is None
    # The found shape (a long echoed prompt) is refused; the refusal's own advice is admitted.
    per_fox = get_counter(str(llamacpp_upstream.tokenizer_json)).encode_count(" fox" * 100) / 100
    long_echo = {**body, "prompt": " fox" * int(2000 / per_fox), "max_tokens": 1}  # ~2000 tokens
    status, reply = post_json(guarded_llamacpp + "/v1/completions", long_echo)
    assert status == 400 and reply["error"]["code"] == "logprob_work_exceeded", reply
    scored_chat = {**chat, "top_logprobs": 2}
    del scored_chat["max_tokens"]
    status, reply = post_json(guarded_llamacpp + "/v1/chat/completions", scored_chat)
    assert status == 400 and reply["error"]["code"] == "logprob_work_exceeded", reply
    most = int(reply["error"]["message"].split("ask for at most ")[1].split()[0])
    status, reply = post_json(
        guarded_llamacpp + "/v1/chat/completions", {**scored_chat, "max_tokens": most}
    )
    assert status == 200, reply
    assert reply["choices"][0]["logprobs"]["content"], reply


def test_the_logprobs_bench_runs(llamacpp_upstream: RunningUpstream) -> None:
    # bench/llamacpp_logprobs.py starts its own server (the fixture only makes sure it is set up).
    import json
    import subprocess
    import sys

    from tests._support import REPO_ROOT

    argv = [sys.executable, str(REPO_ROOT / "bench" / "llamacpp_logprobs.py"), "--positions",
            "40", "--json"]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["vocabulary"] == get_counter(str(llamacpp_upstream.tokenizer_json)).vocabulary_size
    assert [row["shape"] for row in doc["rows"]] == ["echo", "generate"]
    for row in doc["rows"]:
        assert {"positions", "plain_s", "logprobs_s", "ratio", "work", "us_per_work"} <= row.keys()
        assert row["positions"] >= 40

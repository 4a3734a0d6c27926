"""payloads/pinned/llama_cpp: attacks on llama-cpp-python's own costs and their look-alikes,
judged with ``upstream.kind: llama_cpp`` (the default policy otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from guard.pipeline import evaluate_body
from guard.policy import policy_from_yaml
from payloads import load_payload

PINNED = sorted((Path(__file__).parents[2] / "payloads" / "pinned" / "llama_cpp").glob("*.yaml"))
IN_FRONT_OF_LLAMA_CPP = "upstream:\n  kind: llama_cpp\n"


@pytest.mark.parametrize("path", PINNED, ids=[p.stem for p in PINNED])
def test_pinned_payload(path: Path) -> None:
    payload = load_payload(path)
    policy = policy_from_yaml(IN_FRONT_OF_LLAMA_CPP)
    verdict = evaluate_body(payload.body_bytes(), payload.endpoint, payload.header_items(), policy)
    assert verdict.status == payload.expect.status, (verdict.code, verdict.rejection)
    if payload.expect.code:
        assert verdict.code == payload.expect.code
    if payload.kind == "benign":
        assert not verdict.mutations, verdict.mutations  # admitted unchanged


@pytest.mark.parametrize("path", PINNED, ids=[p.stem for p in PINNED])
def test_pinned_payload_passes_in_front_of_vllm(path: Path) -> None:
    # The cost is llama-cpp-python's: vLLM computes log-probabilities on the device, batched.
    payload = load_payload(path)
    policy = policy_from_yaml("upstream:\n  kind: vllm\n")
    verdict = evaluate_body(payload.body_bytes(), payload.endpoint, payload.header_items(), policy)
    assert verdict.code != "logprob_work_exceeded", verdict.rejection


def test_both_directions_are_pinned() -> None:
    kinds = {load_payload(p).kind for p in PINNED}
    assert kinds == {"attack", "benign"}

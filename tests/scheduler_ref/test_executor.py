"""The simulated executor: deterministic tokens, EOS policy, cost model."""

from __future__ import annotations

import pytest

from scheduler_ref.config import CostModel
from scheduler_ref.executor import EOS_TOKEN_ID, VOCAB, SimulatedExecutor, detokenize
from scheduler_ref.output import ScheduledRequest, SchedulerOutput


def _so(*reqs: ScheduledRequest) -> SchedulerOutput:
    return SchedulerOutput(step=1, scheduled=reqs)


def test_tokens_are_deterministic_and_in_vocabulary() -> None:
    a, b = SimulatedExecutor(), SimulatedExecutor()
    seq = [a.token_at("req-1", i) for i in range(200)]
    assert seq == [b.token_at("req-1", i) for i in range(200)]
    assert seq != [a.token_at("req-2", i) for i in range(200)]
    assert all(0 < t < len(VOCAB) for t in seq)
    assert len(set(seq)) > 50  # spread over the vocabulary
    other_seed = SimulatedExecutor(seed=1)
    assert [other_seed.token_at("req-1", i) for i in range(20)] != seq[:20]


def test_detokenize_reads_like_words() -> None:
    ex = SimulatedExecutor()
    text = detokenize([ex.token_at("r", i) for i in range(5)])
    words = text.split()
    assert len(words) == 5 and all(w in VOCAB for w in words)
    assert detokenize([EOS_TOKEN_ID, 10**9, -1]) == ""


def test_eos_after_and_eos_probability() -> None:
    ex = SimulatedExecutor(eos_after=3)
    assert [ex.token_at("r", i) == EOS_TOKEN_ID for i in range(4)] == [False, False, True, True]
    never = SimulatedExecutor()
    assert EOS_TOKEN_ID not in [never.token_at("r", i) for i in range(1000)]
    p = SimulatedExecutor(eos_probability=0.25)
    hits = sum(p.token_at(f"r{i}", 0) == EOS_TOKEN_ID for i in range(4000))
    assert 800 < hits < 1200
    with pytest.raises(ValueError):
        SimulatedExecutor(eos_after=0)


def test_execute_samples_only_completed_sequences() -> None:
    ex = SimulatedExecutor()
    chunk = ScheduledRequest("p", 10, 0, 30, 0)  # first prefill chunk
    last = ScheduledRequest("q", 20, 10, 30, 0)  # last chunk: samples output 0
    decode = ScheduledRequest("d", 1, 30, 30, 1)  # decode: samples output 1
    out = ex.execute(_so(chunk, last, decode))
    assert out.sampled_token_ids == {"q": ex.token_at("q", 0), "d": ex.token_at("d", 1)}
    assert out.step_time_s == 0.0


def test_step_time_from_the_cost_model() -> None:
    cost = CostModel(prefill_s_per_token=0.001, decode_s_per_seq=0.01, step_overhead_s=0.1)
    ex = SimulatedExecutor(cost)
    prefill = ScheduledRequest("p", 100, 0, 100, 0)
    resumed = ScheduledRequest("r", 12, 0, 10, 2)  # recompute after preemption is prefill
    decode = ScheduledRequest("d", 1, 30, 30, 1)
    assert decode.is_decode and not prefill.is_decode and not resumed.is_decode
    assert ex.step_time(_so(prefill, resumed, decode)) == pytest.approx(0.1 + 0.112 + 0.01)
    assert ex.step_time(_so()) == 0.0

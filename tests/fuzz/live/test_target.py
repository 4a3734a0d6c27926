"""fuzz.live._target: a live server as a fuzz target: its name, kind and budgets, its seeds and
mutations as fuzz inputs, and its findings as payload bodies."""

from __future__ import annotations

import random

from fuzz.live import (
    HttpClient,
    LiveBudgets,
    LiveOracle,
    LiveRequest,
    LiveTarget,
    RequestMutator,
    RequestPacer,
    live_target_name,
)
from fuzz.targets import FAILS_CI, FuzzTarget, TargetKind
from tests.fuzz.live._fake import CHAT, HELLO, Fake

COMPLETIONS = "/v1/completions"


def _target(
    url: str, *, name: str | None = None, kind: TargetKind = "hardened", guard: str | None = None
) -> LiveTarget:
    seeds = [LiveRequest(CHAT, HELLO, seed_id="hello"), LiveRequest(COMPLETIONS, {"prompt": "x"})]
    budgets = LiveBudgets(timeout_s=5, latency_s=2.0, rss_bytes=64 << 20)
    client = HttpClient(url, limiter=RequestPacer(100))
    mutator = RequestMutator(seeds, model="m")
    oracle = LiveOracle(client, budgets)
    return LiveTarget(url, oracle, mutator, budgets, name=name, kind=kind, guard=guard)


def test_name_kind_and_budgets() -> None:
    assert live_target_name("http://127.0.0.1:8000") == "127-0-0-1-8000"
    target = _target("http://127.0.0.1:8000")
    assert isinstance(target, FuzzTarget)
    assert target.name == "127-0-0-1-8000" and target.kind == "hardened"
    assert target.kind in FAILS_CI and not target.isolate_by_default
    assert (target.budgets.wall_s, target.budgets.mem_bytes) == (2.0, 64 << 20)
    assert "black box" in target.description and target.source == "fuzz/live/__init__.py"
    guarded = _target("http://127.0.0.1:8000", guard="http://127.0.0.1:9000", kind="vulnerable")
    assert guarded.kind == "vulnerable" and guarded.kind not in FAILS_CI
    assert "differentially" in guarded.description and guarded.source == "guard/pipeline.py"


def test_inputs_and_payload_bodies_round_trip() -> None:
    target = _target("http://127.0.0.1:8000", name="my-server")
    assert target.name == "my-server"
    seeds = target.seeds()
    assert seeds[0] == LiveRequest(CHAT, HELLO).to_input()
    assert seeds[1].startswith(b"POST /v1/completions\n\n")
    for data in seeds:
        body, endpoint = target.payload_body(data)
        assert target.input_from_payload(body, endpoint) == data
    rng = random.Random(3)
    assert target.mutate(seeds[0], 10, rng) == seeds[0]  # a child over max_size is not taken
    children = [target.mutate(seeds[0], 1 << 20, rng) for _ in range(20)]
    assert any(c != seeds[0] for c in children)
    assert all(LiveRequest.from_input(c).path in (CHAT, COMPLETIONS) for c in children)


def test_execute_sends_one_request_and_returns_its_cost(fake: Fake) -> None:
    target = _target(fake.url)
    cost = target.execute(LiveRequest(CHAT, HELLO).to_input())
    assert cost.steps > 0  # steps: the server's usage.prompt_tokens

"""The benign structured-output corpus (issue 23): payloads/public/structured/ (public examples and
the application models issue 23 measured, each citing its source) and the other structured
requests of payloads/public/, admitted at the vocabularies of real models, and the load-test phase's
decisions through the gateway with a fake clock.

Decisions only: verdicts, codes, counts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guard.admission import BUDGET_EXHAUSTED, CompileBudget
from guard.gateway import build_gateway
from guard.pipeline import evaluate_body
from guard.policy import policy_from_yaml
from payloads import load_payload
from payloads.loader import Payload
from tests._guard_harness import admit_and_reserve
from tests._support import REPO_ROOT

STRUCTURED = sorted((REPO_ROOT / "payloads" / "public" / "structured").glob("*.yaml"))
PUBLIC = sorted(
    p for p in (REPO_ROOT / "payloads" / "public").rglob("*.yaml") if p.parent.name != "structured"
)


def _with_constraints(paths: list[Path]) -> list[Payload]:
    policy = policy_from_yaml("")
    out = []
    for path in paths:
        payload = load_payload(path)
        verdict = evaluate_body(
            payload.body_bytes(), payload.endpoint, payload.header_items(), policy
        )
        if verdict.compiles:
            out.append(payload)
    return out


CORPUS = _with_constraints(STRUCTURED + PUBLIC)
# tiktoken's cl100k_base (the default tokenizer: GPT-4), Llama 3's 128,256, Qwen 2's 151,936
VOCABULARIES = {
    "100k": "",
    "128k": "limits: {guided: {vocab_size: 128256}}",
    "150k": "limits: {guided: {vocab_size: 151936}}",
}


def test_the_corpus_is_there() -> None:
    assert len(STRUCTURED) >= 20
    assert len(CORPUS) >= 30
    for path in STRUCTURED:
        payload = load_payload(path)
        assert payload.kind == "benign" and payload.references, path.name


@pytest.mark.parametrize("vocab", list(VOCABULARIES))
@pytest.mark.parametrize("payload", CORPUS, ids=[p.id for p in CORPUS])
def test_benign_structured_outputs_admitted(payload: Payload, vocab: str) -> None:
    policy = policy_from_yaml(VOCABULARIES[vocab])
    verdict = evaluate_body(payload.body_bytes(), payload.endpoint, payload.header_items(), policy)
    assert verdict.allowed, (verdict.code, verdict.rejection)
    # and each fits a key's compile bucket at once (120 s by default)
    assert sum(c.compile_s for c in verdict.compiles) < policy.rate.guided_compile_burst_s


def test_the_heavy_ones_are_charged_more_at_a_larger_vocabulary() -> None:
    at = {}
    for vocab, text in VOCABULARIES.items():
        policy = policy_from_yaml(text)
        payload = next(p for p in CORPUS if p.id == "bn-sx-tweet")
        verdict = evaluate_body(
            payload.body_bytes(), payload.endpoint, payload.header_items(), policy
        )
        at[vocab] = sum(c.compile_s for c in verdict.compiles)
    assert 3.0 < at["100k"] < at["128k"] < at["150k"]


# ---- the load-test phase: one tenant warming its schemas, another flooding unique ones ------

KEYS = """
keys:
  - {key: sk-app-key-000000001, tenant: app}
  - {key: sk-flood-key-00000001, tenant: flood}
"""


def _unique(i: int) -> bytes:
    # a person with a 100-character name and a field of its own: ~2.6 s at 100k, every one new
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 100}, f"f{i}": {"type": "integer"}},
    }
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "Answer."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "o", "schema": schema}},
    }
    return json.dumps(body).encode()


async def test_a_warmed_application_is_unaffected_by_a_unique_schema_flood() -> None:
    now = [1000.0]
    gw = build_gateway(policy_from_yaml(KEYS), upstream=None)
    gw.compile_budget = CompileBudget(clock=lambda: now[0])
    app, flood = "sk-app-key-000000001", "sk-flood-key-00000001"
    bodies = [p.body_bytes() for p in CORPUS]
    # the application warms its schemas, two a second: all admitted, each charged once
    for raw in bodies:
        assert await admit_and_reserve(gw, app, raw) == (200, None)
        now[0] += 0.5
    warmed = gw.compile_budget.metrics.cold
    assert warmed >= 30
    # then it repeats them while the other key sends unique schemas at 20 a second (10 s)
    flood_answers = []
    for i in range(200):
        flood_answers.append(await admit_and_reserve(gw, flood, _unique(i)))
        if i % 10 == 0:
            assert await admit_and_reserve(gw, app, bodies[(i // 10) % len(bodies)]) == (200, None)
        now[0] += 0.05
    admitted = flood_answers.count((200, None))
    # the flood: at ~2.6 s each, at most its own bucket (120 s, refilled at 1 s a second) and
    # half the compile pool (4 workers x 60 s ahead / 2 = 120 s, refilled at 2 s a second); the
    # rest 429, never a 5xx. Once its burst is spent (~46 schemas), one every ~2.6 s at most
    assert set(flood_answers) == {(200, None), (429, BUDGET_EXHAUSTED)}
    assert 40 <= flood_answers[:60].count((200, None)) <= 52
    assert flood_answers[60:].count((200, None)) <= 5
    assert gw.compile_budget.metrics.cold == warmed + admitted
    # nothing the application sent was cold again: its repeats were free
    assert gw.compile_budget.metrics.warm >= 20

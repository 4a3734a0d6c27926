"""The whole payloads/ corpus through the guard to each real upstream (issue 13, item 1).

Every payload, attack and benign, is sent once, as its file frames it, to ``schedguard serve``
in front of vLLM and in front of llama-cpp-python (``loadtests.upstream_corpus``, which
bench/corpus_upstreams.py also runs, unguarded too). For each:

- the guard answers, and with no 5xx unless the payload expects one (none does);
- the upstream is alive after it and answers ``/v1/models``, within a generous 120 s;
- the upstream's peak RSS during it (its process tree's VmHWM from /proc, reset before each
  payload) is within 512 MB of its RSS before the corpus;
- a benign payload is served (2xx), unless the upstream does not support what it uses: then
  the guard refuses it with a 400 it names (:data:`REFUSED`: what llama-cpp-python's own
  request models reject), or, when the guard cannot know, the test is skipped
  (:data:`UNSUPPORTED`, each with why).

llama-cpp-python gets a server of its own for this module (an attack that gets through may kill
it; it is restarted for the next payload and the payload fails). vLLM is the session's server.
Known failures (:data:`KNOWN`) are strict xfails naming what gets through.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from loadtests.upstream_corpus import (
    LLAMACPP_REFUSAL,
    CorpusBudgets,
    ScriptUpstream,
    corpus_routes,
    guard_policy,
    run_payload,
    tree_memory,
)
from payloads import load_corpus
from payloads.loader import Payload
from schedguard.servers import RunningServer
from tests._guard_process import guard_spec, start
from tests._support import free_port
from tests.e2e.conftest import RunningUpstream

PAYLOADS: dict[str, Payload] = {p.id: p for p in load_corpus(kind="all", include_found=False)}
BUDGETS = CorpusBudgets(timeout_s=120.0, rss_budget_mb=512.0)
OUTCOMES: dict[str, dict[str, dict[str, object]]] = {}

_LLAMA_500 = "llama-cpp-python 0.3.36 answers it with a pydantic 500 ('N validation errors'): "
_LLAMA_NULL = _LLAMA_500 + "an assistant message with tool_calls and content null"
_LLAMA_SCHEMA = _LLAMA_500 + "response_format type json_schema (it has text and json_object)"
_LLAMA_MEDIA = _LLAMA_500 + "{} content parts (it reads text and image_url only)"
_NO_MODEL_ROUTE = "{} has no GET /v1/models/{{id}} route (404)"
_VLLM_NO_EMBED = "vLLM serves the tiny model for generation: no /v1/embeddings route (404)"
_VLLM_TEXT_ONLY = "the tiny model is text-only: vLLM refuses media for it (400)"
_VLLM_NO_POOLING = "vLLM serves the tiny model for generation: no /score, /rerank, /classify (404)"
_LLAMA_NO_POOLING = "llama-cpp-python has no /score, /rerank, /classify routes (404)"
_REF_ONLY = (
    "prompt_template is read only by the reference scheduler: with no prompt, vLLM answers 400 "
    "(llama-cpp-python completes an empty prompt)"
)
# Benign payloads an upstream does not serve for reasons of its own, not the guard's (the test
# is skipped unless it is served after all).
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("llamacpp", "bn-embeddings"): "started without embedding=True (a 500 says so)",
    ("llamacpp", "bn-embeddings-do-not-pad"): "started without embedding=True (a 500 says so)",
    ("llamacpp", "bn-model-id-non-latin1"): _NO_MODEL_ROUTE.format("llama-cpp-python"),
    ("llamacpp", "bn-model-id-org-slash"): _NO_MODEL_ROUTE.format("llama-cpp-python"),
    ("vllm", "bn-custom-tool-chat-grammar"): "vLLM 0.32 refuses tools of type custom (400)",
    ("vllm", "bn-embeddings"): _VLLM_NO_EMBED,
    ("vllm", "bn-embeddings-do-not-pad"): _VLLM_NO_EMBED,
    ("vllm", "bn-embeddings-messages"): _VLLM_NO_EMBED,
    ("vllm", "bn-image-formats"): _VLLM_TEXT_ONLY,
    ("vllm", "bn-input-audio"): _VLLM_TEXT_ONLY,
    ("vllm", "bn-multimodal-image"): _VLLM_TEXT_ONLY,
    ("vllm", "bn-video-jpeg-frames"): _VLLM_TEXT_ONLY,
    ("vllm", "bn-model-id-non-latin1"): _NO_MODEL_ROUTE.format("vLLM"),
    ("vllm", "bn-model-id-org-slash"): _NO_MODEL_ROUTE.format("vLLM"),
    ("vllm", "bn-prompt-template"): _REF_ONLY,
    ("vllm", "bn-prompt-template-depth-8"): _REF_ONLY,
    **{("vllm", p): _VLLM_NO_POOLING for p in ("bn-rerank", "bn-score-pairs", "bn-classify")},
    **{("llamacpp", p): _LLAMA_NO_POOLING for p in ("bn-rerank", "bn-score-pairs", "bn-classify")},
}

_UNSUPPORTED_BY_UPSTREAM = "unsupported_by_upstream"
# Benign payloads llama-cpp-python's own request models reject (it answered each with a pydantic
# 500, relayed as a 500): the guard, which reads its kind from /v1/models (owned_by "me"),
# refuses them with this 400 code instead (guard/checks/_llamacpp.py).
REFUSED: dict[tuple[str, str], tuple[str, str]] = {
    ("llamacpp", "bn-custom-tool-chat-grammar"): (_UNSUPPORTED_BY_UPSTREAM, "tools of type custom"),
    ("llamacpp", "bn-developer-and-parts"): (_UNSUPPORTED_BY_UPSTREAM, "the developer role"),
    ("llamacpp", "bn-embeddings-messages"): (_UNSUPPORTED_BY_UPSTREAM, "embeddings of messages"),
    ("llamacpp", "bn-input-audio"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_MEDIA.format("input_audio")),
    ("llamacpp", "bn-video-jpeg-frames"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_MEDIA.format("video")),
    ("llamacpp", "bn-json-schema"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_SCHEMA),
    ("llamacpp", "bn-rf-schema-bounded-strings"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_SCHEMA),
    ("llamacpp", "bn-rf-schema-enum"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_SCHEMA),
    ("llamacpp", "bn-rf-schema-order"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_SCHEMA),
    ("llamacpp", "bn-rf-schema-pattern-properties-nested"): (
        _UNSUPPORTED_BY_UPSTREAM,
        _LLAMA_SCHEMA,
    ),
    ("llamacpp", "bn-rf-schema-toolcall"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_SCHEMA),
    ("llamacpp", "bn-parallel-tool-calls"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_NULL),
    ("llamacpp", "bn-tool-history"): (_UNSUPPORTED_BY_UPSTREAM, _LLAMA_NULL),
    ("llamacpp", "bn-prompt-list"): (
        "prompts_exceeded",
        "llama-cpp-python 0.3.36 asserts one prompt per completions request (an empty 500)",
    ),
}
# Attacks that get through the guard and harm the upstream, or come back as a 5xx (strict
# xfails: a fix turns them into failures to remove from here). The five llama-cpp-python
# pydantic 500s that were here (vol-uc-arguments-reprinted, vol-uc-developer-tools,
# vol-uc-extra-key-in-call, vol-uc-name-arguments-on-call, vol-uc-tool-reference-name) are
# refused as unsupported_by_upstream now.
KNOWN: dict[tuple[str, str], str] = {}


@dataclass
class Target:
    upstream: ScriptUpstream
    guard: RunningServer
    model: str
    baseline_rss_mb: float


@pytest.fixture(scope="module", params=["vllm", "llamacpp"])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Target]:
    name: str = request.param
    own: ScriptUpstream | None = None
    if name == "vllm":
        session: RunningUpstream = request.getfixturevalue("vllm_upstream")
        # Adopted: restarted on the same port through the script if a payload kills it.
        up = ScriptUpstream(name, session.port)
        up.record = {"pid": session.pid, "model": session.model}
        tokenizer = session.tokenizer_json
    else:
        # Its own server: started only when the session's would be (set up), for the skip.
        session = request.getfixturevalue("llamacpp_upstream")
        own = up = ScriptUpstream(name, free_port("127.0.0.1"))
        up.start()
        tokenizer = session.tokenizer_json
    tmp = tmp_path_factory.mktemp(f"corpus-{name}")
    policy = guard_policy(tmp, tokenizer, corpus_routes(PAYLOADS.values()))
    guard = start(guard_spec("guard", up.base_url, policy))
    try:
        guard.wait_ready(120)
        baseline = tree_memory(up.pid)[0] / (1 << 20)
        yield Target(up, guard, str(up.record.get("model", "tiny-llama")), baseline)
    finally:
        report = Path(__file__).resolve().parents[2] / "out" / f"corpus-guarded-{name}.json"
        report.parent.mkdir(exist_ok=True)
        report.write_text(json.dumps(OUTCOMES.get(name, {}), indent=1, sort_keys=True))
        guard.stop()
        if own is not None:
            own.stop()


@pytest.mark.parametrize("payload_id", list(PAYLOADS))
def test_the_corpus_through_the_guard(
    target: Target, payload_id: str, request: pytest.FixtureRequest
) -> None:
    payload = PAYLOADS[payload_id]
    name = target.upstream.name
    known = KNOWN.get((name, payload_id))
    if known is not None:
        request.applymarker(pytest.mark.xfail(reason=f"{name}: {known}", strict=True))
    outcome = run_payload(
        payload,
        target.guard.url,
        target.upstream,
        model=target.model,
        budgets=BUDGETS,
        baseline_rss_mb=target.baseline_rss_mb,
        refusal_5xx=LLAMACPP_REFUSAL if name == "llamacpp" else None,
    )
    detail = (
        f"{payload_id}: {outcome.status} {outcome.code} harm={outcome.harm} "
        f"{outcome.elapsed_s:.1f}s {outcome.peak_rss_mb:.0f}MB {outcome.message[:300]!r}"
    )
    OUTCOMES.setdefault(name, {})[payload_id] = outcome.to_dict()
    assert target.guard.alive(), target.guard.log_tail()
    assert "crash" not in outcome.harm and "hang" not in outcome.harm, detail
    assert "rss" not in outcome.harm, detail
    assert outcome.status != 0, detail
    if payload.kind == "attack":
        assert outcome.status < 500 or payload.expect.status >= 500, detail
    else:
        refused = REFUSED.get((name, payload_id))
        if refused is not None:
            assert outcome.status == 400 and outcome.code == refused[0], (
                f"{detail}; expected the guard's 400 {refused[0]}: {refused[1]}"
            )
            return
        why = UNSUPPORTED.get((name, payload_id))
        if why is not None and not 200 <= outcome.status < 300:
            pytest.skip(f"{name} does not serve it: {why}")
        assert 200 <= outcome.status < 300, detail

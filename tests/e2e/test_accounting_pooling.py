"""The guard's count of vLLM's pooling and scoring routes against what vLLM serves (issue 22).

vLLM serves the e2e model as an embedding model (``--runner pooling --convert embed``; its own
server, started after the template servers and stopped before the session's starts), with the
guard in front of it proxying ``/pooling``, ``/score``, ``/v1/score``, ``/rerank`` and
``/v1/rerank``. For every body vLLM serves, the guard's dry-run ``costs.prompt_tokens`` must be
at least vLLM's ``usage.prompt_tokens``, and the guard must admit it: embeddings and ``/pooling``
are counted exactly; a scored pair counts both texts (vLLM's bi-encoder embeds the query once
for all the documents, so 1:N is over by the repeated query).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from loadtests.chat_accounting import post_json
from schedguard.servers import RunningServer
from tests._guard_process import guard_spec, start
from tests.e2e.conftest import RunningUpstream, start_upstream

ROUTES = ["/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank"]
DOC = "The committee reviewed the quarterly figures and adjourned until Thursday. "
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "embeddings string": ("/v1/embeddings", {"input": "hello world"}),
    "embeddings list": ("/v1/embeddings", {"input": ["hello world", DOC * 3]}),
    "embeddings token ids": ("/v1/embeddings", {"input": [1, 2, 3, 4]}),
    "embeddings no specials": ("/v1/embeddings", {"input": DOC, "add_special_tokens": False}),
    "embeddings messages": (
        "/v1/embeddings",
        {"messages": [{"role": "user", "content": "hi there"}]},
    ),
    "embeddings batched chats": (
        "/v1/embeddings",
        {"messages": [[{"role": "user", "content": "a"}], [{"role": "user", "content": DOC}]]},
    ),
    "embeddings chats as input": (
        "/v1/embeddings",
        {"input": [[{"role": "user", "content": "a"}], [{"role": "user", "content": DOC}]]},
    ),
    "pooling inputs": ("/pooling", {"input": ["hello", DOC]}),
    "pooling messages": ("/pooling", {"messages": [{"role": "user", "content": DOC}]}),
    "score 1:N": ("/score", {"text_1": "what was decided", "text_2": [DOC, "short", DOC * 2]}),
    "score N:N": ("/v1/score", {"queries": ["a", "b"], "documents": [DOC, "c"]}),
    "score items": ("/score", {"queries": "q", "items": ["x", DOC]}),
    "score data": ("/score", {"data_1": "q", "data_2": "d"}),
    "rerank": ("/rerank", {"query": "what was decided", "documents": [DOC, "short"], "top_n": 1}),
    "rerank v1": ("/v1/rerank", {"query": "q", "documents": ["a", DOC * 4]}),
}


@pytest.fixture(scope="module")
def pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningUpstream, str]]:
    for upstream in start_upstream("vllm", "--runner", "pooling", "--convert", "embed"):
        policy = tmp_path_factory.mktemp("pooling") / "policy.yaml"
        policy.write_text(
            f"routes: [{', '.join(ROUTES)}]\n"
            f"limits:\n  tokens:\n    tokenizer: {upstream.tokenizer_json}\n"
            "    max_prompt_tokens: 100000\n"
            # A render stalled past the 1 s default on a shared machine falls back to the
            # bound: not what this compares.
            "  templates:\n    chat_template:\n      deadline_s: 30\n"
            "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
        )
        guard: RunningServer = start(guard_spec("guard", upstream.base_url, policy))
        try:
            guard.wait_ready(120)
            yield upstream, guard.url
        finally:
            guard.stop()


@pytest.mark.parametrize("case", CASES)
def test_the_count_covers_what_vllm_pools(case: str, pooling: tuple[RunningUpstream, str]) -> None:
    upstream, guard = pooling
    path, body = CASES[case]
    body = {**body, "model": upstream.model}
    _, verdict = post_json(f"{guard}/guard/v1/check?path={path}", body)
    status, reply = post_json(upstream.base_url + path, body)
    assert status == 200, (status, reply)
    usage = reply["usage"]["prompt_tokens"]
    assert verdict.get("allowed"), verdict  # no false refusal
    bound = verdict["costs"]["prompt_tokens"]
    assert bound >= usage, (case, bound, usage, verdict)
    if not path.endswith(("score", "rerank")):
        assert bound == usage, (case, bound, usage, verdict)

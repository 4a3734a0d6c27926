"""The guard's prompt count against real vLLM, one real chat template at a time (issue 22).

Each template of ``loadtests/chat_templates`` (written from the model cards) is served by the e2e
vLLM started with ``--chat-template FILE`` (one server at a time: this module runs before the
session's vLLM starts, and each server is stopped before the next), and given to the guard as an
operator would: a copy alone in another folder, the tokenizer next to the model. The guard runs
in front of that vLLM (its kind detected: vLLM's renders are the ones modelled). Over
``loadtests.chat_accounting.CHATS``, for every request vLLM serves, the guard's dry-run
``costs.prompt_tokens`` must be at least vLLM's ``usage.prompt_tokens`` and at most 1.5 times
it, and the guard must not refuse it; what the guard refuses, vLLM refuses too. The outcome per
template goes to ``out/template-accounting.json`` (bench/README.md has the table).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest

from loadtests.chat_accounting import (
    CHATS,
    TEMPLATES_DIR,
    Comparison,
    compare,
    guard_policy_yaml,
    post_json,
    separate_template,
    summarize,
)
from schedguard.servers import RunningServer
from tests._guard_process import guard_spec, start
from tests.e2e.conftest import RunningUpstream, start_upstream

TEMPLATES = sorted(p.name for p in TEMPLATES_DIR.glob("*.jinja"))
REPORT = Path(__file__).resolve().parents[2] / "out" / "template-accounting.json"


@pytest.fixture(scope="module", params=TEMPLATES)
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, RunningUpstream, str]]:
    """(template name, vLLM serving it with --chat-template, the guard in front of it)."""
    name: str = request.param
    template = TEMPLATES_DIR / name
    for upstream in start_upstream("vllm", "--chat-template", str(template)):
        tmp = tmp_path_factory.mktemp(f"accounting-{template.stem}")
        separate = separate_template(template, tmp / "templates")
        policy = tmp / "policy.yaml"
        policy.write_text(guard_policy_yaml(upstream.tokenizer_json, separate, 4096))
        guard: RunningServer = start(guard_spec("guard", upstream.base_url, policy))
        try:
            guard.wait_ready(120)
            yield name, upstream, guard.url
        finally:
            guard.stop()


def _counter(guard_url: str) -> Any:
    def count(body: dict[str, Any]) -> tuple[int | None, str]:
        _, verdict = post_json(f"{guard_url}/guard/v1/check?path=/v1/chat/completions", body)
        if verdict.get("allowed"):
            return int(verdict["costs"]["prompt_tokens"]), ""
        return None, f"guard {verdict.get('code')}: {str(verdict.get('message'))[:160]}"

    return count


def _record(name: str, comparisons: list[Comparison]) -> None:
    REPORT.parent.mkdir(exist_ok=True)
    data = json.loads(REPORT.read_text()) if REPORT.is_file() else {}
    data[name] = {
        "summary": asdict(summarize(name, comparisons)),
        "requests": [asdict(c) for c in comparisons],
    }
    REPORT.write_text(json.dumps(data, indent=2, sort_keys=True))


def test_the_count_is_a_tight_upper_bound_of_what_vllm_serves(
    served: tuple[str, RunningUpstream, str],
) -> None:
    name, upstream, guard_url = served
    count = _counter(guard_url)
    comparisons = [
        compare(case, body, count, upstream.base_url, upstream.model)
        for case, body in CHATS.items()
    ]
    _record(name, comparisons)
    summary = summarize(name, comparisons)
    assert not summary.under, summary.under
    assert not summary.refused_by_guard, summary.refused_by_guard  # no false refusal
    assert summary.compared >= 20, summary
    assert summary.max_ratio <= 1.5, [
        (c.name, c.bound, c.usage) for c in comparisons if c.bound and c.usage
    ]

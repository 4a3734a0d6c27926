"""Live fuzz campaigns (fuzz.live) against the real upstreams: black-box against unguarded
llama-cpp-python (which a deep or invalid GBNF grammar kills) and against the guard in front of
it, and a short differential campaign against vLLM behind the guard.

Each llama-cpp-python test starts its own server (the campaign may kill it) and stops it after.
The campaigns are short (a minute at most); bench/README.md has the long runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from fuzz.live import LiveOptions, run_live_campaign
from payloads import load_payload
from tests._guard_process import guard_spec, start
from tests.e2e.conftest import RunningUpstream, start_upstream

# llama-cpp-python 0.3.36 answers a request its pydantic models refuse with 500 "N validation
# error(s)": its way of refusing invalid input, not a fault the campaign is after.
LLAMACPP_REFUSALS = ("validation error",)
CAMPAIGN_S = 60.0


@pytest.fixture
def own_llamacpp() -> Iterator[RunningUpstream]:
    """A llama-cpp-python server for one test only: the campaign may kill it."""
    yield from start_upstream("llamacpp")


def _policy(tmp: Path, tokenizer: Path, max_prompts: int | None = None) -> Path:
    policy = tmp / "policy.yaml"
    fanout = f"  fanout:\n    max_prompts: {max_prompts}\n" if max_prompts else ""
    policy.write_text(
        f"limits:\n  tokens:\n    tokenizer: {tokenizer}\n{fanout}"
        "rate:\n  requests_per_minute: null\n  tokens_per_minute: null\n"
    )
    return policy


def test_black_box_finds_a_crash_in_unguarded_llamacpp(
    own_llamacpp: RunningUpstream, tmp_path: Path
) -> None:
    report = run_live_campaign(
        LiveOptions(
            target=own_llamacpp.base_url,
            duration_s=CAMPAIGN_S,
            pids=(own_llamacpp.pid,),
            ignore_5xx=LLAMACPP_REFUSALS,
            expect_findings=True,
            stop_on_first=True,
            seed=1,
            out_dir=tmp_path / "out",
            minimise_s=5.0,
            dead_wait_s=2.0,
            progress=None,
        )
    )
    verdicts = {f.outcome.verdict for f in report.findings}
    assert verdicts & {"crash", "timeout", "server_error"}, report.results[0].extra
    assert report.time_to_first_finding_s is not None
    assert report.time_to_first_finding_s < CAMPAIGN_S
    assert report.exit_status == 0  # expected findings on an unguarded server
    for f in report.findings:
        assert f.path is not None
        load_payload(Path(f.path))


def test_black_box_through_the_guard_finds_nothing(
    own_llamacpp: RunningUpstream, tmp_path: Path
) -> None:
    # In front of llama-cpp-python: one prompt per completion (it asserts so; POLICY.md).
    policy = _policy(tmp_path, own_llamacpp.tokenizer_json, max_prompts=1)
    guard = start(guard_spec("guard", own_llamacpp.base_url, policy))
    try:
        guard.wait_ready(60)
        report = run_live_campaign(
            LiveOptions(
                target=guard.url,
                duration_s=CAMPAIGN_S,
                jobs=2,
                pids=(guard.proc.pid, own_llamacpp.pid),
                ignore_5xx=LLAMACPP_REFUSALS,
                seed=1,
                out_dir=tmp_path / "out",
                minimise_s=5.0,
                dead_wait_s=2.0,
                progress=None,
            )
        )
    finally:
        guard.stop()
    stats = report.results[0].extra["stats"]
    assert stats["requests"] > 100, stats
    assert not report.findings, [f"{f.cause}: {f.data[:300]!r}" for f in report.findings]


def test_differential_against_vllm_behind_the_guard(
    vllm_upstream: RunningUpstream, tmp_path: Path
) -> None:
    guard = start(
        guard_spec("guard", vllm_upstream.base_url, _policy(tmp_path, vllm_upstream.tokenizer_json))
    )
    try:
        guard.wait_ready(120)
        report = run_live_campaign(
            LiveOptions(
                target=vllm_upstream.base_url,
                guard=guard.url,
                duration_s=45.0,
                jobs=2,
                pids=(vllm_upstream.pid,),
                seed=1,
                out_dir=tmp_path / "out",
                minimise_s=8.0,
                progress=None,
            )
        )
    finally:
        guard.stop()
    result = report.results[0]
    stats = result.extra["stats"]
    assert not result.extra["errors"], result.extra["errors"]
    assert report.engine == "differential" and stats["model"] == vllm_upstream.model
    assert stats["guard_verdicts"].get("allowed", 0) > 20, stats
    assert stats["verdicts"].get("ok", 0) + stats["verdicts"].get("undercount", 0) > 20, stats
    kinds = {"undercount", "false_positive", "server_error", "crash", "timeout", "budget"}
    for f in report.findings:
        assert f.outcome.verdict in kinds
        assert f.path is not None
        saved = load_payload(Path(f.path))
        if f.outcome.verdict == "undercount":
            extra = f.outcome.extra
            assert int(extra["upstream_prompt_tokens"]) > int(extra["guard_prompt_tokens"])
            assert saved.class_ == "volume"
    assert report.exit_status == (1 if report.findings else 0)
    data = json.loads((tmp_path / "out" / "report.json").read_text())
    assert data["engine"] == "differential" and data["engines"][0]["stats"]["requests"] > 20

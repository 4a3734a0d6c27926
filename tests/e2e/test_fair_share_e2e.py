"""A fair share of real upstreams (issue 25 item 4): bench/fair_share.py through the guard.

One tenant keeps 8 long streams open (4 never read) while another sends short chats, one at a
time: every chat is answered, none refused or left waiting past 20 s, and the guard's capacity
in force is the upstream's (llama-cpp-python: its kind; vLLM: its /metrics). What the decisions
buy in latency is a figure, not asserted here (it depends on the machine): bench/README.md
("A fair share of the upstream") has it, side by side with the guard before.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests._support import REPO_ROOT
from tests.e2e.conftest import RunningUpstream


def _run(upstream: RunningUpstream, tmp: Path, *extra: str) -> dict[str, object]:
    out = tmp / "fair.json"
    argv = [sys.executable, str(REPO_ROOT / "bench" / "fair_share.py"), "--upstream",
            upstream.base_url, "--solo", "6", "--duration", "20", "--json", str(out), *extra]  # fmt: skip
    proc = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary: dict[str, object] = json.loads(out.read_text())["summary"]
    return summary


def _assert_fair(summary: dict[str, object], source: str) -> None:
    assert summary["chat_unanswered"] == 0, summary
    solo, flood = summary["chat_solo"], summary["chat_flood"]
    assert isinstance(solo, dict) and isinstance(flood, dict)
    assert solo["n"] > 0 and flood["n"] > 0, summary
    capacity = summary["capacity"]
    assert isinstance(capacity, dict) and capacity["capacity_source"] == source, summary


def test_llama_cpp_python_chats_are_answered_beside_a_flood(
    llamacpp_text_upstream: RunningUpstream, tmp_path: Path
) -> None:
    # The model whose text decodes: the default one's does not, and llama-cpp-python
    # detokenises such a stream in superlinear time inside one step (256 tokens: 3.7 s, 2048:
    # over 15 minutes), which no proxy can interrupt; see docs/FINDINGS.md. The flood is the
    # issue's: 2048 tokens, n 16.
    summary = _run(llamacpp_text_upstream, tmp_path)
    _assert_fair(summary, "kind")


@pytest.mark.timeout(900)
def test_vllm_chats_are_answered_beside_a_flood(
    vllm_upstream: RunningUpstream, tmp_path: Path
) -> None:
    summary = _run(vllm_upstream, tmp_path, "--flood-tokens", "1024", "--flood-n", "4")
    _assert_fair(summary, "upstream")


@pytest.mark.timeout(300)
def test_the_text_models_stream_decodes_token_by_token(
    llamacpp_text_upstream: RunningUpstream,
) -> None:
    """What the measurements above rest on: each streamed token of the text variant carries
    text of its own (the default model's are mostly held back as undecodable bytes)."""
    body = {"model": llamacpp_text_upstream.model, "prompt": "Hi", "max_tokens": 200,
            "stream": True, "seed": 1}  # fmt: skip
    texts: list[str] = []
    url = llamacpp_text_upstream.openai_base_url + "/completions"
    with httpx.stream("POST", url, json=body, timeout=240) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                texts.append(json.loads(line[6:])["choices"][0]["text"])
    assert len(texts) >= 100, len(texts)  # a random model may end at its EOS, rarely soon
    # Empty: the last chunk (its finish_reason) and a token that decodes to nothing, rarely;
    # the default model, measured the same way: 11 of 201.
    assert sum(1 for text in texts if not text) <= 3, texts
    assert "\ufffd" not in "".join(texts)

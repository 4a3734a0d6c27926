"""From finding to upstream report against real llama-cpp-python: `schedguard fuzz run` finds
the segfault class (a grammar llama.cpp rejects: a NULL grammar sampler added unchecked), names
it by the stack the server's log shows, minimises it restarting the server after every test that
kills it, files it as one group, and `schedguard fuzz report --format issue` writes a `curl`
reproduction that kills a freshly started server.

The campaign's seeds are a small corpus (a benign chat and one request with an invalid grammar
among other fields), so that the test takes a minute, not the corpus's whole round."""

from __future__ import annotations

import json
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from schedguard.cli import main
from tests.e2e.conftest import RunningUpstream, start_upstream

LLAMACPP_REFUSALS = ("validation error",)
CHAT = "/v1/chat/completions"


@pytest.fixture
def own_llamacpp() -> Iterator[RunningUpstream]:
    """A llama-cpp-python server for this test only: the campaign kills and restarts it."""
    yield from start_upstream("llamacpp")


def _corpus(root: Path) -> Path:
    attack = {
        "messages": [{"role": "user", "content": "Say yes."}],
        "max_tokens": 4,
        "temperature": 0.3,
        "stop": ["\n"],
        "grammar": 'root ::= "yes" | (',
    }
    benign = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2}
    for sub, pid, body, expect in (
        ("attacks/volume", "bad-grammar", attack, {"status": 400, "code": "x_y"}),
        ("benign", "hello", benign, {"status": 200}),
    ):
        d = root / sub
        d.mkdir(parents=True, exist_ok=True)
        doc = {"id": pid, "class": "volume" if "attacks" in sub else "benign",
               "description": "e2e", "target_field": "body", "endpoint": CHAT, "body": body,
               "expect": expect}  # fmt: skip
        (d / f"{pid}.yaml").write_text(yaml.safe_dump(doc))
    return root


def test_the_segfault_is_one_group_minimised_across_restarts_with_a_working_curl(
    own_llamacpp: RunningUpstream, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    status = main(["fuzz", "run", "--target", own_llamacpp.base_url, "--pid", "auto",
                   "--corpus", str(_corpus(tmp_path / "corpus")), "--duration", "60",
                   "--minimise-s", "90", "--dead-wait", "30", "--seed", "3",
                   "--ignore-5xx", LLAMACPP_REFUSALS[0], "--expect-findings", "--quiet",
                   "--out", str(out)])  # fmt: skip
    assert status == 0  # expected findings on an unguarded server
    record = json.loads((out / "report.json").read_text())
    stats = record["engines"][0]["stats"]
    crashes = [g for g in record["groups"] if g["representative"]["verdict"] == "crash"]
    assert len(crashes) == 1, [g["signature"] for g in record["groups"]]
    group = crashes[0]
    assert re.fullmatch(r"SIGSEGV@llama_cpp/[\w/]+\.py:\w+", group["signature"]), group
    rep = group["representative"]
    assert rep["minimised"] and stats["restarts"] >= 2, stats
    small = json.loads(rep["input"])
    assert "grammar" in small and "messages" not in small  # down to the field that kills it
    assert record["environment"]["kind"] == "llama_cpp"
    assert "llama_cpp_python" in {
        k.replace("-", "_").lower() for k in record["environment"]["process"]["packages"]
    }

    assert main(["fuzz", "report", str(out), "--format", "issue"]) == 0
    (issue,) = [p for p in (out / "issues").glob("*.md") if "crash" in p.name]
    text = issue.read_text()
    curl = re.search(r"```sh\n(.*?)\n```", text, re.S)
    assert curl is not None

    # The reproduction, as written, against a freshly started server: it dies by SIGSEGV.
    fresh_gen = start_upstream("llamacpp")
    fresh = next(fresh_gen)
    try:
        script = curl.group(1).replace(own_llamacpp.base_url, fresh.base_url)
        done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
        assert done.returncode != 0  # curl: the server closed the connection without an answer
        deadline = time.monotonic() + 10
        log = ""
        while time.monotonic() < deadline and "Segmentation fault" not in log:
            time.sleep(0.2)
            log = fresh.log.read_text(errors="replace")
        assert "Fatal Python error: Segmentation fault" in log
    finally:
        fresh_gen.close()

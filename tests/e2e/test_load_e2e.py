"""``schedguard load`` through the guard in front of real vLLM (issue 26, item 8).

The guard (``schedguard serve`` with the load tests' policy, loadtests/policy.yaml: tenants
``benign`` and ``attacker``) in front of the session's vLLM; ``schedguard load --host GUARD``
for a short run with a few users, told only the upstream's pid: the model and the upstream's
kind come from ``/v1/models``, the guard's memory from its own ``/metrics``. The gate: no benign
error (every request names vLLM's model, none carries the reference's own fields), every attack
refused (but those the guard admits in front of vLLM by design, left out: a first run got one of
llama.cpp's grammar crashers served), and both memories in the report. The latency and upstream RSS limits are opened up:
a CPU vLLM is slow and holds ~3 GB, and neither is what this run is about.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import loadtests
from schedguard.servers import RunningServer, schedguard_argv
from tests._guard_process import guard_spec, start
from tests.e2e.conftest import RunningUpstream

POLICY = Path(loadtests.__file__).with_name("policy.yaml")
DURATION_S = 45


@pytest.fixture(scope="module")
def guard(vllm_upstream: RunningUpstream) -> Iterator[RunningServer]:
    server = start(guard_spec("guard", vllm_upstream.base_url, POLICY))
    try:
        server.wait_ready(120)
        yield server
    finally:
        server.stop()


def test_load_through_the_guard_in_front_of_vllm(
    vllm_upstream: RunningUpstream, guard: RunningServer, tmp_path: Path
) -> None:
    out = tmp_path / "load"
    proc = subprocess.run(
        [
            *schedguard_argv("load"),
            "--host",
            guard.url,
            "--upstream-pid",
            str(vllm_upstream.pid),
            "--duration",
            str(DURATION_S),
            "--users",
            "3",
            "--attack-share",
            "0.3",
            "--p99-ms",
            "120000",
            "--max-upstream-rss-mb",
            "16000",
            "--max-guard-rss-mb",
            "1024",
            "--quiet",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=DURATION_S + 240,
    )
    assert proc.stdout, proc.stderr[-4000:]
    report = json.loads(proc.stdout)
    n = report["numbers"]
    detail = json.dumps({k: n[k] for k in ("benign_failure_samples", "attacks_not_rejected")})
    assert n["target"]["model"] == vllm_upstream.model
    assert n["target"]["upstream_kind"] == "vllm"
    # llama.cpp's grammar crashers: the guard lets them through to vLLM on purpose
    assert "gd-llamacpp-schema-maxlength-deep" in n["target"]["attacks_left_out"]
    assert n["benign_requests"] > 0 and n["benign_errors"] == 0, detail
    attacks = n["attacks"]  # loadtests.outcomes: what refused each attack
    assert n["attack_requests"] > 0 and attacks["content_judged"] > 0, detail
    assert attacks["content_stopped"] == attacks["content_judged"], detail
    assert attacks["flood_bursts_stopped"] == attacks["flood_bursts"], detail
    assert n["guard_peak_rss_mb"] is not None and n["guard_peak_rss_mb"] > 0
    assert n["upstream_peak_rss_mb"] is not None and n["upstream_peak_rss_mb"] > 0
    assert n["target"]["memory_from"] == {
        "guard": guard.url + "/metrics",
        "upstream": f"pid {vllm_upstream.pid}",
    }
    assert report["passed"] is True and proc.returncode == 0, (
        json.dumps(report["checks"], indent=1) + proc.stderr[-2000:]
    )

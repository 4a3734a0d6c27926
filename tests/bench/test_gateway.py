"""bench/gateway.py still runs: ``--quick`` with every mode, exit 0, its JSON report's keys.

No timing is asserted (shared, noisy machines). The script runs as a subprocess under
``RLIMIT_AS`` and a wall clock in its own session, so a timeout takes its servers down too.
It needs wrk (``apt-get install -y wrk``); without it the test is skipped, after checking that
the script says how to install it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from guard.isolation import kill_tree
from tests._support import REPO_ROOT

ROOT = REPO_ROOT
SCRIPT = ROOT / "bench" / "gateway.py"
TIMEOUT_S = 55.0
MEM_LIMIT = 4 << 30


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "guard._limited_exec", str(MEM_LIMIT), "--",
            sys.executable, str(SCRIPT), *args]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"bench/gateway.py did not finish in {timeout_s} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_without_wrk_it_says_how_to_install_it(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-wrk"
    result = _run(["--quick", "--wrk", str(missing)], 20.0)
    assert result.returncode == 2
    assert "apt-get install -y wrk" in result.stderr


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_quick_run_of_every_mode_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "gateway.json"
    result = _run(
        ["--quick", "--throughput", "--reject", "--rss", "--json", str(out)],
        TIMEOUT_S,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert set(report) == {"config", "targets", "throughput", "reject", "rss", "verdict"}

    throughput = report["throughput"]
    assert set(throughput["levels"]) == {"1", "32"}
    for level in throughput["levels"].values():
        assert set(level) >= {"direct", "passthrough", "guard"}
        for row in level.values():
            assert {"rps", "p50_ms", "p99_ms", "cpu_us_per_request", "errors"} <= set(row)
            assert row["rps"] > 0 and row["errors"] == 0 and row["non_2xx"] == 0
    assert {"guard_vs_passthrough", "guard_vs_direct"} <= set(throughput["ratios"]["32"])
    assert throughput["added_p50_ms_1conn"] is not None

    reject = report["reject"]
    assert reject["classes"] and not reject["mismatched"]
    for row in reject["classes"].values():
        assert {"p50_ms", "p99_ms", "payloads"} <= set(row)
        assert row["non_4xx"] == 0  # every replayed attack was refused
    assert reject["large"] and all("us_per_kb" in row for row in reject["large"])
    floor = reject["floor"]
    assert reject["rounds"] == 1 and len(floor["p99_ms_runs"]) == 1 and floor["p99_ms"] > 0
    assert floor["non_4xx"] == 0  # the floor's 1-byte body is refused too
    for row in reject["classes"].values():
        assert row["p99_over_floor_ms"] == pytest.approx(row["p99_ms"] - floor["p99_ms"])
    refused_by = {p["id"]: p["code"] for p in reject["payloads"]}
    assert reject["in_process"]
    for row in reject["in_process"]:
        # Timed in process, refused with the code it got over HTTP; the read is a part.
        assert row["code"] == refused_by[row["id"]]
        assert 0 <= row["json_read_ms"] <= row["guard_ms"] and row["json_loads_ms"] > 0

    rss = report["rss"]
    assert rss["requests"] >= 2000 and rss["rss_end_mb"] > 0 and rss["refused"] > 0
    assert set(report["verdict"]) >= {"guard_vs_passthrough_32", "reject_p99", "rss"}
    assert "Throughput" in result.stdout and "verdict" in result.stdout

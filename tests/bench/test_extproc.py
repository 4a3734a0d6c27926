"""bench/extproc.py still runs: a quick run of every row, exit 0, its JSON report's keys.

No timing is asserted. It runs as a subprocess in its own session (killed whole on a timeout);
not under the 4 GiB ``RLIMIT_AS`` of the other bench smoke runs, because Envoy's tcmalloc
reserves address space in 1 GiB regions (the script caps each of its servers itself). It needs
wrk; without it the test is skipped, after checking that the script says how to install it.
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

SCRIPT = REPO_ROOT / "bench" / "extproc.py"
TIMEOUT_S = 240.0


def _run(args: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SCRIPT), *args]
    proc = subprocess.Popen(
        argv, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        pytest.fail(f"bench/extproc.py did not finish in {timeout_s} s:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_without_wrk_it_says_how_to_install_it(tmp_path: Path) -> None:
    result = _run(["--quick", "--wrk", str(tmp_path / "no-such-wrk")], 20.0)
    assert result.returncode == 2
    assert "apt-get install -y wrk" in result.stderr


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed")
def test_quick_run_of_every_row_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "extproc.json"
    result = _run(["--quick", "--connections", "2", "--json", str(out)], TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {"config", "targets", "levels", "verdict", "load"} <= set(report)
    for level in report["levels"].values():
        assert set(level) == {"direct", "envoy", "noop", "noop_req", "noop_obs", "noop_sync",
                              "extproc", "extproc_nobody", "proxy"}  # fmt: skip
        for name, row in level.items():
            assert row["rps"] > 0 and row["errors"] == 0 and row["non_2xx"] == 0, name

"""Every bench script still runs: quickest flags, exit 0, machine-readable output with its keys.

Timings are never asserted (shared, noisy machines); the numbers are the scripts' business. Each
script runs as a subprocess under ``RLIMIT_AS`` (its own children cap themselves lower) and a
wall clock, in its own session so that a timeout takes its servers and workers down too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from guard.isolation import kill_tree
from tests._support import REPO_ROOT, free_port

ROOT = REPO_ROOT
BENCH = ROOT / "bench"
# An outer bound only: the quick runs take 2-10 s on a quiet machine, several times that with
# the other core busy and the suite running beside them.
TIMEOUT_S = 300.0
# Above the largest cap a bench gives its own children (bench/json_scan.py: 3 GiB).
MEM_LIMIT = 4 << 30


@dataclass(frozen=True)
class Bench:
    args: tuple[str, ...]  # "{json}" is replaced by the output path
    json_on_stdout: bool  # --json prints the JSON instead of writing a file
    keys: frozenset[str]
    row_keys: frozenset[str] = frozenset()  # of each of doc["rows"], when given


BENCHES: dict[str, Bench] = {
    "seed.py": Bench(
        ("--quick", "--runs", "5", "--json", "{json}"),
        json_on_stdout=False,
        keys=frozenset({"reference", "targets", "seed", "in_process", "throughput", "vulnerable"}),
    ),
    "tokens.py": Bench(
        ("--runs", "1", "--json"),
        json_on_stdout=True,
        keys=frozenset({"limit", "tokenizer", "runs", "rows"}),
        row_keys=frozenset({"input", "bytes", "decided_by", "decision_mb_s", "tiktoken_mb_s"}),
    ),
    "fuzz.py": Bench(
        ("--smoke", "--json", "{json}"),
        json_on_stdout=False,
        keys=frozenset({"config", "execs_per_s", "ttff", "ratios", "targets"}),
    ),
    "json_scan.py": Bench(
        ("--runs", "1", "--json"),
        json_on_stdout=True,
        keys=frozenset({"limits", "runs", "rows"}),
        row_keys=frozenset({"body", "kind", "bytes", "outcome", "parse_json_body_mb_s"}),
    ),
    "prompt_count.py": Bench(
        ("--runs", "1", "--json"),
        json_on_stdout=True,
        keys=frozenset({"tokenizer", "runs", "rows"}),
        row_keys=frozenset({"policy", "body", "us", "prompt_tokens", "verdict", "body_bytes"}),
    ),
    "idle_connections.py": Bench(
        ("--connections", "200", "--hold-s", "1", "--json", "{json}"),
        json_on_stdout=False,
        keys=frozenset({"connections", "flood", "after_flood", "same_peer_retry", "rss_mb"}),
    ),
    "fair_share.py": Bench(
        (
            "--solo",
            "2",
            "--duration",
            "4",
            "--streams",
            "2",
            "--unread",
            "1",
            "--hold",
            "2",
            "--flood-n",
            "2",
            "--flood-tokens",
            "256",
            "--json",
            "{json}",
        ),
        json_on_stdout=False,
        keys=frozenset({"summary", "timeline", "samples"}),
    ),
    "guided_check.py": Bench(
        ("--repeat", "1", "--sizes", "1,2", "--json"),
        json_on_stdout=True,
        keys=frozenset({"rows", "worst_16kb_ms"}),
        row_keys=frozenset({"shape", "kb", "us", "us_without_backends", "verdict"}),
    ),
}


# Scripts whose smoke run lives elsewhere, or that are long proofs run by hand (with why).
COVERED_ELSEWHERE: dict[str, str] = {
    "gateway.py": "tests/bench/test_gateway.py runs it with --quick (it needs wrk)",
    "extproc.py": "tests/bench/test_extproc.py runs it with --quick (it needs wrk and Envoy, "
    "whose address space is above this file's RLIMIT_AS)",
    "fuzz_proof.py": "issue 4's 4-minute proof campaign; its engine is tested in test_fuzz_search.py",
    "guided_backends.py": "issue 16's calibration table, minutes of real backend compiles at a 32k "
    "vocabulary; its targets are tested in test_fuzz_backends.py",
    "guided_vocab.py": "issue 23's calibration at real vocabularies: minutes of xgrammar compiles "
    "from an interpreter that has it (the vLLM venv of scripts/upstreams); run by hand",
    "guided_vllm.py": "issue 16's floods against a real vLLM (set up by scripts/upstreams, ~15 "
    "minutes); run by hand",
    "corpus_upstreams.py": "issue 13's corpus table against real vLLM and llama-cpp-python "
    "(scripts/upstreams, tens of minutes); its runner is tested in "
    "tests/loadtests/test_upstream_corpus.py and through the guard in tests/e2e/test_corpus_e2e.py",
    "llamacpp_logprobs.py": "starts the llama-cpp-python upstream (scripts/upstreams): "
    "tests/e2e/test_output_caps_e2e.py runs it with --positions 40",
    "vllm_campaign.py": "issue 24's 30-minute campaign against a real vLLM (scripts/upstreams) is "
    "run by hand; test_vllm_campaign_quick_against_a_fake_server below runs its --quick mode "
    "against tests/_fake_openai.py",
    "template_accounting.py": "issue 22's table: a real vLLM per chat template (scripts/upstreams, "
    "~1 minute each); tests/e2e/test_accounting_templates.py asserts the same comparisons",
}


class _Runs:
    """Each script runs once per session; its tests share the result."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.done: dict[str, tuple[int, str, dict[str, Any] | None]] = {}

    def get(self, script: str) -> tuple[int, str, dict[str, Any] | None]:
        if script not in self.done:
            self.done[script] = self._run(script, BENCHES[script])
        return self.done[script]

    def _run(self, script: str, bench: Bench) -> tuple[int, str, dict[str, Any] | None]:
        json_path = self.tmp / f"{script}.json"
        args = [a.replace("{json}", str(json_path)) for a in bench.args]
        argv = [sys.executable, "-m", "guard._limited_exec", str(MEM_LIMIT), "--",
                sys.executable, str(BENCH / script), *args]  # fmt: skip
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_tree(proc.pid)  # the bench's servers and workers too
            _, err = proc.communicate()
            return -1, f"timed out after {TIMEOUT_S:g} s\n" + err.decode(errors="replace"), None
        text = out.decode(errors="replace") if bench.json_on_stdout else None
        if text is None and json_path.is_file():
            text = json_path.read_text(encoding="utf-8")
        doc = json.loads(text) if proc.returncode == 0 and text else None
        return proc.returncode, err.decode(errors="replace"), doc


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> _Runs:
    return _Runs(tmp_path_factory.mktemp("bench"))


def _doc(runs: _Runs, script: str) -> dict[str, Any]:
    if not (BENCH / script).is_file():
        pytest.skip(f"bench/{script} is gone")
    code, err, doc = runs.get(script)
    assert code == 0, f"bench/{script} exited {code}\n{err[-3000:]}"
    assert doc is not None, f"bench/{script} wrote no JSON"
    return doc


def test_every_bench_script_is_covered() -> None:
    scripts = {p.name for p in BENCH.glob("*.py") if not p.name.startswith("_")}
    missing = sorted(scripts - set(BENCHES) - set(COVERED_ELSEWHERE))
    assert not missing, (
        f"bench scripts without a smoke run: {missing}; add them to BENCHES in {Path(__file__).name}"
        " with their quickest flags and the keys of their --json output"
    )


@pytest.mark.parametrize("script", sorted(BENCHES))
def test_bench_runs(script: str, runs: _Runs) -> None:
    bench = BENCHES[script]
    doc = _doc(runs, script)
    assert bench.keys <= doc.keys(), f"missing keys {sorted(bench.keys - doc.keys())}"
    if bench.row_keys:
        assert doc["rows"], "no rows"
        for row in doc["rows"]:
            assert bench.row_keys <= row.keys(), (
                f"row missing {sorted(bench.row_keys - row.keys())}"
            )


def test_seed_bench_reports_its_parts(runs: _Runs) -> None:
    """The seed bench's sections: outcome, latencies, RSS, both throughput tables."""
    doc = _doc(runs, "seed.py")
    seed = doc["seed"]
    # The hardened profile refuses the seed with one stable code: that is what is measured.
    assert 400 <= seed["status"] < 500 and seed["code"] and seed["stable"]
    for key in ("server_ms", "client_ms"):
        assert {"median", "p99"} <= seed[key].keys()
    assert {"rss_before_mb", "rss_after_mb", "rss_growth_mb", "rss_peak_mb"} <= seed.keys()
    assert doc["in_process"] is not None and {"median", "p99"} <= doc["in_process"]["ms"].keys()
    tp = doc["throughput"]
    for part, rate in (("depth_scan", "scan_mb_s"), ("token_count", "decision_mb_s")):
        assert tp[part]["rows"], part
        assert all(rate in row for row in tp[part]["rows"])
        assert {"input", "mb_s"} <= tp["worst"][part].keys()
    assert doc["vulnerable"] is None  # only with --vulnerable


def test_guided_check_times_a_revision_beside_this_tree() -> None:
    """``--against REV``: the same bodies through REV's guard package and this tree's, each
    timed in its own child process; benign bodies, so ``ok`` in both."""
    argv = [sys.executable, str(BENCH / "guided_check.py"), "--against", "HEAD", "--rounds", "1",
            "--repeat", "1", "--sizes", "1", "--shapes", "properties,regex", "--json"]  # fmt: skip
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["against"] == "HEAD" and [r["shape"] for r in doc["rows"]] == ["properties", "regex"]
    for row in doc["rows"]:
        assert row["verdict"] == row["verdict_against"] == "ok"
        assert row["us"] > 0 and row["us_against"] > 0 and row["ratio"] is not None


def test_vllm_campaign_quick_against_a_fake_server(tmp_path: Path) -> None:
    """bench/vllm_campaign.py's whole path (campaign, triage, issue reports, the groups matched
    with docs/findings) with ``--quick --target``: the scripted fake instead of vLLM, which
    only ``scripts/upstreams/upstreams.py setup vllm`` provides and takes a minute to start."""
    port = free_port()
    server_log = tmp_path / "fake.log"
    with server_log.open("wb") as err:
        fake = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "_fake_openai.py"), str(port)],
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    try:
        argv = [sys.executable, str(BENCH / "vllm_campaign.py"), "--quick", "--target",
                f"http://127.0.0.1:{port}", "--server-log", str(server_log), "--name", "fake",
                "--out", str(tmp_path / "out"), "--json"]  # fmt: skip
        proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    finally:
        kill_tree(fake.pid)
        fake.wait()
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    keys = {"execs", "time_to_first_finding_s", "findings", "findings_per_hour", "groups",
            "issues", "command", "duration_s"}  # fmt: skip
    assert keys <= doc.keys(), f"missing keys {sorted(keys - doc.keys())}"
    assert doc["execs"] > 0 and "--restart-cmd" not in doc["command"]
    assert len(doc["issues"]) == len(doc["groups"])  # one report per group
    for g in doc["groups"]:
        assert {"signature", "count", "representative_bytes", "guard", "records"} <= g.keys()
        assert g["records"] in ("known", "same-shape", "same-file", "new")

"""The guided compile budget phase (issue 23, loadtests/guided.py): ``schedguard load --scenario
guided-compile`` over HTTP, the guard (loadtests/guided_policy.yaml) in front of the reference
scheduler, both started by the command. One tenant warms benign structured-output schemas and
repeats them, the other sends a schema it never sent before 20 times a second.

Decisions only (who was admitted, refused with which code); the wall clock is an outer bound.
locust runs in a subprocess (gevent's monkey-patching stays there).
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

from loadtests import guided
from schedguard import _load_cli
from schedguard.cli import build_parser
from schedguard.servers import schedguard_argv


def test_the_app_schemas_are_distinct_benign_constraints() -> None:
    schemas = guided.benign_schemas(50)
    assert len(schemas) == 50
    assert len({s.id for s in schemas}) == 50
    assert schemas[0].id.startswith("bn-sx-")  # payloads/public/structured first
    assert all(json.loads(s.body)["model"] == guided.MODEL for s in schemas)
    # warming all of them fits the default burst (120 s) with room to spare
    assert 0 < sum(s.compile_s for s in schemas) < 120


def test_flood_schemas_are_unique() -> None:
    bodies = {guided.unique_body(i, "n") for i in range(100)}
    assert len(bodies) == 100
    assert guided.unique_body(1, "a") != guided.unique_body(1, "b")


def test_summary_counts_by_tenant_and_code() -> None:
    tally = {
        guided.tally_key(guided.APP, 200, None): 7,
        guided.tally_key(guided.FLOOD, 200, None): 3,
        guided.tally_key(guided.FLOOD, 429, "guided_compile_budget_exhausted"): 5,
        guided.tally_key(guided.FLOOD, 503, "guided_compile_pool_busy"): 1,
        guided.tally_key(guided.FLOOD, 0, None, "timeout: read"): 1,
        "attack 400 x": 9,
    }
    latency = {guided.WARM: (7, 200.0, 230.0)}
    s = guided.summarize(tally, latency, schemas=7, flood_after_s=5, flood_rps=20)
    app, flood = s["tenants"][guided.APP], s["tenants"][guided.FLOOD]
    assert (app["requests"], app["admitted"], app["refused"]) == (7, 7, {})
    assert (flood["requests"], flood["admitted"], flood["server_errors"]) == (10, 3, 1)
    assert flood["refused"] == {
        "429 guided_compile_budget_exhausted": 5,
        "503 guided_compile_pool_busy": 1,
        "no answer timeout": 1,
    }
    table = guided.render(s)
    assert "| flood | 10 | 3 | 429 guided_compile_budget_exhausted: 5, " in table
    assert guided.DURING in table


def test_the_scenario_runs_two_users_and_names_its_report() -> None:
    args = build_parser().parse_args(
        ["load", "--scenario", "guided-compile", "--users", "9", "--flood-rps", "7"]
    )
    target = _load_cli.LoadEndpoints("http://g", "http://g", "http://u", 11, 22)
    cmd = _load_cli.locust_argv(args, target, Path("out"))
    joined = " ".join(cmd)
    assert "-u 2" in joined and "--scenario guided-compile" in joined
    assert cmd[cmd.index("--guided-flood-rps") + 1] == repr(7.0)
    assert cmd[cmd.index("--guided-json") + 1] == str(Path("out") / "guided.json")


@pytest.mark.skipif(
    importlib.util.find_spec("locust") is None, reason="the load extra (locust) is not installed"
)
def test_a_unique_schema_flood_is_refused_and_the_warmed_app_is_not(tmp_path: Path) -> None:
    """~22 s: the app warms 20 schemas (one request at a time, ~5 a second), repeats them; the
    flood starts at 8 s. The app: every request admitted, no 5xx, repeats during the flood.
    The flood: admitted until its share of the compile budget is spent, then refused with
    429 guided_compile_budget_exhausted, never a 5xx."""
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            *schedguard_argv("load"),
            "--scenario",
            "guided-compile",
            "--duration",
            "22",
            "--flood-after",
            "8",
            "--flood-rps",
            "20",
            "--out",
            str(out),
            "--json",
            "--",
            "--guided-schemas",
            "20",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert report["passed"] is True and report["mode"] == "guard"
    summary = report["guided"]
    assert summary == json.loads((out / "guided.json").read_text())
    app, flood = summary["tenants"][guided.APP], summary["tenants"][guided.FLOOD]

    assert app["requests"] > 20 and app["admitted"] == app["requests"]
    assert app["refused"] == {} and app["server_errors"] == 0
    latency = app["latency_ms"]
    assert latency[guided.WARM]["requests"] == 20
    assert latency[guided.DURING]["requests"] > 0

    assert flood["requests"] >= 100  # ~20 a second for ~14 s
    assert flood["admitted"] >= 1  # its bucket had something in it
    assert flood["refused"] == {
        "429 guided_compile_budget_exhausted": flood["requests"] - flood["admitted"]
    }
    assert flood["requests"] - flood["admitted"] > flood["admitted"]
    assert flood["server_errors"] == 0 and flood["no_answer"] == 0
    # the guard's own count (its /metrics) has the same code, for at least what the client saw
    rejections = report["numbers"]["guard_rejections_by_code"]
    assert set(rejections) == {"guided_compile_budget_exhausted"}
    assert rejections["guided_compile_budget_exhausted"] >= flood["requests"] - flood["admitted"]

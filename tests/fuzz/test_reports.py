"""Campaign reports (report.json, JUnit, SARIF 2.1.0, summary.md + SVG) and the CLI."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from fuzz import CampaignReport, Cost, EngineResult, Finding, Outcome, write_reports
from fuzz.report import render_svg, to_sarif
from schedguard.cli import main


def _report(kind: str = "hardened", findings: int = 2) -> CampaignReport:
    fs = []
    for i in range(findings):
        crash = i == 0
        out = Outcome(
            "crash" if crash else "timeout",
            Cost(time_s=0.5, cpu_s=0.4, peak_mem_bytes=1 << 20, steps=10),
            "KeyError" if crash else "Timeout",
            "boom",
            "guard/pipeline.py:120:run_checks" if crash else "timeout",
        )
        fs.append(
            Finding(
                target="t",
                engine="search",
                cause="crash:KeyError:guard/pipeline.py:120:run_checks" if crash else "time",
                outcome=out,
                original=b"x" * 40,
                data=b"x" * 8,
                cost_before=Cost(time_s=1.0, steps=99),
                cost_after=out.cost,
                found_after_s=1.5 + i,
                minimised=True,
                path=None,
            )
        )
    res = EngineResult(
        execs=1000,
        findings=fs,
        best_cost_over_time=[(0.0, 0.0), (0.5, 2.0), (1.5, 500.0), (10.0, 500.0)],
        coverage=12,
        time_to_first_finding_s=1.5 if fs else None,
        engine="search",
        duration_s=10.0,
    )
    return CampaignReport(
        target="t",
        kind=kind,
        description="a target",
        engine="search",
        duration_s=10.0,
        budgets={"wall_s": 1.0},
        results=[res],
        findings=fs,
        fails_ci=kind in ("hardened", "guard"),
        source="guard/pipeline.py",
    )


def test_reports_are_written_with_their_schemas(tmp_path: Path) -> None:
    paths = write_reports(_report(), tmp_path)
    doc = json.loads(paths["json"].read_text())
    for key in ("target", "engine", "duration_s", "execs", "time_to_first_finding_s", "findings"):
        assert key in doc
    assert doc["time_to_first_finding_s"] == 1.5 and doc["exit_status"] == 1
    for f in doc["findings"]:
        assert {"size_bytes", "cost", "path"} <= set(f) and f["size_bytes"] == 8
    suite = ET.fromstring(paths["junit"].read_text())
    assert suite.tag == "testsuite" and suite.get("failures") == "2"
    assert len(suite.findall("testcase/failure")) == 2
    sarif = json.loads(paths["sarif"].read_text())
    assert sarif["version"] == "2.1.0" and "sarif-2.1.0" in sarif["$schema"]
    run = sarif["runs"][0]
    assert run["tool"]["driver"]["name"] == "schedguard-fuzz"
    assert len(run["results"]) == 2
    rule_ids = {r["id"] for r in run["tool"]["driver"]["rules"]}
    for r in run["results"]:
        assert r["ruleId"] in rule_ids and r["level"] == "error"
        assert r["message"]["text"]
        loc = r["locations"][0]["physicalLocation"]
        assert loc["artifactLocation"]["uri"] and loc["region"]["startLine"] >= 1
    crash = next(r for r in run["results"] if r["ruleId"] == "fuzz/crash")
    assert crash["locations"][0]["physicalLocation"]["region"]["startLine"] == 120
    summary = paths["summary"].read_text()
    assert "best_cost.svg" in summary and "| findings | 2 |" in summary
    svg = ET.fromstring(paths["svg"].read_text())
    assert svg.tag.endswith("svg") and svg.find("{http://www.w3.org/2000/svg}path") is not None


def test_vulnerable_findings_pass_ci() -> None:
    rep = _report(kind="vulnerable")
    assert rep.exit_status == 0
    assert all(r["level"] == "warning" for r in to_sarif(rep)["runs"][0]["results"])
    assert _report(kind="guard", findings=0).exit_status == 0


def test_svg_without_points_is_valid() -> None:
    ET.fromstring(render_svg([], 5.0, "empty <title>"))


def test_cli_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    names = {r["name"] for r in rows}
    assert {"guard-pipeline", "placeholder-vulnerable", "scheduler-state"} <= names
    row = next(r for r in rows if r["name"] == "guard-pipeline")
    assert row["kind"] == "guard" and row["fails_ci"] and row["budgets"]["wall_s"] > 0
    assert main(["fuzz", "list"]) == 0
    assert "exercises:" in capsys.readouterr().out


def test_cli_list_shows_the_backend_targets(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The structured-output backend targets are listed too; one whose backend is not
    installed says which extra installs it."""
    from fuzz.targets import BACKEND_TARGETS, get_target

    xgrammar = get_target("backend-xgrammar")
    monkeypatch.setattr(xgrammar, "available", lambda: False)
    assert main(["fuzz", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(BACKEND_TARGETS) <= set(rows)
    assert not rows["backend-xgrammar"]["installed"]
    assert "pip install 'schedguard[backends-xgrammar]'" in rows["backend-xgrammar"]["missing"]
    assert rows["guard-pipeline"]["installed"] and rows["guard-pipeline"]["missing"] is None
    assert main(["fuzz", "list"]) == 0
    text = capsys.readouterr().out
    assert "backend-outlines  [guard" in text and "backend-guidance  [guard" in text
    assert "not runnable here: xgrammar is not installed" in text


def test_cli_run_writes_reports_and_gates(tmp_path: Path) -> None:
    out = tmp_path / "ok"
    args = ["fuzz", "run", "--engine", "search", "--duration", "1.5", "--seed", "1", "--quiet"]
    # The guard pipeline by a count of executions: warming it up takes seconds of the duration
    # on a busy machine (the duration is then only the outer bound).
    runs = ["--runs", "300", "--duration", "60"]
    ok = main([*args, *runs, "--target", "guard-pipeline", "--out", str(out), "--no-save"])
    assert ok == 0
    doc = json.loads((out / "report.json").read_text())
    assert doc["target"] == "guard-pipeline" and doc["execs"] > 100 and doc["findings"] == []
    for name in ("junit.xml", "report.sarif", "summary.md", "best_cost.svg"):
        assert (out / name).is_file()
    bad = tmp_path / "bad"
    target = "tests._fuzz_targets:GuardCommands"
    status = main([*args, "--target", target, "--out", str(bad), "--found-root", str(tmp_path)])
    assert status == 1  # a guard-kind target with a finding fails CI
    doc = json.loads((bad / "report.json").read_text())
    assert doc["findings"] and doc["exit_status"] == 1
    assert main([*args, "--target", "nope", "--no-save"]) == 2


def test_cli_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from payloads import DEFAULT_ROOT

    seed = DEFAULT_ROOT / "attacks" / "nested_prompt_template" / "npt-seed.yaml"
    assert main(["fuzz", "replay", str(seed), "--target", "placeholder-hardened", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["verdict"] == "rejected" and row["error_code"]
    assert main(["fuzz", "replay", str(seed)]) == 2  # curated: no target recorded


def test_cli_run_writes_under_the_current_directory_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports and findings go to out/fuzz/TARGET under the current directory unless asked
    otherwise: never into the package's own corpus (payloads/found/)."""
    from payloads import DEFAULT_ROOT

    before = sorted(DEFAULT_ROOT.rglob("*"))
    monkeypatch.chdir(tmp_path)
    target = "tests._fuzz_targets:GuardCommands"
    args = ["fuzz", "run", "--engine", "search", "--duration", "1.5", "--seed", "1", "--quiet"]
    assert main([*args, "--target", target]) == 1  # it has findings
    out = Path("out", "fuzz", "tests-_fuzz_targets-guardcommands")
    doc = json.loads((out / "report.json").read_text())
    saved = [Path(f["path"]) for f in doc["findings"]]
    assert saved and all(p.is_file() and p.is_relative_to(out / "found") for p in saved)
    assert sorted(DEFAULT_ROOT.rglob("*")) == before
    # A library caller that saves findings says where.
    from fuzz import CampaignOptions, run_campaign

    with pytest.raises(ValueError, match="save_root or out_dir"):
        run_campaign(CampaignOptions(target=target, progress=None))


def test_cli_run_stops_after_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--runs N ends the campaign after about N executions, whatever the machine's speed (the
    duration is only the outer bound); it is refused for a live server."""
    out = tmp_path / "out"
    args = ["fuzz", "run", "--target", "placeholder-hardened", "--duration", "300"]
    assert main([*args, "--runs", "400", "--seed", "2", "--quiet", "--out", str(out)]) == 0
    execs = json.loads((out / "report.json").read_text())["execs"]
    assert 400 <= execs < 400 + 512, execs  # the last batch may overshoot
    assert main(["fuzz", "run", "--target", "http://127.0.0.1:9", "--runs", "5"]) == 2
    assert "--runs applies to in-process targets" in capsys.readouterr().err


def test_cli_fuzz_options_all_have_help() -> None:
    import argparse

    from schedguard import _fuzz_cli

    parser = argparse.ArgumentParser()
    _fuzz_cli.add_parser(parser.add_subparsers())
    [fuzz] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    [actions] = [a for a in fuzz.choices["fuzz"]._actions if a.dest == "fuzz_command"]
    assert isinstance(actions, argparse._SubParsersAction)
    for name, sub in actions.choices.items():
        for action in sub._actions:
            assert action.help, f"fuzz {name} {action.option_strings or action.dest}: no help"
        sub.format_help()  # every help string formats


def test_cli_run_records_the_seed_it_drew_and_how_to_replay_each_finding(tmp_path: Path) -> None:
    """Without --seed the campaign draws one and records it (report, summary, each finding),
    so that --seed repeats the run; each finding names the command that replays it, and its
    wall and CPU time beside the budget it was judged against."""
    out = tmp_path / "out"
    args = ["fuzz", "run", "--target", "placeholder-vulnerable", "--duration", "12"]
    main([*args, "--quiet", "--out", str(out), "--minimise-s", "3"])
    doc = json.loads((out / "report.json").read_text())
    assert isinstance(doc["seed"], int)
    summary = (out / "summary.md").read_text()
    assert f"`--seed {doc['seed']}`" in summary
    assert doc["findings"], "the vulnerable placeholder engine has findings within seconds"
    for f in doc["findings"]:
        assert f["seed"] == doc["seed"]
        assert f["replay_command"] == f"schedguard fuzz replay {f['path']}"
        assert f["replay_command"] in summary
        assert {"wall_s", "cpu_s"} <= set(f) and f["judged"]["budget"] is not None
    sarif = json.loads((out / "report.sarif").read_text())
    assert sarif["runs"][0]["invocations"][0]["properties"]["seed"] == doc["seed"]

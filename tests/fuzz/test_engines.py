"""The fuzz engines: registry, atheris runs (as subprocesses), the ClusterFuzzLite layout.

The atheris runs are a few seconds each: libFuzzer runs in a harness subprocess under
``RLIMIT_AS`` and the engine's wall clock; the vulnerable target only ever runs there (and in
the oracle's limited worker when an artifact is confirmed).
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fuzz.engines import (
    EngineRun,
    EngineUnavailable,
    RunOptions,
    available_engines,
    get_engine,
    register,
)
from fuzz.engines import _libfuzzer as lf
from fuzz.engines import atheris_engine as ae
from fuzz.engines import atheris_harness as harness
from fuzz.engines import clusterfuzzlite as cfl
from fuzz.oracle import Oracle
from fuzz.targets import REGISTRY, Budgets, Cost, get_target

needs_atheris = pytest.mark.skipif(not ae.atheris_available(), reason="atheris not installed")


# ------------------------------------------------------------------------------ registry


def test_registry_resolves_engines_lazily() -> None:
    assert get_engine("atheris") is ae.run_engine
    from fuzz.engines import hypothesis_engine

    assert get_engine("hypothesis") is hypothesis_engine.run_engine
    names = available_engines()
    assert {"atheris", "hypothesis"} <= set(names) or not ae.atheris_available()
    assert "hypothesis" in names


def test_unknown_engine_names_the_choices() -> None:
    with pytest.raises(KeyError, match="atheris"):
        get_engine("afl")


def test_register_adds_an_engine() -> None:
    def fake(*args: object, **kwargs: object) -> object:
        raise AssertionError("not called")

    register("fake-for-test", fake)  # type: ignore[arg-type]
    try:
        assert get_engine("fake-for-test") is fake
    finally:
        from fuzz.engines import _REGISTERED

        _REGISTERED.pop("fake-for-test", None)


def test_unavailable_engine_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from fuzz.engines import _REGISTERED

    monkeypatch.setattr(ae, "engine_available", lambda: False)
    monkeypatch.delitem(_REGISTERED, "atheris", raising=False)
    with pytest.raises(EngineUnavailable, match="pip install"):
        get_engine("atheris")


# ------------------------------------------------------------------- harness pieces (no libFuzzer)


def test_dictionary_round_trips_every_token() -> None:
    for target in REGISTRY.values():
        text = lf.dictionary_text(target)
        parsed = [_unescape(m) for m in re.findall(r'^kw\d+="(.*)"$', text, re.M)]
        assert parsed == target.dictionary(), target.name


def _unescape(s: str) -> bytes:
    out = bytearray()
    i = 0
    while i < len(s):
        if s[i] == "\\" and s[i + 1] == "x":
            out.append(int(s[i + 2 : i + 4], 16))
            i += 4
        elif s[i] == "\\":
            out.append(ord(s[i + 1]))
            i += 2
        else:
            out.append(ord(s[i]))
            i += 1
    return bytes(out)


def test_cost_buckets_grow_with_cost_and_ignore_noise() -> None:
    class FakeAtheris:
        n = 0
        hits: list[int] = []  # noqa: RUF012

        @classmethod
        def _reserve_counter(cls) -> int:
            cls.n += 1
            return cls.n

        @classmethod
        def _trace_branch(cls, idx: int) -> None:
            cls.hits.append(idx)

    fb = harness._CostFeedback(FakeAtheris)
    assert fb.bucket(1.0, 8.0) == 0  # below the floor: no signal
    buckets = [fb.bucket(8.0 * 1.5**k, 8.0) for k in range(10)]
    assert buckets == sorted(buckets) and len(set(buckets)) == 10
    fb.feed(Cost(time_s=1e-6), 100)
    assert FakeAtheris.hits == []  # a trivial input adds no feature
    fb.feed(Cost(steps=10_000, cpu_s=0.5), 10)
    assert len(FakeAtheris.hits) >= 2


def test_elite_keeps_the_costliest_inputs() -> None:
    elite = harness._Elite(size=3)
    for i in range(10):
        elite.offer(bytes([i]) * 10, Cost(steps=1000 * i))
    assert [d[0] for _, d in elite.by_cost] == [9, 8, 7]
    picked = {elite.pick(random.Random(s)) for s in range(50)}
    assert picked <= {bytes([i]) * 10 for i in range(10)}


def test_seed_corpus_dir_holds_the_seeds(tmp_path: Path) -> None:
    target = get_target("placeholder-hardened")
    d = lf.seed_corpus_dir(target, root=tmp_path)
    assert sorted(p.read_bytes() for p in d.iterdir()) == sorted(target.seeds())


# ----------------------------------------------------------------------------- atheris runs


@needs_atheris
def test_short_atheris_run_on_hardened_target_finds_nothing(tmp_path: Path) -> None:
    name = "placeholder-hardened"
    run = EngineRun(
        get_target(name),
        lambda: Oracle(name, isolate=False),
        # A count, not seconds: the harness takes seconds to start on a busy machine.
        RunOptions(duration_s=300, out_dir=tmp_path, seed=3, max_execs=300),
    )
    result = ae.run_engine(run)
    # Confirmed findings only: instrumented code runs slower, so a time-dominated cost per byte
    # near the budget may make the harness save an input the oracle then clears.
    assert result.findings == [], [f.to_dict() for f in result.findings]
    assert not result.extra["errors"]
    assert result.execs > 50
    assert result.coverage is not None and result.coverage > 0
    assert result.best_cost_over_time  # the harness reported costs


@needs_atheris
def test_short_atheris_run_on_vulnerable_target_yields_crash_file(tmp_path: Path) -> None:
    # An easy budget: 300 expansion steps, crossed by any template that expands a little.
    easy = Budgets(wall_s=1.0, mem_bytes=64 << 20, steps=300)
    run = lf.run_atheris(
        "placeholder-vulnerable",
        mode="cost",
        duration_s=20,
        out_dir=tmp_path,
        seed=1,
        stop_on_first=True,
        budgets=easy,
    )
    assert run.artifacts, f"no artifact; log: {run.log_path and run.log_path.read_text()[-2000:]}"
    crash = run.artifacts[0]
    # On a loaded machine libFuzzer's own per-input clock or RSS check can go before the cost
    # budget: the artifact is then a timeout- or oom-, with no CostFinding line; the replay
    # below judges it alike.
    assert crash.name.startswith(("crash-", "timeout-", "oom-"))
    log = run.log_path.read_text(errors="replace") if run.log_path else ""
    if crash.name.startswith("crash-"):
        # The oracle names the first budget crossed in its order, wall_s before steps: an input
        # that expands far past 300 steps can also outlast the 1 s wall on a loaded machine.
        assert "CostFinding: budget" in log
        assert "budget:steps" in log or "budget:wall_s" in log
    # The saved input really crosses that budget (replayed in the oracle's limited worker).
    with Oracle("placeholder-vulnerable", budgets=easy) as oracle:
        outcome = oracle.run(crash.read_bytes())
    assert outcome.is_finding and outcome.cost.steps > 300


@needs_atheris
def test_atheris_drives_the_hypothesis_property(tmp_path: Path) -> None:
    name = "chat-template-hardened"
    # A count of runs, not seconds: the harness alone takes seconds to start on a busy machine.
    # The deadline is only an outer bound; the run ends when the one libFuzzer process does.
    ended: list[bool] = []
    run = lf.run_atheris(
        name,
        mode="hypothesis",
        duration_s=300,
        out_dir=tmp_path,
        seed=2,
        extra_flags=("-runs=60",),
        on_exit=lambda: ended.append(True),
        should_stop=lambda: bool(ended),
    )
    assert run.execs > 20
    with Oracle(name, isolate=False) as oracle:  # none confirmed (see the test above)
        assert not [p for p in run.artifacts if oracle.run(p.read_bytes()).is_finding]


# ------------------------------------------------------------------------- ClusterFuzzLite


def test_clusterfuzzlite_layout_matches_the_registry() -> None:
    problems = cfl.check_layout()
    assert problems == [], "run: python -m fuzz.engines.clusterfuzzlite\n" + "\n".join(problems)
    build = (cfl.CFL_DIR / "build.sh").read_text()
    for name in REGISTRY:
        assert re.search(rf"^\s*build_fuzzer {name} {cfl.fuzzer_name(name)}$", build, re.M)
        harness = cfl.CFL_DIR / "fuzzers" / f"{cfl.fuzzer_name(name)}.py"
        source = harness.read_text()
        compile(source, str(harness), "exec")
        assert f'harness_main("{name}"' in source
    assert "language: python" in (cfl.CFL_DIR / "project.yaml").read_text()
    docker = (cfl.CFL_DIR / "Dockerfile").read_text()
    assert "FROM gcr.io/oss-fuzz-base/base-builder-python" in docker


def test_clusterfuzzlite_check_reports_a_missing_target(tmp_path: Path) -> None:
    targets = list(REGISTRY.values())
    cfl.write_layout(tmp_path, targets[:-1])
    for fixed in ("project.yaml", "Dockerfile"):
        (tmp_path / ".clusterfuzzlite" / fixed).write_text("x")
    problems = cfl.check_layout(tmp_path, targets)
    missing = cfl.fuzzer_name(targets[-1].name)
    assert any(missing in p for p in problems) and any("build.sh" in p for p in problems)


def test_ci_workflow_runs_campaigns_and_uploads_sarif() -> None:
    import yaml

    doc = yaml.safe_load((lf.PROJECT_ROOT / "docs" / "fuzz-ci-workflow.yml").read_text())
    steps = [s for job in doc["jobs"].values() for s in job["steps"]]
    runs = " ".join(str(s.get("run", "")) for s in steps)
    uses = [str(s.get("uses", "")) for s in steps]
    assert "schedguard fuzz run" in runs
    assert any(u.startswith("github/codeql-action/upload-sarif") for u in uses)
    assert any(u.startswith("google/clusterfuzzlite/actions/run_fuzzers") for u in uses)
    gated = {n for n, t in REGISTRY.items() if t.kind != "vulnerable"}
    assert set(doc["jobs"]["campaign"]["strategy"]["matrix"]["target"]) == gated


# -------------------------------------------------------------------------- package surface


def test_public_api_resolves_without_loading_the_targets() -> None:
    import fuzz
    import payloads

    # The atheris harness imports these before it instruments the targets (and the guard they
    # run): importing them must not import those yet.
    code = (
        "import sys, fuzz, fuzz.engines, fuzz.engines.atheris_harness\n"
        "early = [m for m in sys.modules if m.split('.')[0] in ('guard', 'scheduler_ref', "
        "'jinja2') or m.startswith('fuzz.targets')]\n"
        "sys.exit(f'imported before instrumenting: {early}' if early else 0)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=lf.PROJECT_ROOT, check=True)
    assert all(getattr(fuzz, name) is not None for name in fuzz.__all__)
    assert all(getattr(payloads, name) is not None for name in payloads.__all__)

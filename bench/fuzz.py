"""Fuzz engines side by side: executions per second, and time to first finding.

(a) **execs/s per target**: every available engine runs each registered target for
``--exec-seconds`` on one core (``jobs=1``). atheris's rate excludes its harness start-up
(imports under instrumentation, warm-up), which is reported beside it.

(b) **time to first finding on the vulnerable targets**: from a trivial seed corpus, each
cost-guided engine (atheris with the cost fed back as coverage, ``search``, ``hypothesis``) and,
in the same run, plain atheris with coverage feedback only (no cost signal, no custom mutator,
no dictionary: what ``atheris.Fuzz()`` does out of the box) run ``--seeds`` times (seeds 1..N),
each bounded by ``--bound`` seconds. A run counts from the engine's start (its start-up
included) to the first input the oracle confirms as a finding. Median over the seeds; a run
that found nothing counts as the bound, so a ratio against a baseline that timed out is a lower
bound (printed with ``>=``).

Targets (issue 4): median <= 20 s and >= 3x faster than coverage-only atheris on each
vulnerable target; ``guard-pipeline`` >= 2,000 execs/s on one core.

Everything hostile runs in limited child processes (the atheris harness under ``RLIMIT_AS``,
the oracle's worker); hardened and guard targets run in process, as campaigns run them.

    .venv/bin/python bench/fuzz.py [--quick | --smoke] [--seeds 5] [--bound 60]
        [--exec-seconds 10] [--targets a,b] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz import (  # noqa: E402
    REGISTRY,
    EngineResult,
    EngineRun,
    FuzzTarget,
    Oracle,
    RunOptions,
    available_engines,
    get_engine,
    get_target,
)

TTFF_MEDIAN_TARGET_S = 20.0
SPEEDUP_TARGET = 3.0
GUARD_EPS_TARGET = 2000.0
BASELINE = "atheris-coverage"


@dataclass(frozen=True)
class EngineSpec:
    label: str
    engine: str
    kwargs: dict[str, Any]
    cost_guided: bool


SPECS: tuple[EngineSpec, ...] = (
    EngineSpec("atheris", "atheris", {"mode": "cost"}, True),
    EngineSpec("search", "search", {}, True),
    EngineSpec("hypothesis", "hypothesis", {}, True),
    EngineSpec(BASELINE, "atheris", {"mode": "coverage", "dictionary": False}, False),
)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _oracle_factory(target: FuzzTarget) -> Callable[[], Oracle]:
    isolate = target.kind == "vulnerable" or target.isolate_by_default

    def make() -> Oracle:
        return Oracle(target.name, isolate=isolate)

    return make


def _run(
    spec: EngineSpec,
    target: FuzzTarget,
    *,
    duration_s: float,
    seed: int,
    stop_on_first: bool = False,
    minimise_s: float = 20.0,
) -> EngineResult:
    # The spec's keywords are its engine's own (atheris' mode and dictionary).
    fn: Callable[..., EngineResult] = get_engine(spec.engine)
    with tempfile.TemporaryDirectory(prefix="bench-fuzz-") as tmp:
        options = RunOptions(
            duration_s=duration_s,
            out_dir=Path(tmp),
            seed=seed,
            minimise_s=minimise_s,
            stop_on_first=stop_on_first,
        )
        return fn(EngineRun(target, _oracle_factory(target), options), **spec.kwargs)


def _specs(names: list[str] | None) -> list[EngineSpec]:
    available = set(available_engines())
    out = [s for s in SPECS if s.engine in available]
    if names is not None:
        out = [s for s in out if s.label in names]
    return out


# ------------------------------------------------------------------------------- execs/s


def bench_execs(
    targets: list[FuzzTarget], specs: list[EngineSpec], seconds: float
) -> list[dict[str, Any]]:
    rows = []
    for target in targets:
        for spec in specs:
            _log(f"execs/s: {target.name} / {spec.label} ({seconds:g} s)")
            started = time.monotonic()
            result = _run(spec, target, duration_s=seconds, seed=1, minimise_s=0.0)
            wall = time.monotonic() - started
            eps = result.extra.get("execs_per_s")
            if eps is None:
                eps = result.execs / result.duration_s if result.duration_s > 0 else 0.0
            rows.append(
                {
                    "target": target.name,
                    "kind": target.kind,
                    "engine": spec.label,
                    "execs": result.execs,
                    "seconds": round(wall, 2),
                    "execs_per_s": round(float(eps), 1),
                    "startup_s": result.extra.get("startup_s"),
                    "coverage": result.coverage,
                    "findings": len(result.findings),
                }
            )
    return rows


# -------------------------------------------------------------------- time to first finding


def bench_ttff(
    targets: list[FuzzTarget],
    specs: list[EngineSpec],
    seeds: int,
    bound: float,
    failed: list[str],
) -> list[dict[str, Any]]:
    """``failed`` collects runs whose engine reported an error (their time is not a result)."""
    rows = []
    for target in targets:
        for spec in specs:
            times: list[float | None] = []
            for seed in range(1, seeds + 1):
                started = time.monotonic()
                result = _run(
                    spec, target, duration_s=bound, seed=seed, stop_on_first=True, minimise_s=0.0
                )
                ttff = result.time_to_first_finding_s
                found = ttff is not None and ttff <= bound
                times.append(round(ttff, 3) if found and ttff is not None else None)
                errors = result.extra.get("errors") or []
                _log(
                    f"ttff: {target.name} / {spec.label} seed {seed}: "
                    f"{f'{ttff:.2f} s' if found and ttff is not None else f'none in {bound:g} s'}"
                    f" (run {time.monotonic() - started:.1f} s)"
                    + (f" errors: {errors}" if errors else "")
                )
                if errors:
                    failed.append(f"{target.name}/{spec.label}/{seed}: {errors[0]}"[:300])
            counted = [t if t is not None else bound for t in times]
            rows.append(
                {
                    "target": target.name,
                    "engine": spec.label,
                    "cost_guided": spec.cost_guided,
                    "seeds": seeds,
                    "bound_s": bound,
                    "runs_s": times,
                    "found": sum(t is not None for t in times),
                    "median_s": round(statistics.median(counted), 3),
                    # The median is a lower bound when at least half the runs found nothing.
                    "censored": sum(t is None for t in times) * 2 >= seeds,
                }
            )
    return rows


def ratios(ttff: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    by = {(r["target"], r["engine"]): r for r in ttff}
    for r in ttff:
        base = by.get((r["target"], BASELINE))
        if not r["cost_guided"] or base is None:
            continue
        speedup = base["median_s"] / r["median_s"] if r["median_s"] > 0 else math.inf
        out.append(
            {
                "target": r["target"],
                "engine": r["engine"],
                "median_s": r["median_s"],
                "baseline_median_s": base["median_s"],
                "speedup": round(speedup, 2),
                # A censored baseline (no finding within the bound) makes the ratio a lower bound.
                "speedup_is_lower_bound": bool(base["censored"]),
                "median_ok": r["median_s"] <= TTFF_MEDIAN_TARGET_S and not r["censored"],
                "speedup_ok": speedup >= SPEEDUP_TARGET,
            }
        )
    return out


def checks(execs: list[dict[str, Any]], rat: list[dict[str, Any]]) -> dict[str, Any]:
    guard = [r for r in execs if r["target"] == "guard-pipeline"]
    # The target is about engines that measure each input's cost, not the bare baseline.
    best = max(
        (r for r in guard if r["engine"] != BASELINE), key=lambda r: r["execs_per_s"], default=None
    )
    per_target: dict[str, Any] = {}
    for r in rat:
        t = per_target.setdefault(r["target"], {"engines_meeting_both": []})
        if r["median_ok"] and r["speedup_ok"]:
            t["engines_meeting_both"].append(r["engine"])
    return {
        "ttff_median_le_20s_and_3x": {
            t: {**v, "ok": bool(v["engines_meeting_both"])} for t, v in per_target.items()
        },
        "guard_pipeline_2000_execs_per_s": {
            "best_engine": best["engine"] if best else None,
            "execs_per_s": best["execs_per_s"] if best else None,
            "by_engine": {r["engine"]: r["execs_per_s"] for r in guard},
            "ok": bool(best and best["execs_per_s"] >= GUARD_EPS_TARGET),
        },
    }


# ----------------------------------------------------------------------------------- output


def _print_report(doc: dict[str, Any]) -> None:
    print("execs/s per target (one core)")
    print(f"  {'target':<26} {'engine':<18} {'execs/s':>9} {'execs':>8} {'start-up':>9}")
    for r in doc["execs_per_s"]:
        start = f"{r['startup_s']:.1f} s" if r["startup_s"] is not None else "-"
        print(
            f"  {r['target']:<26} {r['engine']:<18} {r['execs_per_s']:>9.0f} {r['execs']:>8}"
            f" {start:>9}"
        )
    print()
    print(f"time to first finding (median of {doc['config']['seeds']} seeds, bound "
          f"{doc['config']['bound_s']:g} s; '-' = none within the bound)")  # fmt: skip
    print(f"  {'target':<26} {'engine':<18} {'median':>9}  runs")
    for r in doc["ttff"]:
        runs = " ".join(f"{t:.1f}" if t is not None else "-" for t in r["runs_s"])
        median = f"{'>=' if r['censored'] else ''}{r['median_s']:.1f} s"
        print(f"  {r['target']:<26} {r['engine']:<18} {median:>9}  {runs}")
    print()
    print(f"speed-up over {BASELINE} (target: median <= {TTFF_MEDIAN_TARGET_S:g} s and "
          f">= {SPEEDUP_TARGET:g}x)")  # fmt: skip
    for r in doc["ratios"]:
        ge = ">=" if r["speedup_is_lower_bound"] else ""
        ok = "ok" if r["median_ok"] and r["speedup_ok"] else "MISSED"
        print(f"  {r['target']:<26} {r['engine']:<18} {ge}{r['speedup']:.1f}x  {ok}")
    for err in doc["engine_errors"]:
        print(f"  engine error (that run's time is not a result): {err}")
    g = doc["targets"]["guard_pipeline_2000_execs_per_s"]
    if g["execs_per_s"] is not None:
        ok = "ok" if g["ok"] else "MISSED"
        print(f"\nguard-pipeline: {g['execs_per_s']:.0f} execs/s ({g['best_engine']}), "
              f"target >= {GUARD_EPS_TARGET:.0f}: {ok}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--bound", type=float, default=60.0, help="seconds per time-to-finding run")
    p.add_argument("--exec-seconds", type=float, default=10.0, help="0: skip the execs/s part")
    p.add_argument("--targets", default=None, help="comma-separated (default: all)")
    p.add_argument("--engines", default=None, help="comma-separated labels (default: all)")
    p.add_argument("--quick", action="store_true", help="1 seed, 20 s bound, 3 s execs/s")
    p.add_argument("--smoke", action="store_true", help="seconds: does the bench still run")
    p.add_argument("--json", dest="json_path", default=None)
    ns = p.parse_args(argv)
    seeds, bound, exec_s = ns.seeds, ns.bound, ns.exec_seconds
    names = ns.targets.split(",") if ns.targets else sorted(REGISTRY)
    engines = ns.engines.split(",") if ns.engines else None
    exec_names = names
    if ns.quick:
        seeds, bound, exec_s = 1, 20.0, 3.0
    if ns.smoke:
        seeds, bound, exec_s = 1, 4.0, 1.5
        exec_names = ["guard-pipeline"]
        names = ["placeholder-vulnerable"]
        engines = engines or ["atheris", "search", BASELINE]
    specs = _specs(engines)
    ttff_specs = [s for s in specs if s.engine == "atheris"] if ns.smoke else specs
    exec_targets = [get_target(n) for n in exec_names]
    vulnerable = [get_target(n) for n in names if get_target(n).kind == "vulnerable"]
    started = time.monotonic()
    # The smoke run measures execs/s with the engine that starts fastest only.
    exec_specs = [s for s in specs if s.label == "search"] or specs[:1] if ns.smoke else specs
    execs = bench_execs(exec_targets, exec_specs, exec_s) if exec_s > 0 else []
    failed: list[str] = []
    ttff = bench_ttff(vulnerable, ttff_specs, seeds, bound, failed)
    rat = ratios(ttff)
    doc: dict[str, Any] = {
        "config": {
            "seeds": seeds,
            "bound_s": bound,
            "exec_seconds": exec_s,
            "engines": [s.label for s in specs],
            "baseline": BASELINE,
            "wall_s": None,
        },
        "execs_per_s": execs,
        "ttff": ttff,
        "ratios": rat,
        "targets": checks(execs, rat),
        "engine_errors": failed,
    }
    doc["config"]["wall_s"] = round(time.monotonic() - started, 1)
    _print_report(doc)
    if ns.json_path:
        Path(ns.json_path).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The cost-guided search: its queue, and campaigns that climb to a finding."""

from __future__ import annotations

import random
from pathlib import Path

from fuzz import Cost, EngineRun, FindingSet, Oracle, Progress, RunOptions, get_target
from fuzz.engines.search_engine import CostQueue, Entry, run_engine


def test_queue_keeps_the_costliest_and_the_densest() -> None:
    q = CostQueue(capacity=3)
    for i in range(10):
        q.offer(Entry.of(b"x" * (100 * (i + 1)), Cost(steps=1000 * i)))
    assert [e.cost.steps for e in q.by_raw] == [9000, 8000, 7000]
    small_dense = Entry.of(b"ab", Cost(steps=5000))
    assert q.offer(small_dense)
    assert q.by_per_byte[0] is small_dense
    assert not q.offer(Entry.of(b"ab", Cost(steps=5000)))  # the same input twice
    # The component maxima are kept even when the total is low.
    mem = Entry.of(b"m" * 500, Cost(peak_mem_bytes=1 << 20))
    assert q.offer(mem) and q.maxima[1] is mem
    rng = random.Random(0)
    picks = {q.pick(rng).data for _ in range(200)}
    assert b"x" * 1000 in picks and b"ab" in picks
    q.drop(small_dense)
    assert small_dense not in q.by_per_byte


def test_search_climbs_to_a_minimised_budget_finding() -> None:
    target = get_target("tests._fuzz_targets:Squares")
    seen: list[Progress] = []
    result = run_engine(
        EngineRun(
            target,
            lambda: Oracle(target.name, isolate=False),
            # Ends at the first finding; the duration is only an outer bound.
            RunOptions(duration_s=120.0, seed=3, minimise_s=2.0, stop_on_first=True),
            on_progress=seen.append,
        )
    )
    assert result.execs > 100 and result.time_to_first_finding_s is not None
    [finding] = result.findings
    assert finding.cause == "budget:steps" and finding.data == b"a" * 101
    assert result.best_cost_over_time[-1][1] >= 10.0
    assert seen and seen[-1].findings == 1


def test_search_finds_the_vulnerable_placeholder_engine(tmp_path: Path) -> None:
    """From the trivial seeds, the vulnerable {{name}} engine crosses its time or memory
    budget within seconds (the 60 s proof campaign is bench/fuzz_proof.py)."""
    target = get_target("placeholder-vulnerable")
    findings = FindingSet()
    result = run_engine(
        EngineRun(
            target,
            lambda: Oracle(target.name, isolate=True),
            RunOptions(duration_s=12.0, seed=2, save_root=tmp_path, minimise_s=3.0),
            findings=findings,
        )
    )
    assert result.findings, f"no finding in {result.execs} execs"
    f = result.findings[0]
    assert f.cause in ("time", "memory") and f.size_bytes <= 512
    assert f.path is not None and Path(f.path).is_file()


def test_search_finds_nothing_on_the_hardened_engine() -> None:
    target = get_target("placeholder-hardened")
    result = run_engine(
        EngineRun(
            target,
            lambda: Oracle(target.name, isolate=True),
            # A count, not seconds (the worker alone may take seconds to start on a busy
            # machine); the duration is only an outer bound.
            RunOptions(duration_s=300.0, seed=1, max_execs=1500),
        )
    )
    assert result.execs >= 1500
    assert not result.findings, [f.to_dict() for f in result.findings]


def test_search_runs_every_seed_when_the_first_batch_is_cut() -> None:
    """The seeds' batch stops at its time limit; the seeds it did not reach run next."""
    target = get_target("tests._fuzz_targets:SlowSeeds")
    result = run_engine(
        EngineRun(
            target,
            lambda: Oracle(target.name, isolate=False),
            RunOptions(duration_s=20.0, seed=1, minimise_s=1.0, stop_on_first=True),
        )
    )
    [finding] = result.findings
    assert finding.cause.startswith("crash:KeyError") and finding.data == b"crash"

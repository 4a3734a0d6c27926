"""The cost-guided search engine ("search"): PerfFuzz / SlowFuzz-style hill climbing on cost.

Coverage-guided fuzzers keep an input when it reaches a new edge, so they stop climbing once
the expensive path is covered. This engine keeps the inputs that cost the most instead:

- a :class:`CostQueue` holds the top inputs by absolute cost (``Cost.scalar()``, within the
  target's ``max_size``), the top inputs by cost per byte, and the input that maximises each
  cost component (time, memory, steps, output tokens), as PerfFuzz keeps one input per
  maximised counter;
- each round mutates parents picked from the queue (rank-biased, so the costliest are mutated
  most), with the target's structure-aware mutators stacked 1-4 deep and occasional splicing,
  runs the children as one batch through the oracle, and offers the survivors back;
- a child that is a finding is recorded (:func:`fuzz.findings.record`: dedup by cause, ddmin,
  save) and the search goes on looking for other causes.

Jobs run in threads, each with its own oracle (worker process) and queue, sharing findings.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fuzz.findings import EngineResult, FindingSet, Progress, record
from fuzz.targets._base import Cost, Target

if TYPE_CHECKING:
    from fuzz.oracle import Oracle, Outcome

__all__ = ["CostQueue", "Entry", "run_search"]

_PROGRESS_EVERY_S = 0.5
_BATCH_TARGET_S = 0.2


@dataclass
class Entry:
    data: bytes
    cost: Cost
    raw: float
    per_byte: float

    @classmethod
    def of(cls, data: bytes, cost: Cost) -> Entry:
        return cls(data, cost, cost.scalar(), cost.per_byte(len(data)))


def _components(cost: Cost) -> tuple[float, float, float, float]:
    return (cost.busy_s, float(cost.peak_mem_bytes), float(cost.steps), float(cost.output_tokens))


class CostQueue:
    """The inputs worth mutating: top-``capacity`` by cost and by cost per byte, plus the
    maximiser of each cost component."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self.by_raw: list[Entry] = []
        self.by_per_byte: list[Entry] = []
        self.maxima: list[Entry | None] = [None, None, None, None]
        self._seen: set[bytes] = set()

    def __len__(self) -> int:
        return len(self._seen)

    @property
    def best(self) -> Entry | None:
        return self.by_raw[0] if self.by_raw else None

    def offer(self, entry: Entry) -> bool:
        """Keep ``entry`` if it beats the worst kept by either score or a component maximum."""
        key = hashlib.blake2b(entry.data, digest_size=16).digest()
        if key in self._seen:
            return False
        kept = False
        kept |= _insert(self.by_raw, entry, entry.raw, self.capacity, lambda e: e.raw)
        kept |= _insert(
            self.by_per_byte, entry, entry.per_byte, self.capacity, lambda e: e.per_byte
        )
        comps = _components(entry.cost)
        for i, value in enumerate(comps):
            cur = self.maxima[i]
            if value > 0 and (
                cur is None
                or value > _components(cur.cost)[i]
                or (value == _components(cur.cost)[i] and len(entry.data) < len(cur.data))
            ):
                self.maxima[i] = entry
                kept = True
        if kept:
            self._seen.add(key)
        return kept

    def pick(self, rng: random.Random) -> Entry:
        r = rng.random()
        if r < 0.45 and self.by_raw:
            pool = self.by_raw
        elif r < 0.9 and self.by_per_byte:
            pool = self.by_per_byte
        else:
            pool = [e for e in self.maxima if e is not None] or self.by_raw or self.by_per_byte
        # Rank-biased: the i-th best is picked with probability ~ 0.7^i.
        i = min(len(pool) - 1, int(math.log(1 - rng.random()) / math.log(0.7)))
        return pool[i]

    def drop(self, entry: Entry) -> None:
        """Stop mutating ``entry`` (its children keep hitting a cause already found)."""
        self.by_raw = [e for e in self.by_raw if e is not entry]
        self.by_per_byte = [e for e in self.by_per_byte if e is not entry]
        self.maxima = [None if e is entry else e for e in self.maxima]

    def any(self, rng: random.Random) -> Entry:
        pool = self.by_raw + self.by_per_byte
        return rng.choice(pool)


def _insert(
    lst: list[Entry], entry: Entry, score: float, cap: int, key: Callable[[Entry], float]
) -> bool:
    if len(lst) >= cap and score <= key(lst[-1]):
        return False
    lo, hi = 0, len(lst)
    while lo < hi:  # descending order
        mid = (lo + hi) // 2
        if key(lst[mid]) >= score:
            lo = mid + 1
        else:
            hi = mid
    lst.insert(lo, entry)
    del lst[cap:]
    return True


class _Shared:
    """State the job threads share: counters, best cost over time, findings."""

    def __init__(self, findings: FindingSet, start: float) -> None:
        self.lock = threading.Lock()
        self.findings = findings
        self.start = start
        self.execs = 0
        self.best = 0.0
        self.best_over_time: list[tuple[float, float]] = [(0.0, 0.0)]
        self.first_finding_s: float | None = None
        self.features: set[tuple[Any, ...]] = set()
        self.errors: list[str] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.start


def _feature(out: Outcome) -> tuple[Any, ...]:
    c = out.cost
    return (
        out.verdict,
        out.error_code,
        int(math.log2(c.steps + 1)),
        int(math.log2(c.output_tokens + 1)),
    )


def _mutate(
    target: Target, queue: CostQueue, rng: random.Random, max_size: int
) -> tuple[bytes, Entry]:
    parent = queue.pick(rng)
    child = parent.data
    for _ in range(rng.choice((1, 1, 2, 3, 4))):
        child = target.mutate(child, max_size, rng)
    if rng.random() < 0.05 and child:  # splice with another kept input
        other = queue.any(rng).data
        if other:
            child = child[: rng.randrange(len(child) + 1)] + other[rng.randrange(len(other)) :]
            child = child[:max_size]
    return child, parent


def _job(
    target: Target,
    oracle: Oracle,
    shared: _Shared,
    rng: random.Random,
    deadline: float,
    engine: str,
    seed: int | None,
    record_kwargs: dict[str, Any],
    stop: threading.Event,
    stop_on_first: bool,
) -> None:
    max_size = int(getattr(target, "max_size", 4096))
    queue = CostQueue()
    batch_size = 8
    pending = list(target.seeds())
    while time.monotonic() < deadline and not stop.is_set():
        parents: list[Entry | None]
        if pending:
            batch, pending = pending, []
            parents = [None] * len(batch)
        else:
            if queue.best is None:  # nothing kept yet (or all dropped): restart from a seed
                queue.offer(Entry.of(rng.choice(target.seeds()) or b"x", Cost()))
            pairs = [_mutate(target, queue, rng, max_size) for _ in range(batch_size)]
            batch = [c for c, _ in pairs]
            parents = [p for _, p in pairs]
        t0 = time.monotonic()
        limit = max(0.05, min(2 * _BATCH_TARGET_S, deadline - t0))
        outcomes = oracle.run_batch(batch, time_limit_s=limit)
        dt = time.monotonic() - t0
        # Aim for ~0.2 s per batch so the deadline and progress stay responsive.
        per = dt / max(1, len(outcomes))
        batch_size = max(1, min(256, int(_BATCH_TARGET_S / max(per, 1e-6))))
        for data, out, parent in zip(batch, outcomes, parents, strict=False):
            feature = _feature(out)
            with shared.lock:
                shared.execs += 1
                shared.features.add(feature)
                scalar = out.cost.scalar()
                if scalar > shared.best:
                    shared.best = scalar
                    shared.best_over_time.append((shared.elapsed(), scalar))
            if out.is_finding:
                with shared.lock:
                    if shared.first_finding_s is None:
                        shared.first_finding_s = shared.elapsed()
                new = record(
                    target,
                    data,
                    out,
                    engine,
                    oracle=oracle,
                    seen=shared.findings,
                    found_after_s=shared.elapsed(),
                    seed=seed,
                    **record_kwargs,
                )
                if new is None and parent is not None:
                    # A cause already found: climbing further from here finds it again.
                    queue.drop(parent)
                if stop_on_first and len(shared.findings):
                    stop.set()
                    return
                continue
            queue.offer(Entry.of(data, out.cost))


def run_search(
    target: Target,
    oracle_factory: Callable[[], Oracle],
    *,
    duration_s: float,
    jobs: int = 1,
    out_dir: Path | None = None,
    seed: int | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    findings: FindingSet | None = None,
    save_root: Path | None = None,
    save: bool = True,
    minimise_s: float = 20.0,
    engine_name: str = "search",
    stop_on_first: bool = False,
    **_: Any,
) -> EngineResult:
    """Run the cost-guided search on ``target`` for ``duration_s`` seconds with ``jobs``
    threads (each its own oracle and worker process); ``stop_on_first`` ends it at the first
    finding (benchmarks of the time to first finding)."""
    start = time.monotonic()
    deadline = start + duration_s
    shared = _Shared(findings if findings is not None else FindingSet(), start)
    base_seed = random.randrange(1 << 30) if seed is None else seed
    record_kwargs: dict[str, Any] = {
        "save_root": save_root,
        "save": save,
        "minimise_s": minimise_s,
    }
    oracles: list[Oracle] = []
    threads: list[threading.Thread] = []
    stop = threading.Event()

    def run(i: int) -> None:
        oracle = oracle_factory()
        oracles.append(oracle)
        try:
            _job(
                target,
                oracle,
                shared,
                random.Random(base_seed * 1000 + i),
                deadline,
                engine_name,
                seed,
                record_kwargs,
                stop,
                stop_on_first,
            )
        except Exception as exc:  # report, do not hang the campaign
            with shared.lock:
                shared.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            oracle.close()

    if jobs <= 1:
        # In the calling thread: the in-process oracle's CPU timer needs the main thread.
        _run_with_progress(lambda: run(0), shared, on_progress, engine_name)
    else:
        for i in range(jobs):
            t = threading.Thread(target=run, args=(i,), daemon=True, name=f"search-{i}")
            threads.append(t)
            t.start()
        while any(t.is_alive() for t in threads):
            _report(shared, on_progress, engine_name)
            for t in threads:
                t.join(timeout=_PROGRESS_EVERY_S / max(1, len(threads)))
    _report(shared, on_progress, engine_name)
    with shared.lock:
        mine = [f for f in shared.findings.findings if f.engine == engine_name]
        best_over_time = [*shared.best_over_time, (shared.elapsed(), shared.best)]
    return EngineResult(
        execs=shared.execs,
        findings=mine,
        best_cost_over_time=best_over_time,
        coverage=len(shared.features),
        time_to_first_finding_s=shared.first_finding_s,
        engine=engine_name,
        duration_s=shared.elapsed(),
        extra={"errors": shared.errors, "coverage_kind": "cost features"},
    )


def _run_with_progress(
    fn: Callable[[], None],
    shared: _Shared,
    on_progress: Callable[[Progress], None] | None,
    engine: str,
) -> None:
    """Run ``fn`` here while a reporter thread prints progress."""
    stop = threading.Event()

    def reporter() -> None:
        while not stop.wait(_PROGRESS_EVERY_S):
            _report(shared, on_progress, engine)

    t = threading.Thread(target=reporter, daemon=True, name="search-progress")
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()


def _report(shared: _Shared, on_progress: Callable[[Progress], None] | None, engine: str) -> None:
    if on_progress is None:
        return
    with shared.lock:
        elapsed = shared.elapsed()
        p = Progress(
            elapsed_s=elapsed,
            execs=shared.execs,
            execs_per_s=shared.execs / elapsed if elapsed > 0 else 0.0,
            coverage=len(shared.features),
            best_cost=shared.best,
            findings=len(shared.findings),
            engine=engine,
        )
    on_progress(p)

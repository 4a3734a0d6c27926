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
- a child that is a finding is recorded (:meth:`EngineRun.record`: dedup by cause, ddmin,
  save) and the search goes on looking for other causes.

Jobs run in threads, each with its own oracle (worker process) and queue, sharing the run.
"""

from __future__ import annotations

import hashlib
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fuzz.targets import Cost, FuzzTarget

if TYPE_CHECKING:
    from fuzz.engines._run import EngineResult, EngineRun
    from fuzz.oracle import Oracle, Outcome

__all__ = ["NAME", "CostQueue", "Entry", "run_engine"]

NAME = "search"

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


def _feature(out: Outcome) -> tuple[Any, ...]:
    c = out.cost
    return (
        out.verdict,
        out.error_code,
        int(math.log2(c.steps + 1)),
        int(math.log2(c.output_tokens + 1)),
    )


def _mutate(
    target: FuzzTarget, queue: CostQueue, rng: random.Random, max_size: int
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


class _Job:
    """One search thread: its own oracle, queue and random stream; the run is shared."""

    def __init__(
        self, run: EngineRun, oracle: Oracle, rng: random.Random, features: set[Any]
    ) -> None:
        self.run = run
        self.oracle = oracle
        self.rng = rng
        self.features = features  # shared by the jobs (under run.lock): the run's coverage
        self.queue = CostQueue()
        self.max_size = int(getattr(run.target, "max_size", 4096))

    def search(self, stop: threading.Event) -> None:
        batch_size = 8
        pending = list(self.run.target.seeds())
        while not self.run.over() and not stop.is_set():
            parents: list[Entry | None]
            seeding = bool(pending)
            if seeding:
                batch, pending = pending, []
                parents = [None] * len(batch)
            else:
                batch, parents = self._children(batch_size)
            t0 = time.monotonic()
            limit = max(0.05, min(2 * _BATCH_TARGET_S, self.run.deadline - t0))
            outcomes = self.oracle.run_batch(batch, time_limit_s=limit)
            if seeding:  # a batch cut at its time limit: the seeds it did not reach run next
                pending = batch[len(outcomes) :]
            # Aim for ~0.2 s per batch so the deadline and progress stay responsive.
            per = (time.monotonic() - t0) / max(1, len(outcomes))
            batch_size = max(1, min(256, int(_BATCH_TARGET_S / max(per, 1e-6))))
            for data, out, parent in zip(batch, outcomes, parents, strict=False):
                if self._offer(data, out, parent, stop):
                    return

    def _children(self, n: int) -> tuple[list[bytes], list[Entry | None]]:
        target, queue, rng = self.run.target, self.queue, self.rng
        if queue.best is None:  # nothing kept yet (or all dropped): restart from a seed
            queue.offer(Entry.of(rng.choice(target.seeds()) or b"x", Cost()))
        pairs = [_mutate(target, queue, rng, self.max_size) for _ in range(n)]
        return [c for c, _ in pairs], [p for _, p in pairs]

    def _offer(
        self, data: bytes, out: Outcome, parent: Entry | None, stop: threading.Event
    ) -> bool:
        """Count one outcome and keep or record it; True when the search should end."""
        run = self.run
        run.executed(out)
        with run.lock:
            self.features.add(_feature(out))
            run.coverage = len(self.features)
        if not out.is_finding:
            self.queue.offer(Entry.of(data, out.cost))
            return False
        new = run.record(data, out, self.oracle)
        if new is None and parent is not None:
            # A cause already found: climbing further from here finds it again.
            self.queue.drop(parent)
        if run.options.stop_on_first and len(run.findings):
            stop.set()
            return True
        return False


def run_engine(run: EngineRun) -> EngineResult:
    """Run the cost-guided search on ``run.target`` for the run's duration with ``jobs``
    threads (each its own oracle and worker process); ``stop_on_first`` ends it at the first
    finding (benchmarks of the time to first finding)."""
    run.engine = run.engine or NAME
    seed = run.options.seed
    base_seed = random.randrange(1 << 30) if seed is None else seed
    features: set[Any] = set()
    stop = threading.Event()

    def job(i: int) -> None:
        oracle = run.oracle_factory()
        try:
            _Job(run, oracle, random.Random(base_seed * 1000 + i), features).search(stop)
        except Exception as exc:  # report, do not hang the campaign
            run.error(exc)
        finally:
            oracle.close()

    jobs = run.options.jobs
    if jobs <= 1:
        # In the calling thread: the in-process oracle's CPU timer needs the main thread.
        _run_with_progress(lambda: job(0), run)
    else:
        threads = [
            threading.Thread(target=job, args=(i,), daemon=True, name=f"search-{i}")
            for i in range(jobs)
        ]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            run.report()
            for t in threads:
                t.join(timeout=_PROGRESS_EVERY_S / len(threads))
    run.report()
    return run.result(coverage_kind="cost features")


def _run_with_progress(fn: Callable[[], None], run: EngineRun) -> None:
    """Run ``fn`` here while a reporter thread sends progress events."""
    stop = threading.Event()

    def reporter() -> None:
        while not stop.wait(_PROGRESS_EVERY_S):
            run.report()

    t = threading.Thread(target=reporter, daemon=True, name="search-progress")
    t.start()
    try:
        fn()
    finally:
        stop.set()
        t.join()

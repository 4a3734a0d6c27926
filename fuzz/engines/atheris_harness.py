"""The atheris harness: the libFuzzer process's side of the atheris engine.

libFuzzer runs in-process and ends with ``sys.exit``, so the engine runs it as a subprocess::

    python -m fuzz.engines.atheris_harness --target NAME --mode cost -- <libFuzzer flags> <dirs>

:func:`harness_main` (also what ``.clusterfuzzlite/`` builds) imports the target's packages
under ``atheris.instrument_imports`` and warms the target up there, so lazily imported modules
are instrumented too. That is why this module imports nothing of the targets, the guard or the
oracle at import time. Three modes:

``cost`` (the engine)
    Each input is measured as the oracle measures it (:func:`fuzz._worker.execute_one`: CPU
    time, peak RSS growth, the target's step and token counters) and classified against the
    budgets (:func:`fuzz.oracle.classify`). There is no CPU timer in the harness: an input runs
    to its end (a time budget crossed is a finding then) or to libFuzzer's ``-timeout``. A finding is raised as
    :class:`~fuzz.CostFinding`, so libFuzzer saves a ``crash-*`` file. The measured cost is
    also *fed back as coverage*: each cost family (steps, tokens, CPU time, memory, cost per
    byte) owns a row of extra counters, one per x1.5 bucket, and an input that reaches a bucket
    not seen before is "new coverage" that libFuzzer keeps and mutates further. That turns
    libFuzzer's keep-what-is-new loop into a hill climb on cost (PerfFuzz's idea, within
    libFuzzer's feature model). libFuzzer schedules its corpus by feature rarity, not cost, so
    the harness also keeps the costliest inputs seen (:class:`_Elite`) and the custom mutator
    spends a third of its mutations on them. Mutation is structure-aware: the target's own
    ``mutate`` (nest, repeat, grow numbers, JSON edits) with libFuzzer's ``Mutate`` (and the
    dictionary) as the fallback.
``coverage`` (the baseline)
    Plain atheris: no cost measurement, no custom mutator; only exceptions, libFuzzer's
    ``-timeout`` and ``-rss_limit_mb`` (set from the same budgets) find anything.
``hypothesis``
    atheris drives the target's Hypothesis property through ``fuzz_one_input``: libFuzzer's
    bytes become the property's choice sequence, so inputs come from the grammar strategies.

The harness tells the engine what it sees through an events file (:class:`EventLog`, one
``epoch kind value`` line each: ``best`` for a new best cost, ``finding`` for a finding), which
works across libFuzzer's fork-mode children. Its backstops: ``RLIMIT_AS`` (baseline +
``max(2 * mem budget, 256 MiB)``, as the oracle's worker), ``-rss_limit_mb`` and ``-timeout``
from the budgets.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NoReturn

if TYPE_CHECKING:
    from fuzz.oracle import Outcome
    from fuzz.targets import Budgets, Cost, FuzzTarget

__all__ = [
    "EVENTS_ENV",
    "INSTRUMENTED_PACKAGES",
    "MODES",
    "AtherisMode",
    "EventLog",
    "harness_main",
]

AtherisMode = Literal["cost", "coverage", "hypothesis"]
MODES: tuple[AtherisMode, ...] = ("cost", "coverage", "hypothesis")
# Packages whose code the targets run: instrumented for coverage. Not the web framework (the
# guard-app target's coverage that matters is the guard's), which would halve its execs/s.
INSTRUMENTED_PACKAGES: tuple[str, ...] = (
    "guard",
    "scheduler_ref",
    "jinja2",
    "markupsafe",
    "fuzz.targets",
)
# The events file the engine reads (a path in the environment, so fork-mode children share it).
EVENTS_ENV = "SCHEDGUARD_ATHERIS_EVENTS"
_MIB = 1 << 20


class _CostFeedback:
    """Extra libFuzzer counters, one row per cost family and one counter per x1.5 bucket."""

    BUCKETS = 48
    RATIO = math.log(1.5)
    # (family, smallest value worth a bucket): below it everything is bucket 0 (no signal),
    # so timer noise on trivial inputs does not look like progress.
    FLOORS: tuple[tuple[str, float], ...] = (
        ("steps", 8.0),
        ("tokens", 8.0),
        ("cpu_s", 2e-4),
        ("mem", float(_MIB)),
        ("per_byte", 0.01),
    )

    def __init__(self, atheris: Any) -> None:
        self._trace: Callable[[int], None] = atheris._trace_branch
        self._rows = [
            [atheris._reserve_counter() for _ in range(self.BUCKETS)] for _ in self.FLOORS
        ]

    def bucket(self, value: float, floor: float) -> int:
        if value < floor:
            return 0
        # The epsilon keeps exact powers of the ratio in their own bucket despite rounding.
        return min(self.BUCKETS - 1, 1 + int(math.log(value / floor) / self.RATIO + 1e-9))

    def feed(self, cost: Cost, size: int) -> None:
        values = (
            float(cost.steps),
            float(cost.output_tokens),
            cost.cpu_s or cost.time_s,
            float(cost.peak_mem_bytes),
            cost.per_byte(size),
        )
        for row, (_, floor), value in zip(self._rows, self.FLOORS, values, strict=True):
            b = self.bucket(value, floor)
            if b:
                self._trace(row[b])


class EventLog:
    """Appends ``epoch kind value`` lines for the engine (works across fork-mode children)."""

    def __init__(self, path: str | None) -> None:
        self._fd = -1
        if path:
            with contextlib.suppress(OSError):
                self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.best = 0.0

    def cost(self, scalar: float) -> None:
        if scalar > self.best * 1.05 and scalar > 0:
            self.best = scalar
            self._write(f"{time.time():.3f} best {scalar:.6f}\n")

    def finding(self, outcome: Outcome) -> None:
        self._write(f"{time.time():.3f} finding {outcome.cause}\n")

    def outcome(self, data: bytes, outcome: Outcome) -> None:
        """Every measured input: its cost, and the finding when it is one."""
        self.cost(outcome.cost.scalar())
        if outcome.is_finding:
            self.finding(outcome)

    def _write(self, line: str) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.write(self._fd, line.encode())


def _flag(argv: Sequence[str], name: str) -> str | None:
    prefix = f"-{name}="
    for arg in argv:
        if arg.startswith(prefix):
            return arg[len(prefix) :]
    return None


def _statm_pages(field: int) -> int | None:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[field]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _rss_bytes() -> int:
    rss = _statm_pages(1)
    return rss if rss is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _headroom(budgets: Budgets) -> int:
    return max(2 * budgets.mem_bytes, 256 * _MIB)


def _with_defaults(
    argv: list[str], target: FuzzTarget, budgets: Budgets, mode: AtherisMode
) -> list[str]:
    """Add the budget-derived libFuzzer flags the caller did not set (ClusterFuzzLite sets its
    own ``-timeout`` / ``-rss_limit_mb``; those stay)."""
    b = budgets
    extra: list[str] = []
    if _flag(argv, "timeout") is None:
        # cost mode classifies the time an input took itself; -timeout is the hard kill, as the
        # oracle's. The baseline has only libFuzzer's timer: the budget itself.
        seconds = 2 * b.wall_s + 1 if mode != "coverage" else b.wall_s
        extra.append(f"-timeout={max(1, math.ceil(seconds))}")
    if _flag(argv, "rss_limit_mb") is None:
        grow = _headroom(b) if mode != "coverage" else b.mem_bytes
        extra.append(f"-rss_limit_mb={(_rss_bytes() + grow) // _MIB + 1}")
    if _flag(argv, "max_len") is None:
        extra.append(f"-max_len={int(getattr(target, 'max_size', 4096))}")
    # Flags go before the corpus directories (libFuzzer reads flags anywhere, but keep order).
    return [argv[0], *extra, *argv[1:]]


def _limit_address_space(budgets: Budgets) -> None:
    limit = (_statm_pages(0) or 0) + _headroom(budgets)
    _soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _load_target(atheris: Any, target_name: str) -> FuzzTarget:
    """Import the registry and warm the target up while imports are being instrumented."""
    with atheris.instrument_imports(include=list(INSTRUMENTED_PACKAGES)):
        from fuzz.targets import get_target

        target = get_target(target_name)
        warmup = getattr(target, "warmup", None)
        if warmup is not None:
            warmup()
        for seed in target.seeds():
            with contextlib.suppress(Exception):
                target.execute(seed)
    return target


class _Elite:
    """The costliest inputs seen (top by ``Cost.scalar()`` and top by cost per byte), for the
    custom mutator to mutate: PerfFuzz's queue of cost maximisers inside libFuzzer, whose own
    corpus only keeps an input for a *new* feature and schedules by rarity, not by cost."""

    def __init__(self, size: int = 16) -> None:
        self.size = size
        self.by_cost: list[tuple[float, bytes]] = []
        self.by_per_byte: list[tuple[float, bytes]] = []

    def offer(self, data: bytes, cost: Cost) -> None:
        self._offer(self.by_cost, cost.scalar(), data)
        self._offer(self.by_per_byte, cost.per_byte(len(data)), data)

    def _offer(self, top: list[tuple[float, bytes]], score: float, data: bytes) -> None:
        if len(top) >= self.size and score <= top[-1][0]:
            return
        if any(d == data for _, d in top):
            return
        top.append((score, data))
        top.sort(key=lambda e: -e[0])
        del top[self.size :]

    def pick(self, rng: random.Random) -> bytes | None:
        top = self.by_cost if rng.random() < 0.6 else self.by_per_byte
        if not top:
            return None
        # Rank-biased: the costliest is picked most often.
        return top[min(int(rng.expovariate(0.5)), len(top) - 1)][1]


def _cost_test(
    target: FuzzTarget, budgets: Budgets, atheris: Any, events: EventLog, elite: _Elite
) -> Callable[[bytes], None]:
    from fuzz._exceptions import CostFinding
    from fuzz._worker import MemProbe, execute_one
    from fuzz.oracle import classify

    probe = MemProbe()
    feedback = _CostFeedback(atheris)

    def test_one_input(data: bytes) -> None:
        raw = execute_one(target, data, probe, None)
        outcome = classify(raw, budgets, len(data))
        feedback.feed(outcome.cost, len(data))
        events.outcome(data, outcome)
        elite.offer(data, outcome.cost)
        if outcome.is_finding:
            raise CostFinding(outcome.summary())

    return test_one_input


def _coverage_test(target: FuzzTarget) -> Callable[[bytes], None]:
    expected = target.expected

    def test_one_input(data: bytes) -> None:
        try:  # noqa: SIM105 (a try costs less than a context manager on the hot path)
            target.execute(data)
        except expected:
            pass

    return test_one_input


def _mutator(
    target: FuzzTarget, atheris: Any, elite: _Elite | None
) -> Callable[[bytes, int, int], bytes]:
    """Structure-aware mutation: a third of the time a stack of the target's own mutations of
    one of the costliest inputs, else the target's mutation of libFuzzer's pick, and libFuzzer's
    byte-level ``Mutate`` (with the dictionary) as the fallback."""

    def structured(data: bytes, max_size: int, rng: random.Random, depth: int) -> bytes:
        out = data
        for _ in range(depth):
            try:
                out = target.mutate(out, max_size, rng)
            except Exception:
                break
        return out[:max_size]

    def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
        rng = random.Random(seed)
        r = rng.random()
        if elite is not None and r < 0.35:
            parent = elite.pick(rng)
            if parent is not None:
                out = structured(parent, max_size, rng, 1 + int(rng.expovariate(1.0)))
                if out != parent:
                    return out
        if r < 0.75:
            out = structured(data, max_size, rng, 1)
            if out != data:
                return out
        mutated: bytes = atheris.Mutate(data, max_size)
        return mutated

    return custom_mutator


def harness_main(
    target_name: str,
    argv: Sequence[str] | None = None,
    *,
    mode: AtherisMode = "cost",
    budgets: Budgets | None = None,
) -> NoReturn:
    """Fuzz ``target_name`` with atheris in this process (never returns: libFuzzer exits).

    ``argv``: ``[argv0, libFuzzer flags..., corpus dirs...]`` (default ``sys.argv``); argv0 must
    be executable for fork mode. Budget-derived flags are added when absent. ``budgets``
    overrides the target's (tests use an easy one).
    """
    import atheris

    args = list(sys.argv if argv is None else argv)
    target = _load_target(atheris, target_name)
    b = target.budgets if budgets is None else budgets
    forking = any(_flag(args, f) not in (None, "0") for f in ("fork", "jobs", "workers"))
    args = _with_defaults(args, target, b, mode)
    events = EventLog(os.environ.get(EVENTS_ENV))
    kwargs: dict[str, Any] = {}
    if mode == "cost":
        elite = _Elite()
        test = _cost_test(target, b, atheris, events, elite)
        kwargs["custom_mutator"] = _mutator(target, atheris, elite)
    elif mode == "coverage":
        test = _coverage_test(target)
    else:
        from fuzz.engines.hypothesis_engine import fuzz_one_input_for

        test = fuzz_one_input_for(target, on_outcome=events.outcome, budgets=b)
    if not forking:  # the fork-mode parent only dispatches; its children limit themselves
        _limit_address_space(b)
    atheris.Setup(args, test, **kwargs)
    atheris.Fuzz()
    raise SystemExit(0)  # not reached: libFuzzer exits


def _main(argv: Sequence[str]) -> NoReturn:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m fuzz.engines.atheris_harness",
        description="atheris harness for one fuzz target (libFuzzer flags after --)",
    )
    parser.add_argument("--target", required=True, help="fuzz target name")
    parser.add_argument("--mode", choices=MODES, default="cost", help="default: cost")
    parser.add_argument("--argv0", default=None, help="executable libFuzzer re-runs in fork mode")
    parser.add_argument("--budgets", default=None, help="JSON Budgets overriding the target's")
    parser.add_argument("libfuzzer", nargs=argparse.REMAINDER, help="libFuzzer flags and dirs")
    ns = parser.parse_args(argv)
    rest = ns.libfuzzer[1:] if ns.libfuzzer[:1] == ["--"] else ns.libfuzzer
    budgets = None
    if ns.budgets:
        import json

        from fuzz.targets import Budgets

        budgets = Budgets(**json.loads(ns.budgets))
    harness_main(ns.target, [ns.argv0 or sys.argv[0], *rest], mode=ns.mode, budgets=budgets)


if __name__ == "__main__":
    _main(sys.argv[1:])

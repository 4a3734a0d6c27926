"""The types every fuzz target and engine share: budgets, measured cost, the target protocol."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

__all__ = ["MIN_SIZE_FOR_PER_BYTE", "Budgets", "Cost", "FuzzTarget", "TargetKind"]

TargetKind = Literal["vulnerable", "hardened", "guard", "state"]

# Weights of Cost.scalar(): one unit each is "as bad as" 1 ms of wall time.
_MS_PER_S = 1e3
_UNITS_PER_MIB = 1.0
_UNITS_PER_KSTEP = 1.0
_UNITS_PER_100_TOKENS = 1.0
MIN_SIZE_FOR_PER_BYTE = 64


@dataclass(frozen=True)
class Budgets:
    """What one input may cost before the oracle calls it a finding.

    ``wall_s``: wall time per input (the worker is killed a little after it). ``mem_bytes``: peak
    RSS growth per input, and the worker's ``RLIMIT_AS`` headroom above its baseline.
    ``output_tokens`` / ``steps``: the target's own counters (None: not budgeted).
    ``cost_per_byte``: finding when ``Cost.scalar() / len(input)`` exceeds it (None: off).
    """

    wall_s: float
    mem_bytes: int
    output_tokens: int | None = None
    steps: int | None = None
    cost_per_byte: float | None = None

    def to_dict(self) -> dict[str, float | int | None]:
        return {
            "wall_s": self.wall_s,
            "mem_bytes": self.mem_bytes,
            "output_tokens": self.output_tokens,
            "steps": self.steps,
            "cost_per_byte": self.cost_per_byte,
        }


@dataclass(frozen=True)
class Cost:
    """What one execution cost. ``peak_mem_bytes`` is the growth of the process's peak RSS
    during the input (0 when the peak did not move); ``steps`` and ``output_tokens`` come from
    the target's own counters (expansion nodes, loop iterations, rendered tokens ...)."""

    time_s: float = 0.0
    peak_mem_bytes: int = 0
    steps: int = 0
    output_tokens: int = 0
    # CPU time of the input (0: not measured). Time budgets are checked against it when set,
    # as other load on a shared machine inflates wall time but not CPU time.
    cpu_s: float = 0.0

    @property
    def busy_s(self) -> float:
        """The time that counts: CPU time when measured, else wall time."""
        return self.cpu_s or self.time_s

    def scalar(self) -> float:
        """The single number engines maximise, in "millisecond equivalents": 1 ms of time
        (:attr:`busy_s`) = 1 MiB of peak memory growth = 1,000 steps = 100 output tokens."""
        return (
            self.busy_s * _MS_PER_S
            + self.peak_mem_bytes / (1 << 20) * _UNITS_PER_MIB
            + self.steps / 1000 * _UNITS_PER_KSTEP
            + self.output_tokens / 100 * _UNITS_PER_100_TOKENS
        )

    def per_byte(self, size: int) -> float:
        """``scalar() / size``, with sizes below :data:`MIN_SIZE_FOR_PER_BYTE` counted as that
        (a 2-byte input's fixed overhead is not a super-linear cost)."""
        return self.scalar() / max(MIN_SIZE_FOR_PER_BYTE, size)

    def to_dict(self) -> dict[str, float]:
        return {
            "wall_s": round(self.time_s, 6),
            "cpu_s": round(self.cpu_s, 6),
            "peak_rss_bytes": float(self.peak_mem_bytes),
            "steps": float(self.steps),
            "output_tokens": float(self.output_tokens),
            "scalar": round(self.scalar(), 6),
        }


@runtime_checkable
class FuzzTarget(Protocol):
    """One thing to fuzz. ``execute`` runs ONE input in the current process (the oracle decides
    which process that is) and returns its cost from cheap counters; it raises one of
    ``expected`` for a documented rejection, anything else is a crash. Hardened and guard
    targets fail CI on any finding; vulnerable ones are expected to have some."""

    # Read-only members (properties in the protocol, plain class attributes in targets).
    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def kind(self) -> TargetKind: ...

    @property
    def budgets(self) -> Budgets: ...

    @property
    def expected(self) -> tuple[type[BaseException], ...]: ...

    # Vulnerable targets need the worker (RLIMIT_AS, kill on timeout); hardened and guard
    # targets may run in process when the caller trusts them (Oracle(isolate=False)).
    @property
    def isolate_by_default(self) -> bool: ...

    def execute(self, data: bytes) -> Cost: ...

    def seeds(self) -> list[bytes]: ...

    def dictionary(self) -> list[bytes]: ...

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes: ...

"""Synthetic fuzz targets for the fuzz tests, loadable by the oracle's worker process as
``tests._fuzz_targets:<Class>``. Each input is a command naming what the execution does."""

from __future__ import annotations

import os
import random
import signal
import time

from fuzz.targets import Budgets, Cost, TargetBase
from guard.errors import GuardError

_MIB = 1 << 20


class Commands(TargetBase):
    """``ok``, ``reject``, ``crash``, ``steps``, ``big`` (holds 100 MiB), ``oom`` (asks for
    4 GiB), ``spin`` (burns CPU), ``sleep`` (blocks without CPU), ``segv``, ``exit``; anything
    else: ok with cost = number of ``a`` bytes squared (in steps)."""

    name = "tests._fuzz_targets:Commands"
    description = "synthetic commands for the oracle tests"
    exercises = "tests/_fuzz_targets.py"
    kind = "vulnerable"
    # wall_s is an outer bound: holding 100 MiB must stay a memory finding with the other core
    # busy (at 0.2 s a loaded machine made it a timeout).
    budgets = Budgets(wall_s=0.5, mem_bytes=64 * _MIB, steps=10_000)
    expected = (GuardError,)
    _seeds = (b"ok",)
    _dictionary = (b"a",)

    def execute(self, data: bytes) -> Cost:
        if data == b"reject":
            raise GuardError("synthetic_rejection", "refused")
        if data == b"crash":
            return {}["missing"]  # type: ignore[no-any-return]
        if data == b"steps":
            return Cost(steps=1_000_000)
        if data == b"big":
            block = bytearray(100 * _MIB)
            block[::4096] = b"x" * len(block[::4096])  # touch every page
            return Cost(steps=len(block) // _MIB)
        if data == b"oom":
            block = bytearray(4 << 30)
            return Cost(steps=len(block))
        if data == b"spin":
            end = time.perf_counter() + 30
            while time.perf_counter() < end:
                pass
            return Cost()
        if data == b"sleep":
            time.sleep(30)
            return Cost()
        if data == b"segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if data == b"exit":
            os._exit(3)
        n = data.count(b"a")
        return Cost(steps=n * n)


class GuardCommands(Commands):
    """The same commands on a target whose findings fail CI."""

    name = "tests._fuzz_targets:GuardCommands"
    kind = "guard"
    isolate_by_default = False


class Squares(TargetBase):
    """Cost grows as the square of the ``a`` count: a search target with a known answer (the
    step budget is crossed from 101 ``a`` on; the minimal finding is exactly that)."""

    name = "tests._fuzz_targets:Squares"
    description = "cost = (count of 'a')**2"
    exercises = "tests/_fuzz_targets.py"
    kind = "vulnerable"
    budgets = Budgets(wall_s=1.0, mem_bytes=64 * _MIB, steps=10_000)
    isolate_by_default = False
    max_size = 256
    _seeds = (b"xa",)
    _dictionary = (b"a", b"aa", b"x")

    def execute(self, data: bytes) -> Cost:
        n = data.count(b"a")
        return Cost(steps=n * n)


class SlowSeeds(TargetBase):
    """Ten seeds that each block 0.1 s (more than an engine's first batch may take), the last
    one an undocumented exception no mutation reaches: found only if every seed runs."""

    name = "tests._fuzz_targets:SlowSeeds"
    description = "slow seeds, the last one crashes"
    exercises = "tests/_fuzz_targets.py"
    kind = "vulnerable"
    budgets = Budgets(wall_s=1.0, mem_bytes=64 * _MIB)
    isolate_by_default = False
    _seeds = (*(b"nap%d" % i for i in range(9)), b"crash")

    def execute(self, data: bytes) -> Cost:
        if data == b"crash":
            raise KeyError("the last seed")
        time.sleep(0.1)  # blocked, not on CPU: under the time budget
        return Cost()

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        return b"nap"

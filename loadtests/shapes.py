"""Load shapes as pure functions of the elapsed time (locust's ``LoadTestShape`` wraps them).

A shape says, at time ``t``, how many users should run and which user classes to add or remove
to get there (``classes``; ``None`` keeps the classes' weights, i.e. the attack share):

- ``steady``: all users from the start to the end;
- ``ramp``: from a tenth of the users up to all of them over the first 80% of the run;
- ``spike``: a quarter of the users, all of them between 40% and 60% of the run, then back;
- ``burst``: the benign users all along, and the attackers only between 30% and 70% of the
  run: an attack burst during steady benign load;
- ``fair``: the benign users alone for ``solo_s`` (a third of the run unless given), then the
  attackers join until the end: the fair share phase (:mod:`loadtests.fairshare`), whose
  "attackers" are the flood tenant's streams and whose solo segment is the baseline.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["SHAPES", "ShapeSpec", "Tick", "tick"]

SHAPES = ("steady", "ramp", "spike", "burst", "fair")
BENIGN = "benign"
ATTACK = "attack"

_RAMP_END = 0.8
_SPIKE = (0.4, 0.6)
_BURST = (0.3, 0.7)
_FAIR_SOLO = 1 / 3


@dataclass(frozen=True)
class Tick:
    users: int
    spawn_rate: float
    classes: tuple[str, ...] | None = None


@dataclass(frozen=True)
class ShapeSpec:
    """``users`` in all, of which ``attack_users`` attack; ``run_time_s`` ends the run;
    ``solo_s``: the ``fair`` shape's solo segment."""

    name: str
    users: int
    attack_users: int = 0
    run_time_s: float | None = None
    spawn_rate: float | None = None
    solo_s: float | None = None

    def __post_init__(self) -> None:
        if self.name not in SHAPES:
            raise ValueError(f"unknown shape {self.name!r}; one of {', '.join(SHAPES)}")
        if self.users < 1:
            raise ValueError("a shape needs at least one user")
        if not 0 <= self.attack_users <= self.users:
            raise ValueError("attack_users must be between 0 and users")
        if self.attack_users == self.users and self.name == "burst":
            raise ValueError("the burst shape needs benign users besides the attackers")
        if self.name != "steady" and not self.run_time_s:
            raise ValueError(f"the {self.name} shape needs a run time (--run-time)")
        if self.name == "fair" and not 0 < self.attack_users < self.users:
            raise ValueError("the fair shape needs benign users and attackers (the flood)")
        if self.name == "fair" and self.run_time_s and not 0 < self.flood_from_s < self.run_time_s:
            raise ValueError("the fair shape's solo segment must end within the run")

    @property
    def benign_users(self) -> int:
        return self.users - self.attack_users

    @property
    def rate(self) -> float:
        return self.spawn_rate if self.spawn_rate else float(max(1, self.users))

    @property
    def flood_from_s(self) -> float:
        """When the ``fair`` shape's flood joins: after ``solo_s``, or a third of the run."""
        if self.solo_s is not None:
            return self.solo_s
        return (self.run_time_s or 0.0) * _FAIR_SOLO

    def all_classes(self) -> tuple[str, ...]:
        return (BENIGN, ATTACK) if self.attack_users else (BENIGN,)


def tick(spec: ShapeSpec, t: float) -> Tick | None:
    """What should run ``t`` seconds into the run; ``None`` once it is over."""
    if spec.run_time_s is not None and t >= spec.run_time_s:
        return None
    frac = t / spec.run_time_s if spec.run_time_s else 0.0
    if spec.name == "steady":
        return Tick(spec.users, spec.rate, spec.all_classes())
    if spec.name == "ramp":
        start = max(1, math.ceil(spec.users / 10))
        users = start + (spec.users - start) * min(1.0, frac / _RAMP_END)
        return Tick(max(1, round(users)), spec.rate, spec.all_classes())
    if spec.name == "spike":
        base = max(1, spec.users // 4)
        users = spec.users if _SPIKE[0] <= frac < _SPIKE[1] else base
        return Tick(users, spec.rate, spec.all_classes())
    if spec.name == "fair":
        if t < spec.flood_from_s:
            return Tick(spec.benign_users, spec.rate, (BENIGN,))
        return Tick(spec.users, spec.rate, (ATTACK,))
    # burst: benign only, then the attackers join, then they leave.
    if frac < _BURST[0]:
        return Tick(spec.benign_users, spec.rate, (BENIGN,))
    if frac < _BURST[1]:
        return Tick(spec.users, spec.rate, (ATTACK,))
    return Tick(spec.benign_users, spec.rate, (ATTACK,))

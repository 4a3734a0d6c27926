"""A convenience base for targets: fixed metadata, byte mutation with the target's dictionary."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Sequence
from typing import ClassVar

from fuzz.targets._base import Budgets, Cost, TargetKind
from fuzz.targets._mutate import byte_mutate

__all__ = ["TargetBase"]


class TargetBase:
    """Subclasses set the class attributes and implement :meth:`execute` (and usually
    :meth:`mutate`). ``exercises``: what the target runs, for ``schedguard fuzz list``;
    ``endpoint``/``class_``/``target_field``: how a finding is filed as a payload."""

    name: str
    description: str
    exercises: str
    kind: TargetKind
    budgets: Budgets
    expected: tuple[type[BaseException], ...] = ()
    isolate_by_default: bool = True
    endpoint: str = "/v1/completions"
    class_: str = "nested_prompt_template"
    target_field: str = "body"
    max_size: int = 4096
    # The module a finding points at in SARIF when it has no crash frame of its own.
    source: str = "fuzz/targets/__init__.py"
    _seeds: ClassVar[tuple[bytes, ...]] = ()
    _dictionary: ClassVar[tuple[bytes, ...]] = ()

    def execute(self, data: bytes) -> Cost:
        raise NotImplementedError

    def seeds(self) -> list[bytes]:
        return list(self._seeds)

    def dictionary(self) -> list[bytes]:
        return list(self._dictionary)

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        return byte_mutate(data, max_size, rng, self._dictionary)

    def warmup(self) -> None:
        """Load what the first execution would (imports, BPE ranks) so it is not measured."""
        for seed in self.seeds()[:1]:
            with contextlib.suppress(Exception):
                self.execute(seed)

    def progress(self) -> Cost:
        """The counters of the execution in progress (read after it was interrupted)."""
        return Cost()

    def payload_body(self, data: bytes) -> tuple[bytes, str]:
        """The request body a finding's input corresponds to, and its endpoint."""
        return data, self.endpoint

    def input_from_payload(
        self, body: bytes, endpoint: str, headers: Sequence[tuple[str, str]] = ()
    ) -> bytes | None:
        """The input a saved payload's body replays as (inverse of :meth:`payload_body`), or
        None when the payload does not apply to this target."""
        return body

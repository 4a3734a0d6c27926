"""A live server as a :class:`fuzz.targets.FuzzTarget`: what campaign reports and run contexts
take, with the server's budgets, seeds and mutator; ``execute`` sends one request.

The name is the server's URL made a file name (``http-127-0-0-1-8000``) unless given; the kind
is ``hardened`` (findings fail CI, exit 1) unless the caller expects findings (an unguarded
server: ``vulnerable``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fuzz.findings import safe_target_name
from fuzz.live._mutator import RequestMutator
from fuzz.live._oracle import LiveBudgets, LiveOracle
from fuzz.live._request import LiveRequest
from fuzz.live._shapes import CHAT
from fuzz.targets import Budgets, Cost, TargetKind

__all__ = ["LiveTarget", "live_target_name"]


def live_target_name(url: str) -> str:
    return safe_target_name(url.split("://", 1)[-1])


class LiveTarget:
    """``oracle``: how requests reach the server; ``mutator``: how they are made."""

    isolate_by_default = False
    expected: tuple[type[BaseException], ...] = ()

    def __init__(
        self,
        url: str,
        oracle: LiveOracle,
        mutator: RequestMutator,
        budgets: LiveBudgets,
        *,
        name: str | None = None,
        kind: TargetKind = "hardened",
        guard: str | None = None,
    ) -> None:
        self.url = url
        self.guard_url = guard
        self.oracle = oracle
        self.mutator = mutator
        self.live_budgets = budgets
        self.name = name or live_target_name(url)
        self.kind: TargetKind = kind
        self.budgets = Budgets(wall_s=budgets.latency_s, mem_bytes=budgets.rss_bytes)
        self.description = (
            f"the live server at {url}, differentially against the guard at {guard}"
            if guard
            else f"the live server at {url} (black box)"
        )
        self.exercises = "OpenAI chat and completion requests over HTTP"
        # Where SARIF points a finding: the guard's accounting for a differential campaign.
        self.source = "guard/pipeline.py" if guard else "fuzz/live/__init__.py"

    def execute(self, data: bytes) -> Cost:
        return self.oracle.run(LiveRequest.from_input(data)).outcome.cost

    def seeds(self) -> list[bytes]:
        return [s.to_input() for s in self.mutator.seeds]

    def dictionary(self) -> list[bytes]:
        return []

    def mutate(self, data: bytes, max_size: int, rng: random.Random) -> bytes:
        child = self.mutator.mutate(LiveRequest.from_input(data), rng).to_input()
        return child if len(child) <= max_size else data

    def payload_body(self, data: bytes) -> tuple[bytes, str]:
        req = LiveRequest.from_input(data)
        return req.to_bytes(), req.path

    def input_from_payload(
        self, body: bytes, endpoint: str, headers: Sequence[tuple[str, str]] = ()
    ) -> bytes | None:
        return body if endpoint == CHAT else f"POST {endpoint}\n\n".encode() + body

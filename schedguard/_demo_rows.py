"""The demo's data: its settings and the row it records per (deployment, payload).

Both the demo (:mod:`schedguard.demo`, which makes rows) and the tables
(:mod:`schedguard._report`, which shows them) import this module; neither imports the other's
module back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["DemoConfig", "MiB", "Row", "RowOutcome"]

RowOutcome = Literal["ok", "rejected", "server_error", "killed", "timeout", "error"]
MiB = 1 << 20


@dataclass(frozen=True)
class DemoConfig:
    mem_limit_bytes: int = 1 << 30
    timeout_s: float = 20.0  # per request, hard
    port_base: int = 0  # 0: free ports
    host: str = "127.0.0.1"
    startup_timeout_s: float = 60.0
    # After a refusal: this many more requests on the same kept-alive connection, for the
    # steady-state latency (their median), within steady_budget_s. 0: none.
    steady_requests: int = 50
    steady_budget_s: float = 5.0


@dataclass(frozen=True)
class Row:
    target: str
    profile: str
    payload: str
    outcome: RowOutcome
    status: int | None  # HTTP status, None without a response
    code: str | None  # the error body's code, "ok" on 2xx
    latency_ms: float  # the first request, connection set-up included
    peak_rss_mb: float  # peak RSS of the target's servers while the request ran
    rss_growth_mb: float  # that peak minus their RSS just before the request
    detail: str = ""
    server_peak_rss_mb: dict[str, float] = field(default_factory=dict)
    server_rss_growth_mb: dict[str, float] = field(default_factory=dict)  # per server
    # A refusal's steady state: the median of steady_requests more requests on the first one's
    # kept-alive connection (the server warm, no connection set-up); None when not measured.
    steady_latency_ms: float | None = None
    steady_requests: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

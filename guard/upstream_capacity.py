"""The upstream's capacity in force: how many requests the guard lets through at once.

The guard's global slots (:meth:`~guard.admission.ConcurrencyLimiter.set_capacity`) follow what
the upstream can serve, so that requests beyond it wait in the guard's fair queue rather than
in the upstream's first-come one. Where the number comes from (``source``):

- ``policy``: ``upstream.capacity``, fixed.
- ``upstream``: read while serving. A server exporting its load on ``/metrics`` (vLLM, SGLang,
  the reference scheduler: running and waiting requests, KV-cache use) is read every
  ``upstream.capacity_poll_s``: while it queues requests of its own the limit shrinks to what it
  runs (the guard's in flight less the upstream's queue), while the KV cache is nearly full it
  holds, and while it has room it grows back (doubling, then by one as the cache fills) up to
  its ceiling -- its ``max_num_seqs`` where it says so, else ``rate.global_concurrency``.
  llama.cpp's ``llama-server`` says its slots on ``/props`` (``total_slots``).
- ``kind``: llama-cpp-python serves one request at a time; one more is let through to wait at
  its lock, for which it ends a running stream (``interrupt_requests``, its default), so an
  ordinary request does not wait behind a long one.
- ``default``: ``rate.global_concurrency`` (the upstream says nothing the guard can read).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import dataclass
from typing import Any, Literal

from guard.gateway import Gateway
from guard.http import Upstream
from guard.policy import Policy

__all__ = ["CapacitySource", "Load", "UpstreamCapacity", "next_limit", "parse_load"]

_log = logging.getLogger("schedguard.guard")

CapacitySource = Literal["policy", "upstream", "kind", "default"]

_METRICS_MAX = 4 << 20  # vLLM's /metrics is ~100 KiB; a bigger page is not read
_PROPS_MAX = 1 << 20
# Gauges read from /metrics, by what they mean; the first name present wins. Values of one name
# are summed over its label sets (vLLM labels them by model and engine).
_GAUGES: dict[str, tuple[str, ...]] = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs", "schedguard_running"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs", "schedguard_queue_depth"),
    "kv_usage": (
        "vllm:kv_cache_usage_perc",
        "vllm:gpu_cache_usage_perc",
        "sglang:token_usage",
        "schedguard_kv_usage_ratio",
    ),
    "max_num_seqs": ("schedguard_max_num_seqs",),
}
_WANTED = {name: meaning for meaning, names in _GAUGES.items() for name in names}
# KV-cache use past which no request is added (the upstream would preempt), and past which the
# limit grows by one rather than doubling.
_KV_FULL = 0.95
_KV_HIGH = 0.8
_LLAMA_CPP_PYTHON_SLOTS = 1
# An upstream that exported nothing readable is asked again every this many polls (it may not
# have been up yet).
_REDISCOVER_EVERY = 10


@dataclass(frozen=True, slots=True)
class Load:
    """What the upstream's ``/metrics`` says about its load (None: not exported)."""

    running: float
    waiting: float
    kv_usage: float | None = None
    max_num_seqs: int | None = None


def parse_load(text: str) -> Load | None:
    """The load gauges in a Prometheus text page; None when it has no running/waiting gauges.

    A line scan for the few names wanted rather than a full parse (prometheus_client's parser
    builds every family of vLLM's ~100 KiB page: histograms included), once a second."""
    found: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        end = len(line)
        for stop in ("{", " "):
            at = line.find(stop)
            if at != -1 and at < end:
                end = at
        meaning = _WANTED.get(line[:end])
        if meaning is None:
            continue
        rest = line[end:]
        if rest.startswith("{"):
            rest = rest[rest.rfind("}") + 1 :]
        fields = rest.split()
        if not fields:
            continue
        try:
            value = float(fields[0])
        except ValueError:
            continue
        by_name = found.setdefault(meaning, {})
        by_name[line[:end]] = by_name.get(line[:end], 0.0) + value

    def first(meaning: str) -> float | None:
        by_name = found.get(meaning, {})
        for name in _GAUGES[meaning]:
            if name in by_name:
                return by_name[name]
        return None

    running, waiting = first("running"), first("waiting")
    if running is None or waiting is None:
        return None
    max_seqs = first("max_num_seqs")
    return Load(
        running,
        waiting,
        first("kv_usage"),
        int(max_seqs) if max_seqs is not None and max_seqs >= 1 else None,
    )


def next_limit(limit: int, in_flight: int, load: Load, ceiling: int) -> int:
    """The guard's next limit from the upstream's load (see the module's docstring)."""
    if load.waiting > 0:
        return max(1, min(limit, in_flight - int(load.waiting)))
    if load.kv_usage is not None and load.kv_usage >= _KV_FULL:
        return max(1, min(limit, in_flight))
    if load.kv_usage is not None and load.kv_usage >= _KV_HIGH:
        return min(ceiling, max(limit, in_flight) + 1)
    return min(ceiling, 2 * max(limit, 1))


class UpstreamCapacity:
    """Keeps the gateway's global slots in step with the upstream's capacity (and its metrics
    say which is in force)."""

    def __init__(self, gateway: Gateway, upstream: Upstream) -> None:
        self._holder = gateway  # its .policy is the one in force (the upstream's kind included)
        self._limiter = gateway.concurrency
        self._upstream = upstream
        self.source: CapacitySource = "default"
        self.ceiling: int = self._policy.rate.global_concurrency
        self.load: Load | None = None
        self._kind_seen: str | None = None
        self._polls = False  # the upstream exports its load: read it every poll
        self._until_rediscovery = 0
        self._task: asyncio.Task[None] | None = None
        gateway.metrics.capacity = self._in_force

    def _in_force(self) -> tuple[int, str]:
        return self.value or 0, self.source

    @property
    def _policy(self) -> Policy:
        return self._holder.policy

    @property
    def value(self) -> int | None:
        return self._limiter.capacity

    def describe(self) -> dict[str, Any]:
        """``{"capacity": N, "capacity_source": ..., "capacity_ceiling": N, "upstream_load":
        {"running", "waiting", "kv_usage"} or None}`` for ``/readyz``."""
        load = self.load
        return {
            "capacity": self.value,
            "capacity_source": self.source,
            "capacity_ceiling": self.ceiling,
            "upstream_load": None
            if load is None
            else {"running": load.running, "waiting": load.waiting, "kv_usage": load.kv_usage},
        }

    def _set(self, limit: int, source: CapacitySource) -> None:
        limit = max(1, min(limit, self._policy.rate.global_concurrency))
        if limit != self.value or source != self.source:
            if source != self.source:
                _log.info("upstream capacity in force: %d (%s)", limit, source)
            self.source = source
            self._limiter.set_capacity(limit)

    async def refresh(self) -> None:
        """Read the upstream once (what it is, first; then its load where it exports it)."""
        policy = self._policy
        fixed = policy.upstream.capacity
        if fixed is not None:
            self.ceiling = fixed
            self._set(fixed, "policy")
            return
        kind = policy.upstream_kind
        if kind != self._kind_seen or (self.source == "default" and self._until_rediscovery <= 0):
            self._kind_seen = kind
            self._until_rediscovery = _REDISCOVER_EVERY
            await self._discover(kind)
        elif self._polls:
            await self._poll()
        self._until_rediscovery -= 1

    async def _discover(self, kind: str) -> None:
        ceiling = self._policy.rate.global_concurrency
        self._polls = False
        self.ceiling = ceiling
        if kind == "llama_cpp":
            self.ceiling = _LLAMA_CPP_PYTHON_SLOTS + 1
            self._set(self.ceiling, "kind")
            return
        slots = await self._llama_server_slots()
        if slots is not None:
            self.ceiling = slots
            self._set(slots, "upstream")
            return
        text = await self._upstream.fetch("/metrics", _METRICS_MAX)
        load = None if text is None else parse_load(text.decode("utf-8", "replace"))
        if load is None:
            self._set(ceiling, "default")
            return
        self._polls = True
        if load.max_num_seqs is not None:
            self.ceiling = min(ceiling, load.max_num_seqs)
        self._set(self.ceiling, "upstream")

    async def _llama_server_slots(self) -> int | None:
        body = await self._upstream.fetch("/props", _PROPS_MAX)
        if body is None:
            return None
        try:
            props = json.loads(body)
        except ValueError:
            return None
        slots = props.get("total_slots") if isinstance(props, dict) else None
        return slots if type(slots) is int and slots >= 1 else None

    async def _poll(self) -> None:
        text = await self._upstream.fetch("/metrics", _METRICS_MAX)
        load = None if text is None else parse_load(text.decode("utf-8", "replace"))
        self.load = load
        if load is None:
            return  # not answering now: the limit in force stays
        if load.max_num_seqs is not None:
            self.ceiling = min(self._policy.rate.global_concurrency, load.max_num_seqs)
        current = self.value or self.ceiling
        self._set(next_limit(current, self._limiter.in_flight, load, self.ceiling), "upstream")

    async def start(self) -> None:
        """Read once now and keep reading every ``upstream.capacity_poll_s`` (the kind may be
        learnt later; the load changes all the time)."""
        await self.refresh()
        self._task = asyncio.create_task(self._keep_reading())

    async def _keep_reading(self) -> None:
        while True:
            await asyncio.sleep(self._policy.upstream.capacity_poll_s)
            try:
                await self.refresh()
            except Exception:  # a probe must never take the guard down
                _log.exception("reading the upstream's capacity failed")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

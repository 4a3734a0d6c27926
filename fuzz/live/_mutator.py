"""Structure-aware mutation of OpenAI requests, and the choice of what to send next.

:class:`RequestMutator` stacks 1-4 operators of :mod:`fuzz.live._shapes` on a parent request
(weights depend on the campaign: a differential campaign favours the text carriers, a
black-box one the guided-decoding, nesting and fan-out shapes too), then makes the result
sendable: the target's model name, a small output cap unless an operator chose one (the
campaign measures what the request makes the server read and build, not how long a random model
talks), and the size cap.

:class:`CorpusScheduler` decides what is sent next: every seed once (benign ones first), then
children of the seeds and of the costliest requests so far (rank-biased, as the in-process
search engine's queue), with a benign seed re-sent now and then.
"""

from __future__ import annotations

import json
import math
import random
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from fuzz.live._request import LiveRequest, collect_texts
from fuzz.live._shapes import OPERATORS, OUTPUT_FIELDS, Context, raw_nest

__all__ = ["CorpusScheduler", "RequestMutator"]

_OUTPUT_CAPS = (1, 2, 4, 8, 16)
_MAX_LINEAGE = 12


class RequestMutator:
    """``model``: set on every request (None: left as the seed has it); ``differential``: the
    operator weights of a differential campaign; ``output_cap``: the largest output a request
    asks for unless an operator set it; ``max_body_bytes``: larger children are discarded."""

    def __init__(
        self,
        seeds: Sequence[LiveRequest],
        *,
        model: str | None = None,
        differential: bool = False,
        output_cap: int = 16,
        max_body_bytes: int = 1 << 20,
    ) -> None:
        self.seeds = [s for s in seeds if s.body is not None or s.raw is not None]
        self.json_seeds = [s for s in self.seeds if isinstance(s.body, dict)]
        if not self.json_seeds:
            raise ValueError("no JSON seeds to mutate")
        self.model = model
        self.output_cap = output_cap
        self.max_body_bytes = max_body_bytes
        self.texts = collect_texts(self.seeds)
        # Children whose JSON is then nested deeper as text (too deep to mutate further).
        self.raw_share = 0.01 if differential else 0.03
        self._names = list(OPERATORS)
        self._weights = [OPERATORS[n][2] if differential else OPERATORS[n][1] for n in self._names]

    def prepare(
        self, req: LiveRequest, rng: random.Random, *, touched: Sequence[str] = ()
    ) -> LiveRequest | None:
        """A child made sendable (model, output cap unless an operator in ``touched`` set
        one), or None when it is too large."""
        if not isinstance(req.body, dict):
            return req if req.raw is not None and len(req.raw) <= self.max_body_bytes else None
        body = req.body
        if self.model is not None:
            body["model"] = self.model
        if not any(t.startswith("set:") and t[4:] in OUTPUT_FIELDS for t in touched):
            _cap_output(body, rng, self.output_cap)
        out = req.with_body(body)
        return out if out.size <= self.max_body_bytes else None

    def seed_request(self, seed: LiveRequest, rng: random.Random) -> LiveRequest | None:
        """A seed as it is sent unchanged: only the model is set (its output cap is part of
        what the payload tests)."""
        if seed.raw is not None:
            return seed if len(seed.raw) <= self.max_body_bytes else None
        if not isinstance(seed.body, dict):
            return None
        body = _copy(seed)
        if self.model is not None:
            body["model"] = self.model
        out = seed.with_body(body)
        return out if out.size <= self.max_body_bytes else None

    def mutate(self, parent: LiveRequest, rng: random.Random, tries: int = 8) -> LiveRequest:
        """A child of ``parent`` (of a random JSON seed when ``parent`` is raw)."""
        for _ in range(tries):
            base = parent if isinstance(parent.body, dict) else rng.choice(self.json_seeds)
            try:
                body: dict[str, Any] = _copy(base)
            except RecursionError:
                base = rng.choice(self.json_seeds)
                body = _copy(base)
            ctx = Context(rng, self.texts, base.path, max_bytes=self.max_body_bytes)
            names: list[str] = []
            for _ in range(_stack_depth(rng)):
                name = rng.choices(self._names, self._weights)[0]
                op = OPERATORS[name][0]
                try:
                    applied = op(body, ctx)
                except (RecursionError, ValueError, TypeError, KeyError, IndexError):
                    applied = False
                if applied:
                    names.append(name)
            if not names:
                continue
            lineage = (*base.lineage, *names)[-_MAX_LINEAGE:]
            child = replace(base, body=body, raw=None, lineage=lineage, benign=False, _bytes=[])
            try:
                ready = self.prepare(child, rng, touched=ctx.applied)
            except RecursionError:
                continue
            if ready is None:
                continue
            if rng.random() < self.raw_share:
                raw = raw_nest(ready.to_bytes(), rng)
                if len(raw) <= self.max_body_bytes:
                    lineage = (*lineage, "raw.nest")[-_MAX_LINEAGE:]
                    return replace(ready, body=None, raw=raw, lineage=lineage, _bytes=[])
            return ready
        fallback = rng.choice(self.json_seeds)
        out = self.seed_request(fallback, rng)
        return out if out is not None else fallback


def _copy(req: LiveRequest) -> Any:
    """A fresh copy of the request's body, parsed again from its (cached) bytes: several times
    faster than ``copy.deepcopy`` on the corpus's large bodies."""
    return json.loads(req.to_bytes().decode("utf-8", "surrogatepass"))


def _stack_depth(rng: random.Random) -> int:
    r = rng.random()
    return 1 if r < 0.5 else 2 if r < 0.8 else 3 if r < 0.93 else 4


def _cap_output(body: dict[str, Any], rng: random.Random, limit: int) -> None:
    """At most ``limit`` output tokens (one of a few small caps when there is none)."""
    present = False
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            present = True
            if value > limit or value < 0:
                body[name] = rng.choice(_OUTPUT_CAPS)
    min_tokens = body.get("min_tokens")
    if isinstance(min_tokens, int) and not isinstance(min_tokens, bool) and min_tokens > limit:
        body["min_tokens"] = 0
    if not present and rng.random() < 0.95:
        body["max_tokens"] = rng.choice(_OUTPUT_CAPS)


class CorpusScheduler:
    """What to send next; safe to share between threads. ``score`` feedback (higher: costlier)
    keeps the top ``capacity`` requests as parents; ``benign_parents``: the share of seed
    parents drawn from the benign seeds."""

    def __init__(
        self,
        mutator: RequestMutator,
        seeds: Sequence[LiveRequest],
        *,
        capacity: int = 32,
        resend_benign: float = 0.02,
        benign_parents: float = 0.0,
    ) -> None:
        self.mutator = mutator
        self.seeds = list(seeds)
        self.benign = [s for s in self.seeds if s.benign]
        # Share of seed parents taken from the benign seeds (a differential campaign mutates
        # what a guard admits: children of attacks are mostly refused at once).
        self.benign_parents = benign_parents
        self.capacity = capacity
        self.resend_benign = resend_benign
        self._first = list(self.seeds)  # every seed once, in order
        self._pool: list[tuple[float, LiveRequest]] = []
        self._banned: set[bytes] = set()
        self._lock = threading.Lock()

    def next(self, rng: random.Random) -> LiveRequest:
        with self._lock:
            first = self._first.pop(0) if self._first else None
            pool = list(self._pool)
        if first is not None:
            out = self.mutator.seed_request(first, rng)
            if out is not None:
                return out
        if self.benign and rng.random() < self.resend_benign:
            out = self.mutator.seed_request(rng.choice(self.benign), rng)
            if out is not None:
                return out
        if pool and rng.random() < 0.5:
            # Rank-biased: the i-th costliest is picked with probability ~ 0.75^i.
            i = min(len(pool) - 1, int(math.log(1 - rng.random()) / math.log(0.75)))
            parent = pool[i][1]
        elif self.benign and rng.random() < self.benign_parents:
            parent = rng.choice(self.benign)
        else:
            # The smaller of two: the corpus's megabyte bodies are mutated less often (a child
            # costs its parent's size to build, send and parse).
            parent = min(rng.choice(self.seeds), rng.choice(self.seeds), key=lambda r: r.size)
        return self.mutator.mutate(parent, rng)

    def feedback(self, req: LiveRequest, score: float) -> None:
        """Offer ``req`` as a parent with its cost ``score``."""
        if score <= 0 or req.benign:
            return
        key = req.to_input()
        with self._lock:
            if key in self._banned or any(r.to_input() == key for _, r in self._pool):
                return
            if len(self._pool) >= self.capacity and score <= self._pool[-1][0]:
                return
            self._pool.append((score, req))
            self._pool.sort(key=lambda e: -e[0])
            del self._pool[self.capacity :]

    def ban(self, req: LiveRequest) -> None:
        """Stop using ``req`` as a parent (it hits a cause found already, or kills the server)."""
        key = req.to_input()
        with self._lock:
            self._banned.add(key)
            self._pool = [(s, r) for s, r in self._pool if r.to_input() != key]

    @property
    def pending_seeds(self) -> int:
        with self._lock:
            return len(self._first)

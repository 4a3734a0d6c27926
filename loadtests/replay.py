"""The payloads/ corpus as requests to replay: every attack class of THREATS.md and the benign
look-alikes, read through :func:`payloads.loader.load_corpus` (the files the guard tests and
the fuzzers read).

Bodies are materialised once per process and kept (about 35 MB for the whole corpus), because
building the biggest ones costs more than sending them. ``flood``-tagged payloads are valid
requests that only a rate or concurrency limit refuses: they are sent as a burst
(:attr:`Replay.flood`), and the burst counts as stopped when any request of it is refused.

The corpus's bodies name the reference scheduler's model; against another server each body
names the served model instead (``model=``), bytes for bytes, so that malformed and deep bodies
stay exactly as they are otherwise: a request naming a model the server does not serve gets the
server's 404, which would pass an attack as refused and fail a benign request for nothing.
"""

from __future__ import annotations

import itertools
import json
import random
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from loadtests.fit import fit
from loadtests.target import REFERENCE_MODEL
from payloads.loader import BENIGN, CLASSES, Payload, Transport, load_corpus

__all__ = [
    "CLASSES",
    "CORPUS_MODEL",
    "Replay",
    "RoundRobin",
    "load_attacks",
    "load_lookalikes",
    "with_model",
]

FLOOD_TAG = "flood"
# The model the corpus's bodies name (the reference scheduler's), as it appears in them.
CORPUS_MODEL = json.dumps(REFERENCE_MODEL).encode()


def with_model(body: bytes, model: str | None) -> bytes:
    """``body`` naming ``model`` where it names the corpus's (unchanged for ``None``)."""
    if model is None:
        return body
    return body.replace(CORPUS_MODEL, json.dumps(model).encode())


@dataclass(eq=False)
class Replay:
    """One corpus payload, ready to send. ``body()`` and ``headers()`` are cached."""

    payload: Payload
    model: str | None = None  # the served model's name, for the corpus's
    _body: bytes | None = field(default=None, repr=False)
    _headers: list[tuple[str, str]] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def id(self) -> str:
        return self.payload.id

    @property
    def class_(self) -> str:
        return self.payload.class_

    @property
    def method(self) -> str:
        return self.payload.method

    @property
    def path(self) -> str:
        return self.payload.endpoint

    @property
    def transport(self) -> Transport | None:
        return self.payload.transport

    @property
    def flood(self) -> bool:
        return FLOOD_TAG in self.payload.tags

    @property
    def expect_status(self) -> int:
        return self.payload.expect.status

    @property
    def expect_code(self) -> str | None:
        return self.payload.expect.code

    def body(self) -> bytes:
        if self._body is None:
            with self._lock:
                if self._body is None:
                    self._body = with_model(self.payload.body_bytes(), self.model)
        return self._body

    def headers(self) -> list[tuple[str, str]]:
        if self._headers is None:
            with self._lock:
                if self._headers is None:
                    self._headers = self.payload.header_items()
        return self._headers


def _replays(payloads: Iterable[Payload], model: str | None = None) -> list[Replay]:
    # Payloads for routes the load-test policy does not proxy (vLLM's pooling and scoring
    # routes, which the reference scheduler does not serve) are left out.
    return [Replay(p, model) for p in payloads if not p.routes]


def load_attacks(
    classes: Sequence[str] | None = None,
    *,
    root: Path | None = None,
    include_found: bool = True,
    model: str | None = None,
) -> list[Replay]:
    """Every attack of the corpus (optionally only ``classes``), in file order."""
    wanted = list(classes) if classes else None
    if wanted is not None:
        unknown = sorted(set(wanted) - set(CLASSES))
        if unknown:
            raise ValueError(f"unknown attack class(es) {unknown}; one of {', '.join(CLASSES)}")
    corpus = load_corpus(root, classes=wanted, kind="attack", include_found=include_found)
    return _replays(corpus, model)


def load_lookalikes(
    profile: str | None = None,
    *,
    root: Path | None = None,
    kind: str = "reference",
    model: str | None = None,
) -> list[Replay]:
    """The benign look-alikes an upstream of ``kind`` (:mod:`loadtests.fit`) serves; for the
    reference, those its ``profile`` serves (its ``profiles`` note says ``served``), all of
    them when ``profile`` is ``None``."""
    out = []
    for p in load_corpus(root, classes=[BENIGN], kind="benign", include_found=False):
        served = getattr(p.profiles, profile, None) if profile else "served"
        if served in (None, "served"):
            out.append(p)
    return _replays(fit(out, kind)[0], model)


class RoundRobin:
    """Hands out replays in a shuffled order, cycling, shared by the users of one process, so
    that every payload is replayed within the first ``len(replays)`` attacks."""

    def __init__(self, replays: Sequence[Replay], seed: int = 0) -> None:
        if not replays:
            raise ValueError("nothing to replay")
        order = list(replays)
        random.Random(seed).shuffle(order)
        self._cycle: Iterator[Replay] = itertools.cycle(order)
        self._lock = threading.Lock()
        self.size = len(order)

    def next(self) -> Replay:
        with self._lock:
            return next(self._cycle)

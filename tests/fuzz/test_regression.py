"""Regression suite (issue 4, Proof): every payload file under payloads/ (curated attacks,
benign look-alikes and fuzz findings) replays against the hardened targets and the guard
without a finding. Everything runs in the oracle's worker process under RLIMIT_AS."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from fuzz.oracle import Oracle
from fuzz.replay import replay_file
from payloads import DEFAULT_ROOT

FILES = sorted(DEFAULT_ROOT.rglob("*.yaml"))
SAFE_TARGETS = ("placeholder-hardened", "chat-template-hardened", "guard-pipeline", "guard-app")


@pytest.fixture(scope="module")
def oracles() -> Iterator[dict[str, Oracle]]:
    cache: dict[str, Oracle] = {}
    yield cache
    for o in cache.values():
        o.close()


def test_the_corpus_is_there() -> None:
    assert len(FILES) >= 100
    assert any("found" in f.parts for f in FILES), "no fuzz findings saved under payloads/found"


@pytest.mark.parametrize("target", SAFE_TARGETS)
def test_every_payload_replays_without_a_finding(target: str, oracles: dict[str, Oracle]) -> None:
    findings = []
    applied = 0
    for path in FILES:
        result = replay_file(path, target, oracles)
        if result.outcome is None:
            continue
        applied += 1
        if result.is_finding:
            findings.append(result.to_dict())
    assert applied >= 10, f"only {applied} payloads apply to {target}"
    assert not findings, findings


def test_findings_still_reproduce_on_their_own_target(oracles: dict[str, Oracle]) -> None:
    """A finding saved from a vulnerable target still exhausts it (the corpus is not stale)."""
    found = [f for f in FILES if "found" in f.parts and "vulnerable" in f.parent.name]
    for path in found[:4]:
        result = replay_file(Path(path), None, oracles)
        # Which budget goes first (time or memory) depends on how loaded the machine is: the
        # corpus is stale only if the input no longer exhausts the target at all.
        assert result.outcome is not None and result.outcome.is_finding, result.to_dict()

"""fuzz.live._mutator: children of the corpus's seeds, sendable, that reach the deep shapes."""

from __future__ import annotations

import json
import random
import re

from fuzz.live import LiveRequest, RequestMutator, load_seeds


def test_mutator_reaches_a_60000_deep_grammar() -> None:
    """The llama.cpp parser crash needs ( x 20,000 or more: the operators get there from an
    ordinary grammar seed."""
    seeds = [s for s in load_seeds() if s.seed_id == "builtin-chat-grammar"]
    mutator = RequestMutator(seeds, model="m", max_body_bytes=1 << 20)
    rng = random.Random(0)
    deep = re.compile(r"\({60000}")
    found = False
    for _ in range(600):
        child = mutator.mutate(seeds[0], rng)
        if deep.search(child.to_bytes().decode("utf-8", "replace")):
            found = True
            break
    assert found


def test_every_child_is_sendable_json() -> None:
    seeds = load_seeds(max_bytes=64 << 10)
    assert any(s.benign for s in seeds) and any(not s.benign for s in seeds)
    mutator = RequestMutator(seeds, model="m", max_body_bytes=256 << 10)
    rng = random.Random(1)
    for _ in range(300):
        parent = rng.choice(seeds)
        child = mutator.mutate(parent, rng)
        data = child.to_bytes()
        assert len(data) <= 256 << 10
        assert child.lineage
        if child.raw is None:
            body = json.loads(data)
            assert body["model"] == "m"
            assert LiveRequest.from_input(child.to_input()).path == child.path

"""fuzz.live._request: a live request as a fuzz input and back, and the seeds a campaign starts
from (the payload corpus, then the built-in ones)."""

from __future__ import annotations

from pathlib import Path

from fuzz.live import BUILTIN_SEEDS, LiveRequest, load_seeds
from tests.fuzz.live._fake import CHAT, HELLO, make_corpus

COMPLETIONS = "/v1/completions"


def test_a_request_is_its_body_after_a_request_line_unless_it_is_a_chat() -> None:
    chat = LiveRequest(CHAT, HELLO)
    assert chat.to_input() == chat.to_bytes() == b'{"model":"m","messages":[{"role":"user",' \
        b'"content":"Hello there"}],"max_tokens":2}'  # fmt: skip
    back = LiveRequest.from_input(chat.to_input())
    assert (back.path, back.body, back.raw) == (CHAT, HELLO, None)

    completion = LiveRequest(COMPLETIONS, {"prompt": "x"})
    data = completion.to_input()
    assert data == b'POST /v1/completions\n\n{"prompt":"x"}'
    assert LiveRequest.from_input(data).path == COMPLETIONS
    assert LiveRequest.from_input(b"POST \n\n{}").path == CHAT  # no endpoint: the chat one

    raw = LiveRequest.from_input(b'{"model": "m", "messages": [')  # not JSON: kept as bytes
    assert raw.body is None and raw.raw == b'{"model": "m", "messages": ['
    assert raw.to_bytes() == raw.raw

    edited = chat.with_body({"model": "n"})
    assert edited.to_bytes() == b'{"model":"n"}' and chat.to_bytes() != edited.to_bytes()


def test_seeds_come_from_the_corpus_benign_first_then_the_built_in_ones(tmp_path: Path) -> None:
    big = {**HELLO, "messages": [{"role": "user", "content": "x" * 5000}]}
    root = make_corpus(tmp_path, {"attack": {**HELLO, "n": 1000}, "big": big}, {"hello": HELLO})
    seeds = load_seeds(root, max_bytes=4096)
    ids = [s.seed_id for s in seeds]
    assert ids[:2] == ["hello", "attack"]  # benign first; "big" is over max_bytes
    assert seeds[0].benign and not seeds[1].benign
    assert ids[2:] == [s.seed_id for s in BUILTIN_SEEDS]
    only_completions = load_seeds(root, paths=(COMPLETIONS,))
    assert only_completions and all(s.path == COMPLETIONS for s in only_completions)

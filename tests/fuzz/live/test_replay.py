"""fuzz.live._replay: saved payload files sent again to a live server (through a guard's dry run
when given) and judged as the campaign that found them judged them."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from fuzz.live import replay_live
from payloads import save_benign_found, save_found
from schedguard.cli import main
from tests.fuzz.live._fake import CHAT, HELLO, Fake

COST = {"wall_s": 0.1}


def _files(root: Path) -> tuple[Path, Path, Path]:
    """An under-count the fake guard misses (a refusal part), a benign request it refuses
    (``FALSEPOS``), and a payload judged by the HTTP layer."""
    refusal = {**HELLO, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi"}, {"type": "refusal", "refusal": "no " * 300}]}]}  # fmt: skip
    args = {"root": root, "target": "fake", "endpoint": CHAT, "description": "test",
            "engine": "differential", "cost_before": COST, "cost_after": COST}  # fmt: skip
    under = save_found(
        class_="volume",
        body=_json(refusal),
        target_field="messages[].content[type=refusal].refusal",
        cause="undercount:prompt_tokens:messages[].content[type=refusal].refusal",
        **args,
    )
    falsepos = {**HELLO, "messages": [{"role": "user", "content": "FALSEPOS is a word"}]}
    benign = save_benign_found(
        body=_json(falsepos), target_field="body", cause="false_positive:looks_bad:x", **args
    )
    http = root / "http.yaml"
    record = {"id": "hf-x", "class": "http_framing", "description": "test", "layer": "http",
              "target_field": "path", "endpoint": "/v1/models/../x", "method": "GET",
              "body_text": "", "expect": {"status": 400, "code": "invalid_path"}}  # fmt: skip
    http.write_text(yaml.safe_dump(record))
    return under.path, benign.path, http


def _json(doc: object) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def test_each_file_is_judged_again_through_the_guard(fake: Fake, tmp_path: Path) -> None:
    under, benign, http = _files(tmp_path)
    replays = replay_live([under, benign, http], fake.url, guard=fake.url)
    results = {Path(r.path).name: r for r in replays}
    u = results[under.name].to_dict()
    assert u["verdict"] == "undercount" and u["recorded_cause"].startswith("undercount:")
    assert int(u["upstream_prompt_tokens"]) > int(u["guard_prompt_tokens"]) and u["excess"] > 0
    assert results[benign.name].to_dict()["verdict"] == "false_positive"
    skipped = results[http.name]
    assert skipped.measured is None and skipped.note == "judged by the HTTP layer"
    assert not skipped.is_finding


def test_without_a_guard_the_server_is_judged_alone(fake: Fake, tmp_path: Path) -> None:
    under, benign, _ = _files(tmp_path)
    results = replay_live([under, benign], fake.url)
    assert [r.to_dict()["verdict"] for r in results] == ["ok", "ok"]
    assert not any(r.is_finding for r in results)
    # The CLI's exit status: 1 when a file is a finding again.
    assert main(["fuzz", "replay", str(under), "--target", fake.url]) == 0
    assert main(["fuzz", "replay", str(under), "--target", fake.url, "--guard", fake.url]) == 1

"""The fair share phase of ``schedguard load`` (issue 25 item 4): the ``fair`` shape, the
records the users leave in the timeline, the gate's two checks, the report's per-tenant figures
and the command line. Nothing here imports locust (tests/e2e/test_load_fair_e2e.py runs it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from loadtests import fairshare, report, shapes, slo
from loadtests import timeline as tl
from schedguard import _load_cli
from schedguard.cli import build_parser
from tests.loadtests.test_report import _counted, _parse

T0 = 1_700_000_000.0
CONFIG = {"solo_s": 10.0, "streams": 4, "unread": 2, "hold_s": 30.0, "flood_tokens": 2048,
          "flood_n": 4, "chat_tokens": 16}  # fmt: skip


# ------------------------------------------------------------------------------ shape


def test_fair_shape_runs_the_chats_alone_then_adds_the_flood() -> None:
    spec = shapes.ShapeSpec("fair", users=6, attack_users=4, run_time_s=30.0)
    assert spec.flood_from_s == 10.0  # a third of the run by default
    assert shapes.tick(spec, 0.0) == shapes.Tick(2, 6.0, (shapes.BENIGN,))
    assert shapes.tick(spec, 9.9) == shapes.Tick(2, 6.0, (shapes.BENIGN,))
    assert shapes.tick(spec, 10.0) == shapes.Tick(6, 6.0, (shapes.ATTACK,))
    assert shapes.tick(spec, 29.9) == shapes.Tick(6, 6.0, (shapes.ATTACK,))
    assert shapes.tick(spec, 30.0) is None
    solo = shapes.ShapeSpec("fair", 6, 4, 30.0, solo_s=5.0)
    assert shapes.tick(solo, 5.0) == shapes.Tick(6, 6.0, (shapes.ATTACK,))


@pytest.mark.parametrize(
    ("users", "flood", "run_time", "solo", "message"),
    [
        (4, 0, 30.0, None, "benign users and attackers"),
        (4, 4, 30.0, None, "benign users and attackers"),
        (4, 2, 30.0, 30.0, "within the run"),
        (4, 2, None, None, "needs a run time"),
    ],
)
def test_fair_shape_refuses_what_cannot_show_a_share(
    users: int, flood: int, run_time: float | None, solo: float | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        shapes.ShapeSpec("fair", users, flood, run_time, solo_s=solo)


# ------------------------------------------------------------------------------ records, gate


def _timeline(
    chat_flood_ms: float = 150.0, refused: int = 1, solo: int = 20, flood_chats: int = 20
) -> tl.Timeline:
    """A run's records: chats of 100 ms alone, then of ``chat_flood_ms`` beside 5 flood
    streams (50 ms to begin, 100 tokens each), ``refused`` chats refused under flood."""
    timeline = tl.Timeline()
    chat, flood = fairshare.CHAT, fairshare.FLOOD
    solo_seg, flood_seg = fairshare.SOLO, fairshare.FLOOD_SEGMENT
    for i in range(solo):
        when = T0 + 1 + i * 0.4
        timeline.count(when, fairshare.series_name("", chat, solo_seg), "200 -")
        timeline.latency(when, fairshare.series_name("lat", chat, solo_seg), 100.0)
        timeline.count(when, fairshare.series_name("tokens", chat, solo_seg), "tokens", 16)
    for i in range(flood_chats):
        when = T0 + 11 + i * 0.4
        timeline.count(when, fairshare.series_name("", chat, flood_seg), "200 -")
        timeline.latency(when, fairshare.series_name("lat", chat, flood_seg), chat_flood_ms)
        timeline.count(when, fairshare.series_name("tokens", chat, flood_seg), "tokens", 16)
    for _ in range(refused):
        label = fairshare.status_label(503, "server_busy")
        timeline.count(T0 + 15, fairshare.series_name("", chat, flood_seg), label)
    for i in range(5):
        when = T0 + 11 + i
        timeline.count(when, fairshare.series_name("", flood, flood_seg), "200 -")
        timeline.latency(when, fairshare.series_name("lat", flood, flood_seg), 50.0)
        timeline.count(when + 2, fairshare.series_name("tokens", flood, flood_seg), "tokens", 100)
    timeline.count(T0 + 12, fairshare.series_name("", flood, flood_seg), "429 concurrency_limited")
    return timeline


def _gate(
    timeline: tl.Timeline, th: fairshare.FairThresholds | None = None
) -> tuple[slo.Report, dict[str, slo.Check]]:
    base = slo.evaluate(slo.RunData(benign_latency_ms={100: 1}), slo.Thresholds())
    rec = fairshare.records(timeline.buckets)
    out = fairshare.gate(base, rec, th or fairshare.FairThresholds(), CONFIG)
    return out, {c.name: c for c in out.checks}


def test_the_gate_judges_the_ratio_and_the_unanswered() -> None:
    rep, checks = _gate(_timeline(chat_flood_ms=150.0, refused=0))
    ratio, unanswered = checks[fairshare.RATIO_CHECK], checks[fairshare.UNANSWERED_CHECK]
    assert (ratio.status, ratio.measured) == ("pass", "1.50x (150 ms / 100 ms)")
    assert (unanswered.status, unanswered.measured) == ("pass", "0 of 40")
    fair = rep.numbers["fair_share"]
    assert fair["chat_p99_ratio"] == 1.5 and fair["chat_unanswered"] == 0
    assert fair["tenants"]["chat"]["solo"] == {
        "requests": 20, "served": 20, "p50_ms": 100.0, "p99_ms": 100.0, "tokens": 320,
        "answers": {"200 -": 20},
    }  # fmt: skip
    # The flood's refusals are its own business: recorded, not judged.
    assert fair["tenants"]["flood"]["flood"]["answers"] == {
        "200 -": 5,
        "429 concurrency_limited": 1,
    }
    assert fair["flood_segment_shares"] == {
        "chat": {"served": 20, "tokens": 320, "share_served": 0.8, "share_tokens": 0.3902},
        "flood": {"served": 5, "tokens": 500, "share_served": 0.2, "share_tokens": 0.6098},
    }
    assert rep.passed


def test_the_gate_fails_a_slow_chat_an_unanswered_one_and_a_missing_segment() -> None:
    _, checks = _gate(_timeline(chat_flood_ms=250.0, refused=0))
    assert checks[fairshare.RATIO_CHECK].status == "fail"
    assert checks[fairshare.RATIO_CHECK].measured == "2.50x (250 ms / 100 ms)"
    # The ratio is the operator's to set.
    _, checks = _gate(_timeline(chat_flood_ms=250.0, refused=0), fairshare.FairThresholds(3.0))
    assert checks[fairshare.RATIO_CHECK].status == "pass"
    rep, checks = _gate(_timeline(refused=2))
    assert checks[fairshare.UNANSWERED_CHECK].status == "fail"
    assert checks[fairshare.UNANSWERED_CHECK].measured == "2 of 42; 503 server_busy: 2"
    assert not rep.passed
    _, checks = _gate(_timeline(flood_chats=0, refused=0))
    assert checks[fairshare.RATIO_CHECK].status == "fail"
    assert checks[fairshare.RATIO_CHECK].measured == "no chat served in the flood segment"
    _, checks = _gate(_timeline(solo=0, flood_chats=0, refused=0))
    assert checks[fairshare.UNANSWERED_CHECK].status == "fail"  # no chat at all shows nothing


def test_records_survive_the_workers_merge() -> None:
    timeline = _timeline()
    merged = tl.Timeline()
    merged.merge(timeline.drain())
    merged.merge(_timeline().drain())
    rec = fairshare.records(merged.buckets)
    assert rec.requests(fairshare.CHAT, fairshare.FLOOD_SEGMENT) == 42
    assert rec.tokens[(fairshare.FLOOD, fairshare.FLOOD_SEGMENT)] == 1000


def test_bodies_and_defaults_by_upstream_kind() -> None:
    assert fairshare.flood_shape("llama_cpp") == (1024, 1)
    assert fairshare.flood_shape("vllm") == (1024, 4)
    assert fairshare.flood_shape("nonesuch") == fairshare.flood_shape("other")
    flood = json.loads(fairshare.flood_body("m", 128, 1))
    assert flood["stream"] is True and "n" not in flood and flood["max_tokens"] == 128
    assert json.loads(fairshare.flood_body("m", 64, 4))["n"] == 4
    assert json.loads(fairshare.chat_body("m", 8))["max_tokens"] == 8
    assert fairshare.completion_tokens(b'{"usage":{"completion_tokens":7}}') == 7
    assert fairshare.completion_tokens(b"not json") == 0
    assert fairshare.status_label(0, None, "closed without response") == "0 closed_without_response"


# ------------------------------------------------------------------------------ report


def _write_run(directory: Path, timeline: tl.Timeline) -> Path:
    directory.mkdir(parents=True)
    rep, _ = _gate(timeline)
    rep.write_json(directory / "slo.json")
    tl.write(directory / "timeline.json", tl.build(timeline, t0=T0, end=T0 + 30))
    return directory


def test_the_report_shows_each_tenant_from_the_gates_records(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run", _timeline(refused=1))
    text = report.write_report(run).read_text()
    assert 'id="fair-share"' in text
    page, counted = _parse(text), _counted(text)
    assert "fair-latency" in page.charts and "fair-latency" not in page.empty_charts
    t = counted.table
    fair = json.loads((run / "slo.json").read_text())["numbers"]["fair_share"]
    for tenant, segments in fair["tenants"].items():
        for segment, row in segments.items():
            if not row["requests"]:
                continue
            key = f"fair/{tenant}/{segment}"
            assert t[f"{key}/requests"] == row["requests"]
            assert t[f"{key}/served"] == row["served"]
            assert t[f"{key}/tokens"] == row["tokens"]
            for label, n in row["answers"].items():
                assert t[f"{key}/{label}"] == n
    for tenant, share in fair["flood_segment_shares"].items():
        assert t[f"fair/share/{tenant}/served"] == share["served"]
        assert t[f"fair/share/{tenant}/tokens"] == share["tokens"]
    assert t["fair/chat/unanswered"] == fair["chat_unanswered"] == 1
    assert counted.measured[fairshare.UNANSWERED_CHECK] == "1 of 41; 503 server_busy: 1"
    # The chart: both tenants' lines, the flood's start, the limit over the solo p99.
    svg = text[text.index('<svg id="fair-latency"') :]
    svg = svg[: svg.index("</svg>")]
    assert "flood joins" in svg and "2x solo chat p99" in svg


def test_a_run_of_another_scenario_has_no_fair_share_section(tmp_path: Path) -> None:
    run = _write_run(tmp_path / "run", tl.Timeline())
    text = report.write_report(run).read_text()
    assert 'id="fair-share"' not in text and 'id="fair-latency"' not in text


# ------------------------------------------------------------------------------ command line


def test_the_scenario_passes_its_tenants_and_flood_to_locust() -> None:
    args = build_parser().parse_args(
        [
            "load",
            "--scenario",
            "fair-share",
            "--users",
            "3",
            "--flood-streams",
            "5",
            "--flood-unread",
            "9",
            "--solo",
            "12",
            "--flood-n",
            "2",
            "--tenant-key",
            "sk-a",
            "--flood-key",
            "sk-b",
            "--max-fair-ratio",
            "3",
        ]
    )
    target = _load_cli.LoadEndpoints("http://g", "http://g", "http://u", 11, 22)
    cmd = _load_cli.locust_argv(args, target, Path("out"))

    def value(flag: str) -> str:
        return cmd[cmd.index(flag) + 1]

    assert value("-u") == "8" and value("--shape") == "fair" and value("--scenario") == "fair-share"
    assert value("--fair-streams") == "5" and value("--fair-unread") == "5"  # at most all
    assert value("--fair-solo-s") == "12.0" and value("--fair-flood-n") == "2"
    assert "--fair-flood-tokens" not in cmd  # the upstream kind's default
    assert value("--benign-key") == "sk-a" and value("--flood-key") == "sk-b"
    assert value("--slo-fair-max-p99-ratio") == "3.0"
    mixed = _load_cli.locust_argv(build_parser().parse_args(["load"]), target, Path("out"))
    assert "--fair-streams" not in mixed and "--flood-key" not in mixed


def test_every_fair_share_option_has_help() -> None:
    parser = build_parser()
    load = next(
        a
        for a in parser._subparsers._group_actions[0].choices.items()
        if a[0] == "load"  # type: ignore[union-attr]
    )[1]
    wanted = {"--solo", "--flood-streams", "--flood-unread", "--flood-hold", "--flood-tokens",
              "--flood-n", "--chat-tokens", "--chat-timeout", "--tenant-key", "--flood-key",
              "--max-fair-ratio"}  # fmt: skip
    seen = {opt: a.help for a in load._actions for opt in a.option_strings if opt in wanted}
    assert set(seen) == wanted and all(seen.values())


def test_a_solo_segment_as_long_as_the_run_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(
        ["load", "--scenario", "fair-share", "--duration", "20", "--solo", "20"]
    )
    assert _load_cli.run(args) == 2
    assert "--solo must end before --duration" in capsys.readouterr().err


def test_the_load_tests_policy_puts_the_flood_in_a_tenant_of_its_own() -> None:
    """The phase measures the guard's fair queue between two tenants: the chat key and the
    flood key must be distinct tenants, neither rate-limited (a budget would decide instead)."""
    import hashlib

    import loadtests
    from guard.policy import load_policy
    from loadtests.target import BENIGN_KEY, FLOOD_KEY

    policy = load_policy(str(Path(loadtests.__file__).with_name("policy.yaml")))
    by_digest = {entry.digest: entry for entry in policy.keys}
    chat, flood = (
        by_digest[hashlib.sha256(k.encode()).hexdigest()] for k in (BENIGN_KEY, FLOOD_KEY)
    )
    assert (chat.tenant, flood.tenant) == ("benign", "flood")
    for entry in (chat, flood):
        rate = policy.rate_for(entry)  # what is in force: overrides over the defaults
        assert rate.requests_per_minute is None and rate.tokens_per_minute is None
        assert rate.per_key_concurrency >= 64  # room for the flood's streams and the chats
    attacker = policy.rate_for(by_digest[hashlib.sha256(b"sk-load-attacker").hexdigest()])
    assert attacker.tokens_per_minute is not None  # limited: so the check above can fail

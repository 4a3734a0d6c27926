"""The fuzz core: oracle verdicts (in the worker and in process), restarts, dedup."""

from __future__ import annotations

from pathlib import Path

import pytest

from fuzz._worker import ExecStatus, RawResult
from fuzz.findings import FindingSet, cause_of, record
from fuzz.oracle import Oracle, classify
from fuzz.targets import REGISTRY, Budgets, Cost, get_target

COMMANDS = "tests._fuzz_targets:Commands"


@pytest.fixture(scope="module")
def oracle() -> Oracle:
    o = Oracle(COMMANDS, isolate=True)
    yield o
    o.close()


def test_registry_has_the_issue_targets() -> None:
    for name in (
        "placeholder-vulnerable",
        "placeholder-hardened",
        "chat-template-vulnerable",
        "chat-template-hardened",
        "guard-pipeline",
        "guard-app",
        "scheduler-state",
    ):
        t = get_target(name)
        assert t.name == name and t.seeds() and t.budgets.wall_s > 0
    kinds = {t.kind for t in REGISTRY.values()}
    assert {"vulnerable", "hardened", "guard", "state"} <= kinds
    with pytest.raises(KeyError):
        get_target("no-such-target")


@pytest.mark.parametrize(
    ("command", "verdict", "cause"),
    [
        (b"ok", "ok", None),
        (b"reject", "rejected", None),
        (b"crash", "crash", "crash:KeyError:tests/_fuzz_targets.py:35:execute"),
        (b"steps", "budget", "budget:steps"),
        (b"big", "budget", "memory"),
        (b"oom", "oom", "memory"),
        (b"spin", "timeout", "time"),
        (b"sleep", "timeout", "time"),  # no CPU used: the wall-clock kill from the oracle
        (b"segv", "crash", "crash:SIGSEGV:signal:SIGSEGV"),
        (b"exit", "crash", "crash:WorkerExit:exit:3"),
    ],
)
def test_oracle_verdicts_in_the_worker(
    oracle: Oracle, command: bytes, verdict: str, cause: str | None
) -> None:
    out = oracle.run(command)
    assert out.verdict == verdict, out
    assert out.is_finding == (cause is not None)
    if cause is not None:
        if cause.startswith("crash:KeyError"):
            assert cause_of(out).startswith("crash:KeyError:tests/_fuzz_targets.py:")
        else:
            assert cause_of(out) == cause
    if command == b"big":
        assert out.cost.peak_mem_bytes >= 90 << 20  # the 100 MiB block was measured
    if command == b"reject":
        assert out.error_code == "synthetic_rejection"
    # Whatever happened, the next input runs (the worker is restarted when it died).
    assert oracle.run(b"ok").verdict == "ok"


def test_a_batch_survives_kills_and_keeps_order(oracle: Oracle) -> None:
    before = oracle.restarts
    outs = oracle.run_batch([b"ok", b"spin", b"aa", b"segv", b"oom", b"reject", b"aaa"])
    assert [o.verdict for o in outs] == ["ok", "timeout", "ok", "crash", "oom", "rejected", "ok"]
    assert outs[2].cost.steps == 4 and outs[6].cost.steps == 9
    assert oracle.restarts >= before + 3


def test_a_batch_stops_at_its_time_limit(oracle: Oracle) -> None:
    outs = oracle.run_batch([b"ok", b"spin", b"ok", b"ok"], time_limit_s=0.05)
    assert 1 <= len(outs) < 4
    assert oracle.run(b"ok").verdict == "ok"


def test_in_process_oracle() -> None:
    with Oracle("tests._fuzz_targets:GuardCommands", isolate=False) as o:
        outs = o.run_batch([b"ok", b"reject", b"crash", b"steps", b"aaaa"])
    assert [x.verdict for x in outs] == ["ok", "rejected", "crash", "budget", "ok"]
    assert outs[4].cost.steps == 16 and outs[0].cost.cpu_s >= 0


def test_classify_precedence_and_cost_per_byte() -> None:
    b = Budgets(wall_s=1.0, mem_bytes=1 << 20, steps=100, cost_per_byte=0.5)
    raw = RawResult(ExecStatus.REJECTED, 0.01, 0.01, 2 << 20, 1000, 0, "GuardError", "m", None, "c")
    assert classify(raw, b, 10).where == "budget:mem_bytes"  # a slow rejection is a finding
    raw = RawResult(ExecStatus.OK, 2.0, 0.01, 0, 0, 0)
    assert classify(raw, b, 10).verdict == "ok"  # wall time alone (machine busy) is not
    raw = RawResult(ExecStatus.OK, 0.05, 0.05, 0, 0, 0)  # 50 ms for a small input
    out = classify(raw, b, 10)
    assert out.verdict == "cost_per_byte" and cause_of(out) == "cost_per_byte"
    assert classify(raw, b, 1000).verdict == "ok"  # the same over 1000 bytes is fine
    assert Cost(time_s=0.001, steps=1000).scalar() == pytest.approx(2.0)


def test_record_minimises_dedups_and_saves(tmp_path: Path) -> None:
    target = get_target("tests._fuzz_targets:Squares")
    seen = FindingSet()
    with Oracle(target.name, isolate=False) as o:
        data = b"xa" * 150
        out = o.run(data)
        assert out.verdict == "budget" and cause_of(out) == "budget:steps"
        f = record(target, data, out, "test", oracle=o, seen=seen, found_after_s=1.0)
        assert f is not None and f.data == b"a" * 101 and f.minimised
        assert f.cost_before.steps == 150 * 150 and f.cost_after.steps == 101 * 101
        # The same cause again is a duplicate, whatever the input.
        again = o.run(b"a" * 200)
        assert (
            record(target, b"a" * 200, again, "test", oracle=o, seen=seen, found_after_s=2.0)
            is None
        )
    assert len(seen) == 1


def test_record_saves_a_payload_that_replays(tmp_path: Path) -> None:
    from fuzz.replay import replay_paths
    from payloads import load_payload

    target = get_target("placeholder-hardened")
    seen = FindingSet()
    with Oracle(target.name, isolate=True) as o:
        # Not a real finding of the hardened engine: a verdict forged to exercise saving.
        data = b"{{a}}\0a=xyz"
        out = o.run(data)
        forged = type(out)("crash", out.cost, "Forged", "forged", "x.py:1:f")
        f = record(
            target,
            data,
            forged,
            "test",
            oracle=o,
            seen=seen,
            found_after_s=0.5,
            minimise=False,
            save_root=tmp_path,
        )
    assert f is not None and f.path is not None
    payload = load_payload(Path(f.path))
    assert payload.finding is not None and payload.finding.cause == f.cause
    assert payload.cost is not None and "wall_s" in payload.cost.before
    [result] = replay_paths([Path(f.path)])
    assert result.outcome is not None and result.outcome.verdict == "ok"
    assert result.reproduced is False


def test_in_process_soft_timeout_does_not_kill_the_caller() -> None:
    # SIGPROF's default action terminates the process: the oracle installs its own handler.
    with Oracle("tests._fuzz_targets:GuardCommands", isolate=False) as o:
        out = o.run(b"spin")
        assert out.verdict == "timeout" and out.cost.cpu_s >= 0.15
        assert o.run(b"ok").verdict == "ok"

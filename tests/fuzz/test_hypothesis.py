"""The hypothesis engine: grammar strategies, hardened targets under property tests, campaigns.

Hardened, guard and state targets bound themselves, so their properties run in process (the
oracle's ``isolate=False``); the vulnerable target runs only in the oracle's limited worker.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from fuzz import EngineRun, Oracle, Outcome, Progress, RunOptions
from fuzz import strategies as grammar
from fuzz.engines import hypothesis_engine as he
from fuzz.targets import REGISTRY, get_target
from fuzz.targets.gateway import split_request
from fuzz.targets.templates import split_placeholder_input

FAST = settings(
    max_examples=30, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
GATED = sorted(n for n, t in REGISTRY.items() if t.kind in ("hardened", "guard"))


def _no_finding(data: bytes, outcome: Outcome) -> None:
    assert not outcome.is_finding, (outcome.cause, outcome.cost, data[:300])


@pytest.fixture(scope="module")
def oracles() -> Iterator[dict[str, Oracle]]:
    made: dict[str, Oracle] = {}
    yield made
    for o in made.values():
        o.close()


def _oracle(oracles: dict[str, Oracle], name: str) -> Oracle:
    if name not in oracles:
        oracles[name] = Oracle(name, isolate=False)
    return oracles[name]


# ------------------------------------------------------------------------------ strategies


@FAST
@given(grammar.request_bodies())
def test_request_bodies_are_openai_shaped_json(body: dict[str, object]) -> None:
    assert body["model"] == "schedguard-ref"
    assert ("messages" in body) != ("prompt" in body)
    assert json.loads(json.dumps(body)) == body


@FAST
@given(he.strategy_for(get_target("placeholder-hardened")))
def test_placeholder_inputs_are_in_the_target_format(data: bytes) -> None:
    template, variables = split_placeholder_input(data)
    assert len(template.encode("utf-8", "surrogatepass")) <= 1024
    assert all(isinstance(v, str) for v in variables.values())


@FAST
@given(he.strategy_for(get_target("guard-pipeline")))
def test_guard_inputs_name_their_route(data: bytes) -> None:
    req = split_request(data)
    assert req.path in ("/v1/chat/completions", "/v1/completions")


@FAST
@given(grammar.jinja_chat_templates())
def test_chat_templates_mostly_compile(source: str) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    # Compiling (not rendering) is cheap for these: the grammar is well-formed by construction
    # except where clipping cut a block in half.
    try:
        ImmutableSandboxedEnvironment().parse(source)
    except TemplateSyntaxError:
        assert len(source) == 2048


def test_scheduler_ops_encode_operands() -> None:
    assert grammar.scheduler_op(grammar.SUBMIT, 1, 2, 3) == b"\x00\x01\x02\x03"
    assert grammar.scheduler_op(grammar.URGENT, 300, 2) == b"\x03\x2c\x02"
    assert grammar.scheduler_op(grammar.TICK, 7) == b"\x04\x07"


# ---------------------------------------------------------------- hardened targets: no finding


@pytest.mark.parametrize("name", GATED)
def test_hardened_targets_never_produce_a_finding(name: str, oracles: dict[str, Oracle]) -> None:
    target = get_target(name)
    oracle = _oracle(oracles, name)
    prop = he.make_property(target, oracle.run, _no_finding)
    settings(FAST, max_examples=25)(prop)()


def test_scheduler_state_machine_keeps_its_invariants(oracles: dict[str, Oracle]) -> None:
    oracle = _oracle(oracles, "scheduler-state")
    machine = he.scheduler_machine(oracle.run, _no_finding)
    machine.TestCase.settings = settings(FAST, max_examples=10, stateful_step_count=20)
    machine.TestCase().runTest()


def test_fuzz_one_input_runs_the_property_on_raw_bytes() -> None:
    # What atheris calls: libFuzzer's bytes become Hypothesis's choices.
    fuzz_one_input = he.fuzz_one_input_for(get_target("placeholder-hardened"))
    for data in (b"", b"\x00" * 16, bytes(range(256)), b"\xff" * 64):
        fuzz_one_input(data)


# ----------------------------------------------------------------------------- campaign engine


def test_campaign_on_hardened_target_reports_execs_and_no_finding(tmp_path: Path) -> None:
    name = "chat-template-hardened"
    progress: list[Progress] = []
    run = EngineRun(
        get_target(name),
        lambda: Oracle(name, isolate=False),
        RunOptions(duration_s=120, out_dir=tmp_path, seed=5, max_execs=200),
        on_progress=progress.append,
    )
    result = he.run_engine(run, round_examples=100)
    assert result.findings == [] and result.time_to_first_finding_s is None
    assert result.execs > 10 and result.extra["rounds"] >= 1
    assert result.best_cost_over_time and result.best_cost_over_time[-1][1] > 0
    assert progress and progress[-1].execs == result.execs


def test_campaign_on_vulnerable_target_finds_and_minimises(tmp_path: Path) -> None:
    name = "placeholder-vulnerable"
    run = EngineRun(
        get_target(name),
        lambda: Oracle(name),  # the limited worker: this target exhausts memory and time
        RunOptions(duration_s=25, out_dir=tmp_path, seed=1, minimise_s=5, stop_on_first=True),
    )
    result = he.run_engine(run)
    assert result.findings, result.extra
    finding = result.findings[0]
    assert finding.engine == "hypothesis" and finding.outcome.is_finding
    assert finding.size_bytes <= len(finding.original) and finding.size_bytes <= 512
    assert result.time_to_first_finding_s is not None

"""``backend-llamacpp-grammar`` (issue 24 item 5): the judge (the guard's GBNF verdict against
what llama.cpp did), the forked build's classification of a child's death, the GBNF mutations,
the missing-venv line; then the real llama.cpp in the isolated worker when llama-cpp-python is
set up (``scripts/upstreams/upstreams.py setup llamacpp``).

Decisions only: the builds' limits are the target's, nothing asserts speed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from fuzz.oracle import Oracle
from fuzz.targets import _llamacpp_build as lb
from fuzz.targets import get_target
from fuzz.targets import llamacpp_grammar as lg
from fuzz.targets._gbnf_mutate import gbnf_mutate, rule_names
from guard.errors import GuardError

NAME = "backend-llamacpp-grammar"
HAVE = lb.locate().problem is None
needs_llamacpp = pytest.mark.skipif(
    not HAVE, reason=f"llama-cpp-python is not set up here: {lb.locate().problem}"
)
INVALID = GuardError("guided_grammar_invalid", "llama.cpp cannot parse this grammar: x")
ARITHMETIC = (
    b'root  ::= (expr "=" ws term "\\n")+\nexpr  ::= term ([-+*/] term)*\n'
    b'term  ::= ident | num | "(" ws expr ")" ws\nident ::= [a-z] [a-z0-9_]* ws\n'
    b"num   ::= [0-9]+ ws\nws    ::= [ \\t\\n]*\n"
)
# llama.cpp's arithmetic grammar less one literal: left recursion through the nullable ws.
HIDDEN_LEFT = ARITHMETIC.replace(b'| "(" ws expr', b"|  ws expr")


def accepted(**kw: Any) -> lb.BuildOutcome:
    return lb.BuildOutcome("accepted", **kw)


# ---- the judge ------------------------------------------------------------------------------


def test_admitted_grammars_that_hurt_llama_cpp_are_findings() -> None:
    def name(out: lb.BuildOutcome, size: int = 100) -> str | None:
        return lg.judge(None, out, size).finding

    assert name(lb.BuildOutcome("rejected", log="error parsing grammar: x")) == (
        "GuardAdmits_rejected"
    )
    assert name(lb.BuildOutcome("signal", phase="build", signal="SIGSEGV")) == (
        "GuardAdmits_SIGSEGV_build"
    )
    assert name(lb.BuildOutcome("signal", phase="accept", signal="SIGABRT")) == (
        "GuardAdmits_SIGABRT_accept"
    )
    assert name(lb.BuildOutcome("memory", phase="build")) == "GuardAdmits_memory_build"
    assert name(lb.BuildOutcome("time", phase="apply")) == "GuardAdmits_time_apply"
    assert name(accepted(build_cpu_s=1.5), 32000) == "GuardAdmits_over_budget_build"
    assert name(accepted(peak_bytes=300 << 20)) == "GuardAdmits_memory_over_budget"
    assert name(accepted(mask_cpu_s=0.2)) == "GuardAdmits_over_budget_mask"
    # cost per byte: 0.2 s is too much for 100 bytes, not for 32,000
    assert name(accepted(build_cpu_s=0.2), 100) == "GuardAdmits_superlinear_build"
    assert name(accepted(build_cpu_s=0.2), 32000) is None
    assert name(accepted(build_cpu_s=0.01), 10) is None  # under the floor: fork noise
    assert name(accepted(build_cpu_s=0.001, walked=8)) is None


def test_refusals_are_compared_only_when_they_claim_llama_cpp_cannot_parse() -> None:
    ok = accepted(build_cpu_s=0.001, walked=3)
    verdict = lg.judge(INVALID, ok, 50)
    assert verdict.finding == "GuardRefuses_accepted"
    assert "guided_grammar_invalid" in verdict.message and "builds it" in verdict.message
    # llama.cpp refusing, crashing or exhausting memory agrees with the refusal
    for out in (
        lb.BuildOutcome("rejected"),
        lb.BuildOutcome("memory", phase="build"),
        lb.BuildOutcome("signal", signal="SIGSEGV"),
        accepted(build_cpu_s=1.5),
    ):
        assert lg.judge(INVALID, out, 50).finding is None
    # a cost refusal is the policy's budget; a <text> token is refused knowingly
    assert lg.judge(GuardError("guided_grammar_too_large", "big"), ok, 50).finding is None
    text_token = GuardError(
        "guided_grammar_invalid", "llama.cpp cannot parse this grammar: a token given by its text"
    )
    assert lg.judge(text_token, ok, 50).finding is None


def test_a_harness_failure_is_not_judged() -> None:
    with pytest.raises(RuntimeError, match="harness"):
        lg.judge(None, lb.BuildOutcome("error", log="harness: boom"), 10)


def test_llama_cpp_reason_is_read_from_its_log() -> None:
    assert lb.BuildOutcome(
        "rejected", log="parse: error parsing grammar: expecting ::= at o\n\no"
    ).reason() == ("expecting ::= at o")
    abort = "terminate called after throwing an instance of 'std::bad_alloc'\n  what():  std::bad_alloc\n"
    assert lb.BuildOutcome("memory", log=abort).reason() == "std::bad_alloc"
    left = "unsupported grammar, left recursion detected for nonterminal at index 0\n"
    assert "left recursion" in lb.BuildOutcome("rejected", log=left).reason()


# ---- the forked build's classification, on a stand-in for llama.cpp -------------------------


class _FakeLib:
    """``llama_sampler_init_grammar`` doing what the grammar text names."""

    def llama_sampler_init_grammar(self, vocab: object, grammar: bytes, root: bytes) -> int:
        if grammar == b"segv":
            os.kill(os.getpid(), signal.SIGSEGV)
        if grammar == b"bad_alloc":
            os.write(2, b"terminate called after throwing an instance of 'std::bad_alloc'\n")
            os.abort()
        if grammar == b"spin":
            while True:
                pass
        if grammar == b"sleep":
            time.sleep(60)
        if grammar == b"hog":
            return len(bytearray(1 << 30))
        if grammar == b"reject":
            os.write(2, b"parse: error parsing grammar: nope\n")
            return 0
        return 1

    def llama_sampler_accept(self, sampler: int, token: int) -> None:
        if token == 7:
            os.abort()


class _FakeEnv:
    def __init__(self, allowed: list[int]) -> None:
        self.lib = _FakeLib()
        self.vocab = None
        self.eog = frozenset({1})
        self._allowed = allowed

    def allowed(self, sampler: object) -> list[int]:
        return self._allowed


LIMITS = lb.BuildLimits(cpu_s=1, mem_bytes=64 << 20, wall_s=1.5, walk_steps=4)


def _build(
    grammar: bytes, allowed: list[int] | None = None, limits: lb.BuildLimits = LIMITS
) -> lb.BuildOutcome:
    env = cast(lb.LlamaCppGrammar, _FakeEnv([5, 6] if allowed is None else allowed))
    return lb.build(env, grammar, limits)


def test_build_classifies_how_the_child_ended() -> None:
    ok = _build(b"ok")
    assert (ok.status, ok.walked) == ("accepted", 4)
    assert _build(b"ok", allowed=[1]).walked == 0  # only end-of-generation: the walk ends
    rejected = _build(b"reject")
    assert rejected.status == "rejected" and rejected.reason() == "nope"
    segv = _build(b"segv")
    assert (segv.status, segv.signal, segv.phase) == ("signal", "SIGSEGV", "build")
    assert _build(b"bad_alloc").status == "memory"
    assert _build(b"hog").status == "memory"  # MemoryError under the child's address cap
    # (the wall clock far away: a loaded machine gives a spinning child its CPU second late)
    spin = _build(b"spin", limits=replace(LIMITS, wall_s=120))
    assert (spin.status, spin.signal) == ("time", "SIGXCPU")
    assert _build(b"sleep").status == "starved"  # killed at the wall clock without using CPU
    aborted = _build(b"ok", allowed=[7])
    assert (aborted.status, aborted.signal, aborted.phase) == ("signal", "SIGABRT", "accept")


# ---- mutations, payloads, registration --------------------------------------------------------


def test_mutations_are_bounded_deterministic_and_structural() -> None:
    seed = ARITHMETIC
    donors = [seed.decode()]

    def run(n: int) -> list[bytes]:
        rng = random.Random(5)
        out, data = [], seed
        for _ in range(n):
            data = gbnf_mutate(data, 1024, rng, donors)
            assert len(data) <= 1024
            out.append(data)
        return out

    first = run(300)
    assert first == run(300)
    texts = [d.decode("utf-8", "replace") for d in first]
    assert any(len(rule_names(t)) > len(rule_names(seed.decode())) for t in texts)  # new rules
    assert any("{" in t for t in texts)  # counted repetitions
    assert rule_names("root ::= a\na-b ::= x\n") == ["root", "a-b"]


def test_payload_round_trip_and_registration() -> None:
    t = get_target(NAME)
    assert t.kind == "guard" and t.isolate_by_default and t.budgets.wall_s == 1.0
    body, endpoint = t.payload_body(ARITHMETIC)
    assert endpoint == "/v1/completions" and json.loads(body)["grammar"] == ARITHMETIC.decode()
    assert t.input_from_payload(body, endpoint) == ARITHMETIC
    assert t.input_from_payload(b'{"prompt": "x"}', endpoint) is None
    assert any(s == HIDDEN_LEFT for s in t.seeds())  # the corpus' attack is a seed


def test_missing_venv_says_so_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SCHEDGUARD_UPSTREAMS_DIR", str(tmp_path))
    t = lg.LlamaCppGrammarBackend()
    assert not t.available()
    msg = t.missing_message()
    assert "\n" not in msg and "upstreams.py setup llamacpp" in msg


# ---- the real llama.cpp, in the isolated worker ------------------------------------------------


class Unguarded(lg.LlamaCppGrammarBackend):
    """The target with the guard admitting everything: llama.cpp's own failures, judged."""

    name = "tests.fuzz.test_llamacpp_grammar:Unguarded"

    def verdict(self, data: bytes) -> GuardError | None:
        return None


class RefuseAll(lg.LlamaCppGrammarBackend):
    """The target with the guard calling every grammar unparsable: false refusals, judged."""

    name = "tests.fuzz.test_llamacpp_grammar:RefuseAll"

    def verdict(self, data: bytes) -> GuardError | None:
        return INVALID


@needs_llamacpp
def test_the_guard_and_llama_cpp_agree_on_the_corpus_cases() -> None:
    with Oracle(NAME, isolate=True) as o:
        benign = o.run(ARITHMETIC)
        cost = o.run(b'root ::= "a"{2001}\n')
        hidden = o.run(HIDDEN_LEFT)
    assert benign.verdict == "ok", benign.summary()
    assert cost.verdict == "rejected" and cost.error_code == "guided_grammar_too_large"
    # the guard refuses it as unparsable; llama.cpp accepts it and runs out of memory: agreed
    assert hidden.verdict == "rejected", hidden.summary()
    assert hidden.error_code in ("guided_grammar_invalid", "llamacpp_build_starved")


@needs_llamacpp
def test_llama_cpp_failures_become_findings_in_the_worker() -> None:
    with Oracle(Unguarded.name, isolate=True) as o:
        unparsable = o.run(b"o")
        hidden = o.run(HIDDEN_LEFT)
        fine = o.run(ARITHMETIC)
    assert unparsable.is_finding and unparsable.error_type == "GuardAdmits_rejected"
    assert "expecting ::=" in (unparsable.error_message or "")
    assert hidden.is_finding and hidden.error_type == "GuardAdmits_memory_build", hidden.summary()
    assert fine.verdict == "ok"
    with Oracle(RefuseAll.name, isolate=True) as o:
        false_refusal = o.run(ARITHMETIC)
        agreed = o.run(b"o")
    assert false_refusal.error_type == "GuardRefuses_accepted"
    assert agreed.verdict == "rejected"


@needs_llamacpp
def test_a_brief_campaign_runs(tmp_path: Path) -> None:
    from fuzz import CampaignOptions, run_campaign

    report = run_campaign(
        CampaignOptions(
            target=NAME,
            duration_s=30,
            max_execs=40,
            seed=3,
            out_dir=tmp_path,
            save=False,
            minimise_s=2,
            progress=None,
        )
    )
    doc = json.loads((tmp_path / "report.json").read_text())
    assert doc["execs"] > 0
    assert not any(r.extra.get("errors") for r in report.results)
    # every finding is one of the judge's classes, never the harness failing
    assert all(str(f.cause).startswith("crash:Guard") for f in report.findings), [
        f.cause for f in report.findings
    ]

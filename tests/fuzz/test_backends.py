"""The structured-output backend fuzz targets (issue 16): input format, the guard's verdict as
the documented rejection, the real backends in the isolated worker, the missing-extra line.

Decisions only (verdicts, rejections); budgets are the targets' own, nothing asserts speed.
outlines-core and llguidance come with the dev extra; xgrammar (torch) is skipped when absent.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from fuzz.oracle import Oracle
from fuzz.targets import BACKEND_TARGETS, get_target
from fuzz.targets._upstream_venv import findable
from fuzz.targets.backends import (
    OutlinesBackend,
    XgrammarBackend,
    join_input,
    split_input,
)
from fuzz.targets.backends_corpus import BENIGN, ROUTED_324
from guard.errors import GuardError
from guard.guided import GuidedLimits

HAVE = {m: importlib.util.find_spec(m) is not None for m in ("outlines_core", "llguidance")}
# xgrammar from the main venv, or vLLM's from the upstream scripts' venv (fuzz worker only)
HAVE_XGR = findable("xgrammar")
needs_outlines = pytest.mark.skipif(not HAVE["outlines_core"], reason="outlines_core missing")
needs_guidance = pytest.mark.skipif(not HAVE["llguidance"], reason="llguidance missing")


def test_names_resolve_outside_the_registry() -> None:
    for name in BACKEND_TARGETS:
        if name == "backend-diff":  # the backends compared, not the guard (test_backends_diff)
            continue
        t = get_target(name)
        assert t.name == name and t.kind == "guard" and t.isolate_by_default
        assert t.seeds() and t.budgets.wall_s == 1.0 and t.budgets.mem_bytes == 256 << 20


def test_input_format_round_trips() -> None:
    for _, kind, spec in BENIGN:
        assert split_input(join_input(kind, spec)) == (kind, spec)
    assert split_input(b"(a|b)*") == ("regex", "(a|b)*")
    assert split_input(b"json\n{not json") == ("json", None)
    t = OutlinesBackend()
    data = join_input("json", ROUTED_324)
    body, endpoint = t.payload_body(data)
    assert endpoint == "/v1/chat/completions"
    assert json.loads(body)["response_format"]["json_schema"]["schema"] == ROUTED_324
    assert t.input_from_payload(body, endpoint) == data
    rx = join_input("regex", "(a|b)*a")
    assert t.input_from_payload(t.payload_body(rx)[0], endpoint) == rx


def test_missing_backend_says_so_in_one_line() -> None:
    msg = XgrammarBackend().missing_message()
    assert "\n" not in msg and "pip install 'schedguard[backends-xgrammar]'" in msg
    assert "schedguard[backends]" in OutlinesBackend().missing_message()


@needs_outlines
def test_guard_refusal_is_the_documented_rejection_outlines() -> None:
    t = get_target("backend-outlines")
    with pytest.raises(GuardError) as info:
        t.execute(join_input("regex", "(a|b)*a(a|b){20}"))
    assert info.value.code == "guided_backend_cost_exceeded"
    assert info.value.message.startswith("outlines:")
    # a benign one is admitted and compiled
    assert t.execute(join_input("regex", r"\d{4}-\d{2}-\d{2}")).steps >= 0


@needs_guidance
def test_guidance_compiles_lark_and_schemas() -> None:
    t = get_target("backend-guidance")
    t.execute(join_input("grammar", 'start: "yes" | "no"'))
    t.execute(join_input("json", {"type": "object", "properties": {"a": {"type": "integer"}}}))


class UnguardedOutlines(OutlinesBackend):
    """The outlines target with the guard's backend check off: what it refuses, compiled."""

    name = "tests.fuzz.test_backends:UnguardedOutlines"

    def _ensure(self) -> object:
        env = super()._ensure()
        self._limits = GuidedLimits(backends=())
        return env


@needs_outlines
def test_worker_contains_a_real_blow_up() -> None:
    """The blow-up the guard refuses, run anyway: the worker (RLIMIT_AS, kill timer) turns it
    into a finding instead of taking the test process down."""
    with Oracle(UnguardedOutlines.name, isolate=True) as o:
        ok = o.run(join_input("regex", "[ab]{3}"))
        bad = o.run(join_input("regex", ".*x.{14}"))
    assert ok.verdict == "ok"
    assert bad.is_finding and bad.verdict in ("timeout", "oom", "budget", "crash"), bad.cause


@pytest.mark.skipif(not HAVE_XGR, reason="xgrammar (torch) not installed, nor vLLM set up")
def test_xgrammar_compiles_what_the_guard_admits() -> None:
    # In the worker: xgrammar may be vLLM's, imported with torch from its venv.
    with Oracle("backend-xgrammar", isolate=True) as o:
        assert o.run(join_input("regex", r"\d{4}-\d{2}-\d{2}")).verdict == "ok"
        # over the guard's repeat product: refused before xgrammar sees it
        refused = o.run(join_input("regex", "(a{100}){100}"))
    assert refused.verdict == "rejected", refused.summary()

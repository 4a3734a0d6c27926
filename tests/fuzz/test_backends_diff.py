"""``backend-diff`` (issue 24 item 5): the structured-output backends compared on the strings a
constraint accepts, the reference naming the faulted backend, the missing-backend line.

The backends run only in the oracle's isolated worker; the planted disagreement is a target
subclass the worker loads by name. Decisions only, nothing asserts speed.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from fuzz.oracle import Oracle
from fuzz.targets import backends_diff as bd
from fuzz.targets import get_target
from fuzz.targets._upstream_venv import findable
from fuzz.targets.backends import join_input

HAVE_TWO = sum(findable(m) for m, _ in bd.BACKENDS.values()) >= 2
needs_two = pytest.mark.skipif(not HAVE_TWO, reason="fewer than two backends installed")


def _inverted(accepts: Callable[[Any, str], bool]) -> Callable[[Any, str], bool]:
    return lambda compiled, text: not accepts(compiled, text)


class InvertedGuidance(bd.DiffBackends):
    """The target with llguidance's answer inverted: every candidate is a disagreement."""

    name = "tests.fuzz.test_backends_diff:InvertedGuidance"

    def backends(self) -> list[Any]:
        fresh = self._backends is None
        out = super().backends()
        for b in out:
            if fresh and b.name == "guidance":  # once: backends() is called per input
                b.accepts = _inverted(b.accepts)  # type: ignore[method-assign,assignment]
        return out


def test_registered_and_not_failing_ci() -> None:
    t = get_target("backend-diff")
    assert t.name == "backend-diff" and t.isolate_by_default and t.kind == "vulnerable"
    assert t.seeds()


def test_candidates_are_few_deterministic_and_labelled() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "n": {"type": "integer", "maximum": 3}},
        "required": ["a", "n"],
    }
    got = bd.candidates("json", schema, [("outlines", '{"a":"","n":0}')])
    assert got == bd.candidates("json", schema, [("outlines", '{"a":"","n":0}')])
    assert 0 < len(got) <= bd.MAX_CANDIDATES
    assert len({text for _, text in got}) == len(got)
    by_origin = {origin: text for origin, text in reversed(got)}
    assert by_origin["instance"] == '{"a":"","n":0}'
    assert by_origin["extra_key"] == '{"a":"","n":0,"zz":0}'
    assert by_origin["dropped_key"] == '{"n":0}'
    assert '"n":4' in " ".join(t for o, t in got if o == "number")  # one past the maximum


def test_reference_judges_schemas_and_regexes() -> None:
    schema = {"type": "integer", "minimum": 0}
    assert bd.reference("json", schema, "3") is True
    assert bd.reference("json", schema, "-1") is False
    assert bd.reference("json", schema, "NaN") is False  # not JSON, though Python reads it
    assert bd.reference("regex", r"\d+", "12") is True
    assert bd.reference("regex", r"\d+", "12a") is False
    assert bd.reference("regex", "(", "") is None
    # a digit in newer Unicode tables than this Python's: not judged
    assert bd.reference("regex", r"\d", "\U0001ccf5") is None
    # \d \w \s \b: ASCII to xgrammar (ECMA-262, JSON Schema's dialect), Unicode to Python,
    # outlines-core and llguidance: a non-ASCII string under one is not judged either
    assert bd.reference("regex", r"\w+", "\u00e9tude") is None
    assert bd.reference("regex", r"\d3", "\uff143") is None
    assert bd.reference("regex", r"\w+", "etude") is True
    assert bd.reference("regex", r"[a-z\u00e9]+", "\u00e9tude") is True  # no shorthand
    assert bd.reference("regex", r"\\w+", "\\\u00e9") is False  # an escaped backslash, then w


def test_missing_backend_says_so_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bd, "_installed", lambda name: name != "xgrammar")
    msg = bd.DiffBackends().missing_message()
    assert "\n" not in msg
    assert "xgrammar" in msg and "pip install 'schedguard[backends-xgrammar]'" in msg
    assert msg.endswith("comparing outlines, guidance")
    monkeypatch.setattr(bd, "_installed", lambda name: True)
    assert bd.DiffBackends().missing_message() == ""
    monkeypatch.setattr(bd, "_installed", lambda name: name == "outlines")
    assert not bd.DiffBackends().available()


@needs_two
def test_backends_agree_on_simple_constraints() -> None:
    with Oracle("backend-diff", isolate=True) as o:
        for kind, spec in (("json", {"type": "boolean"}), ("regex", "(yes|no)")):
            out = o.run(join_input(kind, spec))
            assert out.verdict == "ok", out.summary()
            assert out.cost.steps > 1  # candidates were asked, not skipped
        # not a kind the target compares: the documented rejection
        assert o.run(join_input("grammar", 'root ::= "a"')).verdict == "rejected"


@needs_two
def test_planted_disagreement_is_a_finding_with_what_reproduces_it() -> None:
    schema = {"type": "boolean"}
    with Oracle(InvertedGuidance.name, isolate=True) as o:
        out = o.run(join_input("json", schema))
    assert out.is_finding and out.verdict == "crash", out.summary()
    # "false" is the minimal instance: guidance (inverted) rejects what the schema allows
    assert out.error_type == "Disagreement_guidance_rejects_valid_instance"
    detail = json.loads(out.error_message or "")
    assert detail["constraint"] == schema and detail["string"] == "false"
    assert detail["answers"]["guidance"] is False and True in detail["answers"].values()
    assert detail["reference"] is True


def test_reference_asserts_formats() -> None:
    """The backends generate to a format, so the reference holds a string to it too."""
    schema = {"type": "string", "format": "date-time"}
    assert bd.reference("json", schema, '"1970-01-01T00:00:00Z"') is True
    assert bd.reference("json", schema, '"0791-05-03T17:32:36"') is False  # no offset

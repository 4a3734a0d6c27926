"""guard.template_scan: depth and balance of {{ }} delimiters, linear, stopping at the first fault."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import guard.template_scan as template_scan
from guard.budget import Budget, Limits
from guard.errors import LimitExceeded, TemplateError
from guard.template_scan import (
    MAX_REGEX_DEPTH,
    TEMPLATE_DEPTH_EXCEEDED,
    TEMPLATE_UNBALANCED,
    TemplateScan,
    _scan_loop,
    _scan_regex,
    check_template,
    scan_template,
)

SEED = "{{" * 1024 + "system_prompt}}" * 512


# ------------------------------------------------------------------------------ tokenisation


@pytest.mark.parametrize(
    ("text", "depth", "placeholders"),
    [
        ("", 0, 0),
        ("plain text, no braces", 0, 0),
        ("{ {", 0, 0),  # separated braces are text
        ('{"a": 1} and { b }', 0, 0),
        ("{{a}}", 1, 1),
        ("{{{a}}}", 1, 1),  # opener + "{a" ... closer + "}"
        ("{{{{a}}}}", 2, 2),  # runs of four split into two delimiters each
        ("{{ {{lang}}_greeting }}", 2, 2),
        ("{{a}}{{b}}{{c}}", 1, 3),
        ("{ }{{x}}", 1, 1),
        ("é{{日本}}ü", 1, 1),
    ],
)
def test_balanced_templates_report_depth_and_placeholders(
    text: str, depth: int, placeholders: int
) -> None:
    scan = check_template(text, max_depth=8)
    assert scan == TemplateScan(depth, placeholders)
    assert scan.ok


def test_leftmost_tokenisation_of_brace_runs() -> None:
    # "}}}" is a closer then a literal "}", so one trailing brace is fine and two are not.
    assert scan_template("{{a}}}", max_depth=8).ok
    stray = scan_template("{{a}}}}}", max_depth=8)
    assert (stray.error_code, stray.error_offset) == (TEMPLATE_UNBALANCED, 5)
    # "{{{" is an opener then a literal "{": still one unclosed opener, at offset 0.
    unclosed = scan_template("{{{", max_depth=8)
    assert (unclosed.error_code, unclosed.error_offset) == (TEMPLATE_UNBALANCED, 0)


# ----------------------------------------------------------------------------------- depth


def test_depth_limit_uses_the_budget_code_and_names_the_offset() -> None:
    with pytest.raises(LimitExceeded) as budget_error:
        Budget(Limits(max_depth=8)).check_depth(9)
    with pytest.raises(LimitExceeded) as scan_error:
        check_template(SEED, max_depth=8, param="prompt_template")
    err = scan_error.value
    assert err.code == budget_error.value.code == TEMPLATE_DEPTH_EXCEEDED
    assert err.param == "prompt_template"
    assert err.status == 400
    assert "byte offset 16" in err.message  # the ninth opener
    scan = scan_template(SEED, max_depth=8)
    assert (scan.max_depth, scan.placeholders, scan.error_offset) == (9, 9, 16)


def test_depth_exactly_at_the_limit_passes() -> None:
    text = "{{" * 8 + "x" + "}}" * 8
    assert check_template(text, max_depth=8).max_depth == 8
    with pytest.raises(LimitExceeded):
        check_template("{{" + text + "}}", max_depth=8)


def test_depth_zero_refuses_any_placeholder() -> None:
    assert check_template("no placeholders {", max_depth=0).ok
    assert scan_template("a{{b}}", max_depth=0).error_offset == 1


def test_depth_failure_inside_an_unclosed_region_wins_over_the_missing_closer() -> None:
    # The scan stops at the first limit crossed, reading left to right.
    text = "{{a}} {{ " + "{{" * 8 + "x"
    scan = scan_template(text, max_depth=8)
    assert scan.error_code == TEMPLATE_DEPTH_EXCEEDED
    assert scan.error_offset == 6 + 2 + 1 + 7 * 2


# -------------------------------------------------------------------------------- balance


def test_stray_closer_is_unbalanced_with_its_offset() -> None:
    with pytest.raises(TemplateError) as info:
        check_template("ok {{a}} then }} and more {{", max_depth=8, param="p")
    err = info.value
    assert not isinstance(err, LimitExceeded)
    assert err.code == TEMPLATE_UNBALANCED
    assert err.param == "p"
    assert "byte offset 14" in err.message


def test_unclosed_opener_reports_the_innermost_one_left_open() -> None:
    scan = scan_template("{{a}} {{b {{c}} {{d", max_depth=8)
    assert scan.error_code == TEMPLATE_UNBALANCED
    assert scan.error_offset == 16
    assert scan.placeholders == 4
    assert scan.max_depth == 2
    with pytest.raises(TemplateError, match="never closed"):
        scan.raise_for_error()


def test_offsets_are_utf8_bytes() -> None:
    scan = scan_template("é日}}", max_depth=8)
    assert scan.error_offset == len("é日".encode())


@pytest.mark.parametrize("limit", [2, None])
def test_every_fault_kind_reports_utf8_byte_offsets(limit: int | None) -> None:
    # A lone surrogate (JSON "\\udcfe") counts 3 bytes, as the engine's surrogatepass encoding.
    lead = "é日\udcfe(ÿ)"
    width = len(lead.encode("utf-8", "surrogatepass"))
    assert width == 2 + 3 + 3 + 1 + 2 + 1
    stray = scan_template(lead + "{{a}}}}", max_depth=limit)
    assert (stray.error_code, stray.error_offset) == (TEMPLATE_UNBALANCED, width + 5)
    unclosed = scan_template(lead + "{{é{{日}}", max_depth=limit)
    assert (unclosed.error_code, unclosed.error_offset) == (TEMPLATE_UNBALANCED, width)
    if limit is not None:
        deep = scan_template(lead + "{{é{{日{{", max_depth=limit)
        assert (deep.error_code, deep.error_offset) == (
            TEMPLATE_DEPTH_EXCEEDED,
            width + 2 + 2 + 2 + 3,
        )


@pytest.mark.parametrize("filler", ["x", "é", "日"])
def test_offsets_far_into_a_long_text(filler: str) -> None:
    # Past several 64 KiB blocks, so every level of the offset search takes part.
    lead = filler * 70_001 + "{{a}}" * 3_001
    width = len(lead.encode())
    for tail, code, at in [
        ("}}" + "{{}}" * 10, TEMPLATE_UNBALANCED, width),
        ("{{" * 8 + "{{" + "}}" * 9, TEMPLATE_DEPTH_EXCEEDED, width + 16),
        ("{{ " + "{{}}" * 40_000, TEMPLATE_UNBALANCED, width),
    ]:
        scan = scan_template(lead + tail, max_depth=8)
        assert (scan.error_code, scan.error_offset) == (code, at)
        assert scan == _scan_loop(lead + tail, 8)


def test_nested_json_closing_braces_are_a_stray_closer() -> None:
    # Documented limitation: a literal "}}" must be written "} }".
    assert scan_template('{"a": {"b": 1}}', max_depth=8).error_code == TEMPLATE_UNBALANCED
    assert scan_template('{"a": {"b": 1} }', max_depth=8).ok


def test_no_limit_checks_balance_only() -> None:
    deep = "{{" * 100 + "}}" * 100
    assert scan_template(deep) == TemplateScan(100, 100)
    assert scan_template(deep, max_depth=MAX_REGEX_DEPTH + 100) == TemplateScan(100, 100)
    assert scan_template("{{" * 100).error_code == TEMPLATE_UNBALANCED


def test_negative_limit_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        scan_template("x", max_depth=-1)


# ---------------------------------------------------------------------- regex == reference


_PIECES = st.sampled_from(
    ["{", "}", "{{", "}}", "{{{", "}}}", "a", " ", "é", "日", "\n", "(", ")", "ÿ", "\udcfe"]
)
# Long runs too: nesting past MAX_REGEX_DEPTH, and text spanning several offset-search blocks.
_LONG_PIECES = st.sampled_from(
    ["{", "}", "{{", "}}", "{{{", "}}}", "{{" * 12, "}}" * 12, "x" * 40, "é日" * 20, "\udcfe"]
)


@settings(max_examples=600, deadline=None)
@given(st.lists(_PIECES, max_size=40).map("".join), st.integers(0, 10))
def test_regex_scan_matches_the_reference_loop(text: str, depth: int) -> None:
    assert _scan_regex(text, depth) == _scan_loop(text, depth)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.one_of(_PIECES, _LONG_PIECES), max_size=60).map("".join),
    st.sampled_from([None, 0, 1, 2, 3, 8, MAX_REGEX_DEPTH, MAX_REGEX_DEPTH + 5]),
)
def test_scan_with_early_stop_probes_matches_the_reference_loop(
    text: str, depth: int | None
) -> None:
    # Tiny probes, so that faults are found in prefixes cut anywhere (mid-delimiter too).
    with (
        mock.patch.object(template_scan, "_FIRST_PROBE", 1),
        mock.patch.object(template_scan, "_PROBE_GROWTH", 2),
    ):
        assert scan_template(text, max_depth=depth) == _scan_loop(text, depth)
    assert scan_template(text, max_depth=depth) == _scan_loop(text, depth)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=60), st.integers(0, 4))
def test_any_text_scans_without_raising(text: str, depth: int) -> None:
    scan = scan_template(text, max_depth=depth)
    assert scan.ok == (scan.error_code is None)
    if scan.ok:
        assert scan.max_depth <= depth
        assert scan.placeholders == text.count("{{")
    else:
        assert scan.error_offset is not None
        assert 0 <= scan.error_offset <= len(text.encode("utf-8", "surrogatepass"))


def test_falls_back_to_the_loop_if_re2_gives_up() -> None:
    # RE2's Set answers None when its DFA runs out of memory (not seen with automata this small).
    class GaveUp:
        def Match(self, data: bytes) -> None:
            return None

    automata = dataclasses.replace(template_scan._automata(8), depths=GaveUp())
    with mock.patch.object(template_scan, "_automata", lambda depth: automata):
        for text in ["{{a}}", "{{a}} }} {{", "{{ {{b}}", "{{" * 9]:
            assert scan_template(text, max_depth=8) == _scan_loop(text, 8)


# ------------------------------------------------------------------------------- linearity


def _scanned_lengths(text: str, max_depth: int | None) -> tuple[TemplateScan, list[int]]:
    """The scan, and the length of every text (prefix) the regex path read."""
    lengths: list[int] = []
    scan_whole = template_scan._scan_whole

    def spy(part: str, depth: int) -> tuple[TemplateScan, bool]:
        lengths.append(len(part))
        return scan_whole(part, depth)

    with mock.patch.object(template_scan, "_scan_whole", spy):
        return scan_template(text, max_depth=max_depth), lengths


@pytest.mark.parametrize("lead", ["}}", "{{" * 9, "{{" * 4 + "x" * 5_000 + "}}" * 5])
def test_failure_stops_early_on_huge_input(lead: str) -> None:
    text = lead + "{{}}" * 2_000_000
    scan, lengths = _scanned_lengths(text, 8)
    assert sum(lengths) < 10_000  # a prefix or two, not 8 MB
    assert not scan.ok
    assert scan == _scan_loop(lead + "{{}}", 8)


def test_a_late_fault_is_found_reading_little_more_than_the_text() -> None:
    text = "{{}}" * 300_000 + "}}"
    scan, lengths = _scanned_lengths(text, 8)
    assert scan.error_offset == len(text) - 2
    assert lengths[-1] == len(text)
    assert sum(lengths) <= len(text) * 16 / 15


def test_no_limit_takes_the_loop_only_for_text_nesting_past_max_regex_depth() -> None:
    deep = "{{" * (MAX_REGEX_DEPTH + 1) + "}}" * (MAX_REGEX_DEPTH + 1)
    with mock.patch.object(template_scan, "_scan_loop", wraps=_scan_loop) as loop:
        assert scan_template("{{a}}" * 1000) == TemplateScan(1, 1000)
        assert scan_template(deep[2:-2]) == TemplateScan(MAX_REGEX_DEPTH, MAX_REGEX_DEPTH)
        assert loop.call_count == 0
        assert scan_template(deep) == TemplateScan(MAX_REGEX_DEPTH + 1, MAX_REGEX_DEPTH + 1)
        assert loop.call_count == 1

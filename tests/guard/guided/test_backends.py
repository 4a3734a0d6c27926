"""The backend-aware guided check (issue 16): vLLM 0.32's routing, each backend's cost bound,
nested schema bounds, and the Chat Completions spelling of custom-tool grammars.

Decisions only (codes, the backend named, routes); nothing here times anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fuzz.targets.backends_corpus import BENIGN, EXPENSIVE, ROUTED_324, request_body
from guard.errors import GuardError
from guard.guided import GuidedLimits, check_structured_outputs
from guard.guided.backends import (
    BACKEND_COST_CODE,
    guidance_cost,
    outlines_cost,
    reachable_backends,
    route_auto,
    trie_size,
    xgrammar_cost,
)
from guard.guided.regex import guidance_rejects_regex, xgrammar_rejects_regex
from guard.guided.schema import largest_bound_product
from tests._support import REPO_ROOT

DEFAULT = GuidedLimits()
CL100K = 100_277  # tiktoken's cl100k_base, the default tokenizer's vocabulary
ONLY = {b: GuidedLimits(backends=(b,)) for b in ("xgrammar", "guidance", "outlines")}
PLAIN_REGEXES = ["(a|b)*a(a|b){12}", "(a|b)*a(a|b){16}", "(a|b)*a(a|b){20}", "[ab]*a[ab]{18}"]


def refusal(
    body: dict[str, Any], limits: GuidedLimits = DEFAULT, *, vocab: int | None = None
) -> tuple[str, str] | None:
    """(code, backend or message head) of the refusal, or None when admitted; ``vocab`` the
    tokenizer's vocabulary size (None: the calibration vocabulary, 32,768)."""
    try:
        check_structured_outputs(body, limits, vocab=vocab)
    except GuardError as e:
        return e.code, e.message.split(":", 1)[0]
    return None


# ---- routing (vLLM 0.32 auto) ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "spec", "route"),
    [
        ("json", {"type": "string", "maxLength": 64}, "xgrammar"),
        ("json", {"type": "integer", "multipleOf": 3}, "guidance"),
        ("json", ROUTED_324, "outlines"),
        ("json", {"type": "object", "patternProperties": {"^x": {}}}, "xgrammar"),
        (
            "json",
            {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}},
            "outlines",
        ),
        ("json", {"type": "string", "format": "email", "maxLength": 5}, "guidance"),
        ("json", {"type": "array", "uniqueItems": True}, "reject"),
        ("regex", r"\d+", "xgrammar"),
        ("regex", "(?i)abc", "guidance"),
        ("regex", r"\p{L}+", "guidance"),
        ("regex", "a(?=b)", "reject"),
        ("regex", r"(a)\1", "reject"),
        ("grammar", 'root ::= "a"', "xgrammar"),
        ("choice", ["a", "b"], "xgrammar"),
    ],
)
def test_route_auto(kind: str, spec: Any, route: str) -> None:
    assert route_auto(kind, spec) == route


def test_regex_syntax_tables() -> None:
    assert xgrammar_rejects_regex("a*+") and not guidance_rejects_regex("a*+")
    assert xgrammar_rejects_regex("(?P<n>a)") and not guidance_rejects_regex("(?P<n>a)")
    assert guidance_rejects_regex(r"a\Z") and not xgrammar_rejects_regex(r"a\Z")
    assert guidance_rejects_regex("a^b") and not guidance_rejects_regex("(^a|^b)")
    assert xgrammar_rejects_regex("a{,3}") and guidance_rejects_regex("a{,3}")


def test_reachable_sets() -> None:
    # auto: xgrammar and guidance for everything (the sticky engine backend is either one);
    # outlines only for what auto routes there.
    assert reachable_backends("regex", "a+", DEFAULT) == (["xgrammar", "guidance"], False)
    assert reachable_backends("json", ROUTED_324, DEFAULT) == (
        ["xgrammar", "guidance", "outlines"],
        True,
    )
    assert reachable_backends("json", ROUTED_324, ONLY["xgrammar"]) == (["xgrammar"], False)
    assert reachable_backends("regex", "a+", ONLY["outlines"]) == (["outlines"], False)


# ---- the proof's decisions --------------------------------------------------------------------


@pytest.mark.parametrize(("cid", "kind", "spec"), BENIGN, ids=[c[0] for c in BENIGN])
def test_benign_admitted_under_default_and_xgrammar(cid: str, kind: str, spec: Any) -> None:
    body = request_body(kind, spec)
    assert refusal(body) is None
    assert refusal(body, ONLY["xgrammar"]) is None
    assert refusal(body, ONLY["guidance"]) is None


def test_benign_regexes_admitted_even_on_outlines() -> None:
    for _, kind, spec in BENIGN:
        if kind in ("regex", "choice"):
            assert refusal(request_body(kind, spec), ONLY["outlines"]) is None, spec


def test_routed_324_byte_schema_refused_by_default_naming_outlines() -> None:
    body = request_body("json", ROUTED_324)
    assert refusal(body) == (BACKEND_COST_CODE, "outlines")
    # bounding instead of refusing the fallback still refuses it: its string branch explodes
    assert refusal(body, GuidedLimits(outlines_fallback="bound")) == (BACKEND_COST_CODE, "outlines")
    assert refusal(body, ONLY["xgrammar"]) is None


@pytest.mark.parametrize("regex", PLAIN_REGEXES)
def test_plain_regexes_refused_on_outlines_admitted_on_xgrammar(regex: str) -> None:
    body = request_body("regex", regex)
    assert refusal(body, ONLY["outlines"]) == (BACKEND_COST_CODE, "outlines")
    assert refusal(body, ONLY["xgrammar"]) is None
    assert refusal(body) is None  # auto: the guard keeps the engine off outlines


@pytest.mark.parametrize("n", [16, 20, 64])
def test_bare_string_max_length_refused_on_outlines(n: int) -> None:
    body = request_body("json", {"type": "string", "maxLength": n})
    assert refusal(body, ONLY["outlines"]) == (BACKEND_COST_CODE, "outlines")
    assert refusal(body) is None
    # the same bound inside an object property is cheap: `:"` never occurs inside a string
    prop = {"type": "object", "properties": {"a": {"type": "string", "maxLength": n}}}
    assert refusal(request_body("json", prop), ONLY["outlines"]) is None


def test_expensive_inputs_refused_when_outlines_is_reachable() -> None:
    for cid, kind, spec in EXPENSIVE:
        if cid.startswith("re-nested"):
            continue
        got = refusal(request_body(kind, spec), ONLY["outlines"])
        assert got == (BACKEND_COST_CODE, "outlines"), cid


def test_xgrammar_per_token_mask_cliff() -> None:
    # (.{1,3}){5}: 0.18 s per decode token measured at 32k; the regex scan admits it
    body = request_body("regex", "(.{1,3}){5}")
    assert refusal(body, GuidedLimits(backends=())) is None
    assert refusal(body) == (BACKEND_COST_CODE, "xgrammar")
    assert xgrammar_cost("regex", "(.{1,3}){5}", 32768).mask_s > 0.05
    # narrow nested counts stay cheap per token
    assert xgrammar_cost("regex", "(a{0,5}){0,5}", 32768).mask_s < 0.05
    assert xgrammar_cost("regex", r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}", 32768).mask_s == 0


def test_xgrammar_wide_bounded_repetition() -> None:
    # one long string costs no more past ~400 characters (measured at cl100k_base: maxLength
    # 1000 5.7 s, 4000 4.7 s; estimated ~5 s): admitted, charged to the compile bucket
    for n in (1000, 2000, 4000):
        body = request_body("json", {"type": "object", "properties": {"t": {"maxLength": n}}})
        body["response_format"]["json_schema"]["schema"]["properties"]["t"]["type"] = "string"
        assert refusal(body, vocab=CL100K) is None, n
    one = xgrammar_cost("json", {"type": "string", "maxLength": 400}, CL100K).compile_s
    assert xgrammar_cost("json", {"type": "string", "maxLength": 4000}, CL100K).compile_s == one
    assert 4.5 < one < 5.5
    small = request_body("json", {"type": "string", "maxLength": 64})
    assert refusal(small, vocab=CL100K) is None


@pytest.mark.parametrize("vocab", [4096, 32_768, CL100K, 128_256, 262_144])
def test_the_ceiling_is_the_constraints_shape_whatever_the_vocabulary(vocab: int) -> None:
    # the xgrammar/guidance ceiling is on the estimate at 100,000 tokens: the same verdict
    # at every vocabulary (the bucket charges the model's); twelve distinct bounded strings
    # measured 29.5 s at cl100k_base
    assert refusal(request_body("json", {"type": "string", "maxLength": 1000}), vocab=vocab) is None
    over = request_body("json", _strings(list(range(101, 113))))
    assert refusal(over, vocab=vocab) == (BACKEND_COST_CODE, "xgrammar")


def test_vocabulary_scales_the_charged_estimate() -> None:
    from guard.guided.backends import check_constraint

    spec = {"type": "string", "maxLength": 280}
    at = {v: check_constraint("json", spec, ("x",), DEFAULT, vocab=v) for v in (32_768, CL100K)}
    assert 3.0 < at[CL100K] / at[32_768] < 3.1
    # vocab_size overrides the tokenizer's; unset and no tokenizer: the calibration vocabulary
    assert (
        check_constraint("json", spec, ("x",), GuidedLimits(vocab_size=32_768), vocab=CL100K)
        == (at[32_768])
    )
    assert check_constraint("json", spec, ("x",), DEFAULT) == at[32_768]
    assert GuidedLimits().vocabulary(None) == 32_768
    assert GuidedLimits().vocabulary(CL100K) == CL100K
    assert GuidedLimits(vocab_size=4096).vocabulary(CL100K) == 4096


def test_outlines_keeps_its_strict_ceiling() -> None:
    # the same estimate is under the xgrammar/guidance ceiling and over outlines' 1 s
    only_outlines = GuidedLimits(backends=("outlines",))
    body = request_body("regex", "(a|b)*a(a|b){12}")
    assert refusal(body, only_outlines, vocab=CL100K) == (BACKEND_COST_CODE, "outlines")
    assert refusal(body, vocab=CL100K) is None
    ceiling = GuidedLimits(backends=("outlines",), outlines_max_compile_s=1e6)
    assert refusal(request_body("regex", "[a-z]{3}@[a-z]{3}"), ceiling, vocab=CL100K) is None


def test_the_ceiling_is_per_backend_and_the_estimate_returned() -> None:
    from guard.guided.backends import check_constraint

    spec = {"type": "string", "maxLength": 100}
    cold = check_constraint("json", spec, ("x",), DEFAULT, vocab=CL100K)
    assert cold == xgrammar_cost("json", spec, CL100K).compile_s > 1.0
    with pytest.raises(GuardError) as e:
        check_constraint(
            "json", spec, ("x",), GuidedLimits(backend_max_compile_s=1.0), vocab=CL100K
        )
    assert e.value.code == BACKEND_COST_CODE and "ceiling of 1 s" in e.value.message


def test_no_backends_no_cost_check() -> None:
    assert refusal(request_body("json", ROUTED_324), GuidedLimits(backends=())) is None


def test_unpriceable_regex_refused_on_outlines_only() -> None:
    # outlines-core has no look-around; vLLM's auto sends \p{L} to guidance
    body = request_body("regex", r"\p{L}+ x")
    assert refusal(body) is None
    assert refusal(body, ONLY["outlines"]) == (BACKEND_COST_CODE, "outlines")


def test_estimators_price_kinds_they_do_not_compile_as_refused() -> None:
    assert not outlines_cost("grammar", 'root ::= "a"', 32768).accepted
    assert (
        guidance_cost("grammar", "\n".join(f'r{i} ::= "x"' for i in range(2000)), 32768).compile_s
        > 1
    )
    assert trie_size(['"option_1"', '"option_2"']) == 12


def test_forced_tool_call_schema_is_priced() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": ROUTED_324}}]
    body: dict[str, Any] = {"messages": [], "tools": tools}
    assert refusal(body) is None  # tool_choice auto: vLLM does not constrain the output
    assert refusal({**body, "tool_choice": "required"}) == (BACKEND_COST_CODE, "outlines")
    named = {"type": "function", "function": {"name": "f"}}
    assert refusal({**body, "tool_choice": named}) == (BACKEND_COST_CODE, "outlines")


# ---- nested bounds ----------------------------------------------------------------------------


def _nested(levels: int, items: int, length: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string", "minLength": length}
    for _ in range(levels):
        schema = {"type": "array", "minItems": items, "items": schema}
    return schema


def test_multiplied_bounds_refused() -> None:
    bomb = _nested(3, 1000, 10_000)  # each within its cap, the product 10^13
    assert largest_bound_product(bomb, 10_000) == 10**13
    assert refusal(request_body("json", bomb), GuidedLimits(backends=())) == (
        "guided_schema_too_large",
        "nested minItems/maxItems and minLength/maxLength multiply to more than 1000000",
    )
    tool = {"type": "function", "function": {"name": "f", "parameters": bomb}}
    got = refusal({"messages": [], "tools": [tool]})
    assert got is not None and got[0] == "guided_schema_too_large"
    # one level of each is fine
    assert refusal(request_body("json", _nested(1, 100, 2000)), GuidedLimits(backends=())) is None


def test_bound_product_follows_refs_once() -> None:
    schema = {
        "$defs": {"s": {"type": "string", "maxLength": 5000}},
        "type": "array",
        "maxItems": 1000,
        "items": {"$ref": "#/$defs/s"},
    }
    assert largest_bound_product(schema, 10_000) == 5_000_000
    loop = {"type": "array", "maxItems": 10, "items": {"$ref": "#"}}
    assert largest_bound_product(loop, 10_000) == 100  # the ref on the path is not re-entered


# ---- custom tools, Chat Completions spelling --------------------------------------------------


def _custom(definition: str, syntax: str) -> dict[str, Any]:
    fmt = {"type": "grammar", "grammar": {"definition": definition, "syntax": syntax}}
    return {"messages": [], "tools": [{"type": "custom", "custom": {"name": "t", "format": fmt}}]}


def test_chat_completions_custom_tool_grammar_checked_like_responses() -> None:
    deep = "start: " + "(" * 100 + '"a"' + ")" * 100
    body = _custom(deep, "lark")
    with pytest.raises(GuardError) as info:
        check_structured_outputs(body, DEFAULT)
    assert info.value.code == "guided_grammar_too_deep"
    assert info.value.param == "tools[0].custom.format.grammar.definition"
    responses = {"tools": [{"type": "custom", "format": {"type": "grammar", "definition": deep}}]}
    assert refusal(responses) == refusal(body)
    assert refusal(_custom("(a+)+b", "regex")) == (
        "guided_regex_unsafe",
        refusal({"guided_regex": "(a+)+b"})[1],  # type: ignore[index]
    )
    assert refusal(_custom('start: "yes" | "no"', "lark")) is None
    # and priced: a regex definition reaches the backends as a regex
    assert refusal(_custom("(.{1,3}){5}", "regex")) == (BACKEND_COST_CODE, "xgrammar")


# ---- payloads/pinned: attacks and look-alikes for vLLM pinned to one backend ------------------

# The folders for vLLM pinned to one structured-output backend (payloads/pinned/llama_cpp is
# tests/payloads/test_pinned_llama_cpp.py's).
PINNED = sorted(
    path
    for backend in ("outlines", "xgrammar")
    for path in (REPO_ROOT / "payloads" / "pinned" / backend).glob("*.yaml")
)


@pytest.mark.parametrize("path", PINNED, ids=[p.stem for p in PINNED])
def test_pinned_payloads(path: Path) -> None:
    from guard.pipeline import evaluate_body
    from guard.policy import policy_from_yaml
    from payloads import load_payload

    backend = path.parent.name
    policy = policy_from_yaml(f"limits:\n  guided:\n    backends: [{backend}]\n")
    payload = load_payload(path)
    verdict = evaluate_body(payload.body_bytes(), payload.endpoint, payload.header_items(), policy)
    assert verdict.status == payload.expect.status, (verdict.code, verdict.rejection)
    if payload.expect.code:
        assert verdict.code == payload.expect.code
        assert verdict.rejection is not None and verdict.rejection.message.startswith(backend)


def test_pinned_payloads_exist_for_both_directions() -> None:
    kinds = {(p.parent.name, p.stem[:2]) for p in PINNED}
    assert {("outlines", "po"), ("xgrammar", "px")} <= kinds


def test_outlines_estimate_prices_unicode_word_classes_and_wide_loops() -> None:
    # measured at 32k: \w+ 0.13 s, \w+].*\w+@ 0.26 s, the fuzzed regex 1.06 s
    assert outlines_cost("regex", r"\w+", 32768).compile_s >= 0.13
    assert outlines_cost("regex", r"\w+].*\w+@", 32768).compile_s >= 0.26
    fuzzed = r'b]*.*"b"\w_%*[a-zA-Z0-39.\w_%+-]+].*[a-zA-Z0-39.\w_%+-]+@{0,64}R0-4.-{2,}'
    assert outlines_cost("regex", fuzzed, 32768).compile_s > 1.0
    # wide loops in sequence stay cheap when there are few (email, url)
    assert (
        outlines_cost("regex", r"[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}", 32768).compile_s
        < 0.5
    )


def test_outlines_bare_string_cliff_position() -> None:
    # measured at 32k: maxLength 10 0.10 s, 14 1.02 s, 16 4.4 s
    cost = {
        n: outlines_cost("json", {"type": "string", "maxLength": n}, 32768).compile_s
        for n in (10, 14, 16)
    }
    assert cost[10] < 1.0 < cost[14] < cost[16]


def test_classes_rust_reads_as_nested_are_not_priced_as_python_reads_them() -> None:
    # Rust's regex (outlines-core) reads [..["a","b"]..] as one class; Python's parser does not
    nested = '-Z0-9.-]+\\.[a-zA-Z ::= root \\d\\d"enum":["a","b"]"um":["a","b"]= ]{83,}'
    assert refusal(request_body("regex", nested), ONLY["outlines"]) == (
        BACKEND_COST_CODE,
        "outlines",
    )
    assert refusal(request_body("regex", "[[:alpha:]]{4}"), ONLY["outlines"]) is not None
    assert refusal(request_body("regex", r"[a-z\[]{4}"), ONLY["outlines"]) is None


def _strings(bounds: list[int]) -> dict[str, Any]:
    props = {f"p{i}": {"type": "string", "maxLength": n} for i, n in enumerate(bounds)}
    return {"type": "object", "properties": props, "required": list(props)}


def test_xgrammar_compiles_a_string_rule_once_per_distinct_bounds() -> None:
    # measured at cl100k_base (bench/guided_vocab.py): twelve maxLength-100 strings 2.2 s (one
    # rule), twelve of maxLength 101-112 29.5 s (twelve rules)
    same = xgrammar_cost("json", _strings([100] * 12), CL100K).compile_s
    one = xgrammar_cost("json", _strings([100]), CL100K).compile_s
    distinct = xgrammar_cost("json", _strings(list(range(101, 113))), CL100K).compile_s
    assert same == one and distinct > 10 * one
    assert refusal(request_body("json", _strings([100] * 12)), vocab=CL100K) is None
    assert refusal(request_body("json", _strings(list(range(101, 113)))), vocab=CL100K) == (
        BACKEND_COST_CODE,
        "xgrammar",
    )
    # minLength makes another rule
    mixed = _strings([100, 100])
    mixed["properties"]["p1"]["minLength"] = 5
    assert xgrammar_cost("json", mixed, CL100K).compile_s > 2 * one

"""scheduler_ref.prompt_template: {{name}} templates in the vulnerable and hardened profiles.

Anything that can exhaust memory or time (the vulnerable engine on attack payloads) runs only
inside guard.isolation.run_limited.
"""

from __future__ import annotations

import contextlib
import itertools
import statistics
import time
from collections.abc import Callable, Mapping

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from guard.budget import Budget, Limits
from guard.errors import GuardError, LimitExceeded, TemplateError
from guard.isolation import run_limited
from scheduler_ref._placeholder_syntax import Arena, Placeholder, Text, parse
from scheduler_ref.profiles import HARDENED, VULNERABLE
from scheduler_ref.prompt_template import (
    DEFAULT_VARIABLES,
    MAX_NAME_CHARS,
    MAX_RENDER_STEPS,
    RenderedPrompt,
    render_prompt_template,
)

SEED = "{{" * 1024 + "system_prompt}}" * 512
SELF_REFERENCE = {"a": "x{{a}}"}


def _laughs(levels: int, leaf: str, fan_out: int = 10) -> dict[str, str]:
    """lol0 = leaf; lolN = "{{lolN-1}}" * fan_out: fan_out**levels copies of the leaf."""
    step = {f"lol{i}": ("{{lol" + str(i - 1) + "}}") * fan_out for i in range(1, levels + 1)}
    return {"lol0": leaf, **step}


LAUGHS = _laughs(9, "lol")  # 10**9 * "lol": 3 GB, and a chain 10 levels deep
SHALLOW_LAUGHS = _laughs(5, "lol ")  # 400 kB, within the depth limit


class FakeCount:
    """An IncrementalCount stand-in: one token per UTF-8 byte, raising past ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.fed: list[str] = []

    def feed(self, text: str) -> None:
        self.fed.append(text)
        self.count += len(text.encode("utf-8", "surrogatepass"))
        if self.count > self.limit:
            raise LimitExceeded("prompt_tokens_exceeded", f"prompt exceeds {self.limit} tokens")

    def finish(self) -> int:
        return self.count


def hardened_budget(
    *, max_steps: int = MAX_RENDER_STEPS, clock: Callable[[], float] = time.monotonic
) -> Budget:
    """What budget_for(HARDENED) builds, with the fake counter in place of guard.tokens._counter."""
    assert HARDENED.max_prompt_tokens is not None
    limits = Limits(
        max_depth=HARDENED.max_template_depth,
        max_tokens=HARDENED.max_prompt_tokens,
        max_steps=max_steps,
        deadline_s=HARDENED.render_deadline_s,
    )
    return Budget(limits, FakeCount(HARDENED.max_prompt_tokens), clock)


def hardened(template: str, variables: Mapping[str, str] | None = None) -> RenderedPrompt:
    return render_prompt_template(template, variables or {}, HARDENED, budget=hardened_budget())


def vulnerable(template: str, variables: Mapping[str, str] | None = None) -> RenderedPrompt:
    return render_prompt_template(template, variables or {}, VULNERABLE)


def hardened_error(template: str, variables: Mapping[str, str] | None = None) -> GuardError:
    with pytest.raises(GuardError) as info:
        hardened(template, variables)
    return info.value


# ---------------------------------------------------------------------------------- benign


BENIGN = [
    ("", {}),
    ("Hello, world.", {}),
    ("def f(x): { return x; }", {}),
    ('Answer in JSON like {"name": "...", "age": 3}.', {}),
    ('Nested JSON, spaced: {"a": {"b": 1} }', {}),
    ("{ {not a placeholder} }", {}),
    ("日本語のテキスト, ελληνικά, emoji 🙂", {}),
    ("{{system_prompt}}\nUser: hi", {}),
    ("{{ name }} / {{name}} / {{\tname\n}}", {"name": "Ana"}),
    ("{{ {{lang}}_greeting }}, {{name}}!", {"lang": "en", "en_greeting": "Hello", "name": "Ana"}),
    ("{{outer}}", {"outer": "[{{inner}}]", "inner": "{ {{leaf}} }", "leaf": "é"}),
    ("{{a}}}", {"a": "x"}),  # a closer, then a literal brace
    ("{{{a}}}", {"{a": "brace-named"}),
    ("{{a}}{{a}}{{a}}", {"a": "{{b}}", "b": "ok"}),
    ("{{" * 8 + "k" + "}}" * 8, {"k": "k"}),
]


@pytest.mark.parametrize(("template", "variables"), BENIGN)
def test_benign_templates_render_the_same_in_both_profiles(
    template: str, variables: dict[str, str]
) -> None:
    v = vulnerable(template, variables)
    h = hardened(template, variables)
    assert v.text == h.text
    assert v.max_depth == h.max_depth
    assert v.placeholders == h.placeholders


def test_nested_placeholders_resolve_the_inner_name_first() -> None:
    variables = {"lang": "fr", "fr_greeting": "Bonjour {{name}}", "name": "Zoé"}
    out = hardened("{{ {{lang}}_greeting }}!", variables)
    assert out.text == "Bonjour Zoé!"
    # The inner placeholder is depth 2; "name" inside the value is depth 2 as well.
    assert (out.max_depth, out.placeholders) == (2, 3)
    # Only the ends of the whole name are stripped.
    assert hardened("{{{{lang}}_greeting}}", {**variables, "lang": " fr"}).text == "Bonjour Zoé"
    err = hardened_error("{{ {{lang}}_greeting }}", {**variables, "lang": "fr "})
    assert (err.code, err.param) == ("template_unknown_variable", "fr _greeting")


def test_values_are_templates_expanded_in_turn() -> None:
    out = hardened("<{{a}}>", {"a": "1{{b}}3", "b": "2"})
    assert out.text == "<123>"
    assert out.max_depth == 2


def test_defaults_apply_and_request_variables_override_them() -> None:
    assert hardened("{{system_prompt}}").text == DEFAULT_VARIABLES["system_prompt"]
    assert hardened("{{system_prompt}}", {"system_prompt": "Be brief."}).text == "Be brief."


def test_hardened_counts_tokens_as_it_expands_and_vulnerable_does_not() -> None:
    budget = hardened_budget()
    out = render_prompt_template("ab{{x}}", {"x": "cd"}, HARDENED, budget=budget)
    assert out.tokens == 4
    assert vulnerable("ab{{x}}", {"x": "cd"}).tokens is None
    counter = budget._tokens
    assert isinstance(counter, FakeCount)
    assert counter.fed == ["ab", "cd"]  # pieces, as produced: never the whole expansion


def test_lone_surrogates_from_json_escapes_do_not_break_either_profile() -> None:
    template = "a\ud800{{x}}\udfff"
    assert vulnerable(template, {"x": "\udc00"}).text == hardened(template, {"x": "\udc00"}).text
    assert hardened_error("\ud800}}").code == "template_unbalanced"


def test_deep_balanced_nesting_parses_and_renders_without_recursion() -> None:
    template = "{{" * 5000 + "x" + "}}" * 5000
    out = vulnerable(template)
    assert out.text == ""  # unknown names render empty in the vulnerable profile
    assert out.max_depth == 5000
    assert hardened_error(template).code == "template_depth_exceeded"


# ----------------------------------------------------------------------- vulnerable choices


def test_vulnerable_tolerates_unclosed_and_stray_delimiters_as_text() -> None:
    assert vulnerable("a {{ b").text == "a {{ b"
    assert vulnerable("a }} b").text == "a }} b"
    assert vulnerable("{{x}} {{", {"x": "1"}).text == "1 {{"
    assert vulnerable("{{nope}}|").text == "|"  # unknown -> "" as Mustache does


def test_vulnerable_backtracking_doubles_its_work_per_unclosed_opener() -> None:
    # Small k only: "{{"*2k + "x}}"*k leaves k openers unclosed; nodes grow ~2**k.
    nodes = [vulnerable("{{" * (2 * k) + "x}}" * k).nodes for k in range(4, 12)]
    ratios = [b / a for a, b in itertools.pairwise(nodes)]
    assert min(ratios) > 1.9, nodes
    # The arena and token buffer keep the abandoned work: far more than the text itself.
    out = vulnerable("{{" * 22 + "x}}" * 11)
    assert out.nodes > 40_000
    assert out.buffered_tokens > 20_000


def test_strict_parse_rejects_unbalanced_text_even_without_the_scan() -> None:
    for text in ("{{a", "a}}", "{{a}}}}"):
        with pytest.raises(TemplateError) as info:
            parse(text, Arena(), lenient=False)
        assert info.value.code == "template_unbalanced"
    nodes = parse("a{{b{{c}}}}", Arena(), lenient=False)
    assert nodes[0] == Text("a")
    assert isinstance(nodes[1], Placeholder)


# ----------------------------------------------------------------------- hardened: codes


def test_seed_is_rejected_at_the_ninth_opener_in_microseconds() -> None:
    err = hardened_error(SEED)
    assert isinstance(err, LimitExceeded)
    assert err.code == "template_depth_exceeded"
    assert err.param == "prompt_template"
    assert "byte offset 16" in err.message
    samples = []
    for _ in range(200):
        start = time.perf_counter()
        with pytest.raises(LimitExceeded):
            hardened(SEED)
        samples.append(time.perf_counter() - start)
    assert statistics.median(samples) < 1e-3  # measured ~12 µs; 1 ms is the target


def test_self_reference_is_template_recursion() -> None:
    err = hardened_error("{{a}}", SELF_REFERENCE)
    assert (err.code, err.param) == ("template_recursion", "a")
    err = hardened_error("{{a}}", {"a": "{{b}}", "b": "<{{a}}>"})
    assert err.code == "template_recursion"
    assert "a -> b -> a" in err.message
    # The same variable twice side by side is not a cycle.
    assert hardened("{{a}}{{a}}", {"a": "{{b}}{{b}}", "b": "x"}).text == "xxxx"


def test_billion_laughs_deep_chain_exceeds_the_depth() -> None:
    err = hardened_error("{{lol9}}", LAUGHS)
    assert err.code == "template_depth_exceeded"


def test_billion_laughs_within_the_depth_stops_at_the_token_budget() -> None:
    budget = hardened_budget()
    with pytest.raises(LimitExceeded) as info:
        render_prompt_template("{{lol5}}", SHALLOW_LAUGHS, HARDENED, budget=budget)
    assert info.value.code == "prompt_tokens_exceeded"
    assert budget.bytes_used <= 2048 + len("lol ")  # stopped at the first piece over the limit


def test_expansion_into_nothing_stops_at_the_step_budget() -> None:
    empties = {"e0": "", **{f"e{i}": ("{{e" + str(i - 1) + "}}") * 50 for i in range(1, 6)}}
    budget = hardened_budget(max_steps=10_000)
    with pytest.raises(LimitExceeded) as info:
        render_prompt_template("{{e5}}", empties, HARDENED, budget=budget)
    assert info.value.code == "step_budget_exceeded"


def test_placeholders_beyond_the_step_budget_are_refused_before_parsing() -> None:
    budget = hardened_budget()
    with pytest.raises(LimitExceeded) as info:
        render_prompt_template("{{a}}" * (MAX_RENDER_STEPS + 1), {"a": ""}, HARDENED, budget=budget)
    assert info.value.code == "step_budget_exceeded"
    assert budget.steps_used == MAX_RENDER_STEPS + 1  # charged by the scan's count, nothing parsed


def test_render_deadline() -> None:
    ticks = iter(range(1_000_000))
    budget = hardened_budget(clock=lambda: float(next(ticks)))  # one second per reading
    variables = {"a": "x", "b": "{{a}}" * 300}
    with pytest.raises(LimitExceeded) as info:
        render_prompt_template("{{b}}", variables, HARDENED, budget=budget)
    assert (info.value.code, info.value.status) == ("deadline_exceeded", 408)


def test_unknown_variable_names_it_truncated() -> None:
    err = hardened_error("{{missing}}")
    assert isinstance(err, TemplateError)
    assert (err.code, err.param) == ("template_unknown_variable", "missing")
    long_name = "n" * MAX_NAME_CHARS
    err = hardened_error("{{" + long_name + "}}")
    assert err.code == "template_unknown_variable"
    assert err.param is not None and len(err.param) <= 65
    assert len(err.message) < 200


def test_unbalanced_template_and_unbalanced_value() -> None:
    assert hardened_error("Hello {{name").code == "template_unbalanced"
    assert hardened_error("Hello }} there").code == "template_unbalanced"
    err = hardened_error("{{a}}", {"a": "oops {{"})
    assert (err.code, err.param) == ("template_unbalanced", "a")


def test_nesting_through_values_counts_against_the_same_depth() -> None:
    chain = {f"v{i}": "{{v" + str(i + 1) + "}}" for i in range(8)}
    chain["v8"] = "end"
    assert hardened("{{v1}}", chain).text == "end"  # depth 8
    err = hardened_error("{{v0}}", chain)  # depth 9
    assert err.code == "template_depth_exceeded"
    assert "variable values count too" in err.message
    # A value nesting too deep on its own is refused by the scan, naming the variable.
    err = hardened_error("{{a}}", {"a": "{{" * 9 + "}}" * 9})
    assert (err.code, err.param) == ("template_depth_exceeded", "a")


def test_template_too_large_counts_the_values_read() -> None:
    assert HARDENED.max_template_bytes is not None
    cap = HARDENED.max_template_bytes
    err = hardened_error("a" * (cap + 1))
    assert (err.code, err.param) == ("template_too_large", "prompt_template")
    err = hardened_error("é" * (cap // 2 + 1))  # within the cap in characters, not in bytes
    assert err.code == "template_too_large"
    # The value fits on its own; with the template's own five bytes it does not.
    err = hardened_error("{{a}}", {"a": "x" * cap})
    assert (err.code, err.param) == ("template_too_large", "a")


def test_variable_name_grown_through_expansion_is_capped() -> None:
    err = hardened_error("{{ {{big}} }}", {"big": "x" * (MAX_NAME_CHARS + 1)})
    assert err.code == "template_name_too_long"


def test_non_string_variable_is_invalid() -> None:
    err = hardened_error("{{n}}", {"n": 3})  # type: ignore[dict-item]
    assert (err.code, err.param) == ("template_variable_invalid", "n")


def test_error_bodies_are_openai_shaped() -> None:
    body = hardened_error("{{a}}", SELF_REFERENCE).to_body()["error"]
    assert body["code"] == "template_recursion"
    assert body["type"] == "invalid_request_error"
    assert body["param"] == "a"


def test_budget_for_hardened_counts_real_tokens() -> None:
    pytest.importorskip("guard.tokens._counter")
    out = render_prompt_template("Hello {{name}}!", {"name": "world"}, HARDENED)
    assert out.text == "Hello world!"
    assert out.tokens == 3  # cl100k_base: "Hello", " world", "!"
    with pytest.raises(LimitExceeded) as info:
        render_prompt_template("{{lol5}}", SHALLOW_LAUGHS, HARDENED)
    assert info.value.code == "prompt_tokens_exceeded"


# -------------------------------------------------------------------------------- properties


_NAMES = ["a", "b", "c", "ab", "system_prompt"]
_PIECES = st.sampled_from(
    ["{{", "}}", "{", "}", " ", "\n", "é", "x", "_", "{{a}}", "{{ b }}", "{{c}}", *_NAMES]
)
_TEMPLATES = st.lists(_PIECES, max_size=24).map("".join)
_VARIABLES = st.dictionaries(st.sampled_from(_NAMES), _TEMPLATES, max_size=5)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEMPLATES, _VARIABLES)
def test_hardened_succeeds_within_budgets_or_raises_a_guard_error(
    template: str, variables: dict[str, str]
) -> None:
    try:
        out = hardened(template, variables)
    except GuardError as err:
        assert err.code and err.status in (400, 408)
        return
    assert HARDENED.max_template_depth is not None and HARDENED.max_prompt_tokens is not None
    assert out.max_depth <= HARDENED.max_template_depth
    assert out.tokens is not None and out.tokens <= HARDENED.max_prompt_tokens
    # What the hardened profile accepts is balanced, acyclic and bounded, so the vulnerable
    # engine does the same finite work in-process, and must agree.
    assert vulnerable(template, variables).text == out.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_TEMPLATES, _VARIABLES, st.sampled_from(["", "lol ", "日本語 ", "  "]))
def test_hardened_with_the_real_token_counter(
    template: str, variables: dict[str, str], filler: str
) -> None:
    pytest.importorskip("guard.tokens._counter")
    variables = {**variables, "c": filler * 3000}  # renders using "c" go past 2048 tokens
    try:
        out = render_prompt_template(template, variables, HARDENED)
    except GuardError as err:
        assert err.code
        return
    assert out.tokens is not None and out.tokens <= 2048
    assert out.max_depth <= 8


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80), st.dictionaries(st.text(max_size=6), st.text(max_size=30)))
def test_hardened_never_raises_anything_else_on_arbitrary_text(
    template: str, variables: dict[str, str]
) -> None:
    with contextlib.suppress(GuardError):
        hardened(template, variables)


# ------------------------------------------------------------- vulnerable, isolated only

MEM_CAP = 256 << 20
TIMEOUT_S = 5.0


def test_isolated_control_benign_render_fits_the_same_limits() -> None:
    res = run_limited(
        render_prompt_template,
        "{{system_prompt}} {{a}}",
        {"a": "ok"},
        VULNERABLE,
        mem_limit_bytes=MEM_CAP,
        timeout_s=TIMEOUT_S,
    )
    assert res.outcome == "ok", res
    assert res.value is not None and res.value.text == "You are a helpful assistant. ok"


@pytest.mark.parametrize(
    ("template", "variables"),
    [(SEED, {}), ("{{a}}", SELF_REFERENCE), ("{{lol9}}", LAUGHS)],
    ids=["seed", "self-reference", "billion-laughs"],
)
def test_vulnerable_engine_exhausts_memory_or_time(
    template: str, variables: dict[str, str]
) -> None:
    res = run_limited(
        render_prompt_template,
        template,
        variables,
        VULNERABLE,
        mem_limit_bytes=MEM_CAP,
        timeout_s=TIMEOUT_S,
    )
    assert res.outcome != "ok", res
    assert res.outcome in ("killed", "timeout") or res.error_type == "MemoryError", res

"""guard.checks.tokens: prompt cap with the real tokenizer, output caps, context length."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from guard.checks import CheckResult, Mutation, check_tokens
from guard.errors import GuardError
from guard.policy import Policy, default_policy, policy_from_yaml
from guard.request import RequestView
from guard.tokens import get_counter
from tests._support import peak_allocated

# The cap machinery is exercised with the seed's numbers (a 2048-token prompt cap, outputs of
# 2048 with 256 injected); the default policy's window-derived limits have their own section.
P = policy_from_yaml("preset: seed")
T = P.limits.tokens
EXACT = policy_from_yaml("{preset: seed, limits: {tokens: {exact_costs: true}}}")
CLAMP = policy_from_yaml("{preset: seed, limits: {tokens: {over_max_output: clamp}}}")
NO_CONTEXT = policy_from_yaml("{preset: seed, limits: {tokens: {context_length: null}}}")
DEFAULT = default_policy()
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
COUNTER = get_counter(T.tokenizer)


def run(body: Any, path: str = CHAT, policy: Policy = P) -> CheckResult:
    before = copy.deepcopy(body)
    result = check_tokens(RequestView.build(body, path=path), policy)
    assert body == before, "checks must not modify the body"
    return result


def rejection(body: Any, path: str = CHAT, policy: Policy = P) -> GuardError:
    result = run(body, path, policy)
    assert result.rejection is not None, "expected a rejection"
    return result.rejection


def text_of_tokens(n: int) -> str:
    """Text of exactly ``n`` cl100k tokens (" word" is one token)."""
    text = " word" * n
    assert COUNTER.encode_count(text) == n
    return text


def chat(content: str, **fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": content}], **fields}


# -- output caps --------------------------------------------------------------------------------


def test_default_max_tokens_is_injected() -> None:
    result = run(chat("hi"))
    assert result.rejection is None
    assert result.mutations == (
        Mutation(("max_tokens",), T.default_max_tokens, "default_max_tokens"),
    )
    assert result.costs["output_tokens"] == T.default_max_tokens
    result = run({"prompt": "hi"}, COMPLETIONS)
    assert result.mutations[0].path == ("max_tokens",)
    result = run({"input": "hi"}, "/v1/responses")
    assert result.mutations[0].path == ("max_output_tokens",)
    # Nothing to inject where nothing is generated.
    assert run({"input": "hi"}, "/v1/embeddings").mutations == ()


def test_no_injection_when_a_cap_is_set() -> None:
    result = run(chat("hi", max_tokens=10))
    assert result.rejection is None and result.mutations == ()
    assert result.costs["output_tokens"] == 10
    # Another field alone: in front of llama-cpp-python, which reads max_tokens only and
    # generates to the end of its context without it, max_tokens gets the same cap; vLLM and
    # others read the field themselves, so the request goes as it is.
    llama_cpp = policy_from_yaml("{preset: seed, upstream: {kind: llama_cpp}}")
    for field in ("max_completion_tokens", "n_predict", "max_new_tokens"):
        result = run(chat("hi", **{field: 10}), policy=llama_cpp)
        assert result.rejection is None, field
        assert result.mutations == (Mutation(("max_tokens",), 10, "max_tokens_missing"),), field
        assert result.costs["output_tokens"] == 10
        result = run(chat("hi", **{field: 10}))
        assert result.rejection is None and result.mutations == (), field
        assert result.costs["output_tokens"] == 10


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens", "n_predict"])
def test_output_cap_at_and_over(field: str) -> None:
    assert run(chat("hi", **{field: T.max_output_tokens})).rejection is None
    err = rejection(chat("hi", **{field: T.max_output_tokens + 1}))
    assert err.code == "max_tokens_exceeded"
    assert err.param == field


def test_every_output_field_is_checked() -> None:
    # vLLM reads max_completion_tokens or max_tokens depending on truthiness: check both.
    err = rejection(chat("hi", max_completion_tokens=5, max_tokens=10**9))
    assert err.param == "max_tokens"
    # 0 is no cap at all to llama-cpp-python
    err = rejection(chat("hi", max_completion_tokens=0, max_tokens=10))
    assert err.param == "max_completion_tokens"
    assert rejection(chat("hi", n_predict=-1)).code == "max_tokens_exceeded"  # llama.cpp: forever
    assert rejection(chat("hi", max_tokens="100000")).code == "max_tokens_exceeded"
    err = rejection({"input": "x", "max_output_tokens": 10**6}, "/v1/responses")
    assert err.param == "max_output_tokens"


def test_clamp_mode() -> None:
    result = run(chat("hi", max_tokens=10**6, n_predict=-1), policy=CLAMP)
    assert result.rejection is None
    assert set(result.mutations) == {
        Mutation(("max_tokens",), T.max_output_tokens, "max_output_tokens"),
        Mutation(("n_predict",), T.max_output_tokens, "max_output_tokens"),
    }
    assert result.costs["output_tokens"] == T.max_output_tokens


def test_reserved_output_counts_every_sequence() -> None:
    result = run({"prompt": ["a", "b", "c"], "n": 2, "best_of": 3, "max_tokens": 10}, COMPLETIONS)
    assert result.costs["sequences"] == 9
    assert result.costs["output_tokens_reserved"] == 90
    assert result.costs["tokens_reserved"] == result.costs["prompt_tokens"] + 90
    embed = run({"input": ["a", "b"]}, "/v1/embeddings")
    assert embed.costs["sequences"] == 0 and embed.costs["output_tokens_reserved"] == 0


# -- prompt tokens ------------------------------------------------------------------------------

# A one-message chat's fallback overhead: per request, per message, the role; a counted text
# adds one token for its edges (none when bytes bound it).
CHAT_BYTES = T.per_request_tokens + T.per_message_tokens + len("user")
CHAT_COUNTED = CHAT_BYTES + 1
SPECIALS = COUNTER.special_tokens  # completions add the tokenizer's special tokens


def test_prompt_at_and_over_the_cap_exactly() -> None:
    at = chat(text_of_tokens(T.max_prompt_tokens - CHAT_COUNTED), max_tokens=1)
    result = run(at, policy=NO_CONTEXT)
    assert result.rejection is None
    assert result.costs["prompt_tokens"] == T.max_prompt_tokens
    assert result.costs["prompt_tokens_exact"] == 1
    over = chat(text_of_tokens(T.max_prompt_tokens - CHAT_COUNTED + 1), max_tokens=1)
    err = rejection(over, policy=NO_CONTEXT)
    assert err.code == "prompt_tokens_exceeded"
    assert err.param == "messages[0].content"


def test_completion_prompt_at_and_over() -> None:
    limit = T.max_prompt_tokens - SPECIALS
    assert run({"prompt": text_of_tokens(limit), "max_tokens": 1}, COMPLETIONS, NO_CONTEXT).allowed
    err = rejection({"prompt": text_of_tokens(limit + 1), "max_tokens": 1}, COMPLETIONS, NO_CONTEXT)
    assert err.code == "prompt_tokens_exceeded"
    assert err.param == "prompt"
    # Without the tokenizer's special tokens, the whole cap is text.
    body = {
        "prompt": text_of_tokens(limit + SPECIALS),
        "max_tokens": 1,
        "add_special_tokens": False,
    }
    assert run(body, COMPLETIONS, NO_CONTEXT).allowed


def test_token_ids_count_as_tokens() -> None:
    limit = T.max_prompt_tokens
    assert run({"prompt": [7] * limit, "max_tokens": 1}, COMPLETIONS, NO_CONTEXT).allowed
    err = rejection({"prompt": [7] * (limit + 1), "max_tokens": 1}, COMPLETIONS, NO_CONTEXT)
    assert err.code == "prompt_tokens_exceeded"
    assert err.param == "prompt"
    half = [[7] * (limit // 2)] * 2
    assert run({"prompt": half, "max_tokens": 1}, COMPLETIONS, NO_CONTEXT).allowed
    err = rejection({"prompt": [*half, [7]], "max_tokens": 1}, COMPLETIONS, NO_CONTEXT)
    assert err.param == "prompt[2]"


def test_the_cap_is_summed_over_the_request() -> None:
    half = text_of_tokens(T.max_prompt_tokens // 2 - SPECIALS)
    body = {"prompt": [half, half, " word"], "max_tokens": 1}
    err = rejection(body, COMPLETIONS, NO_CONTEXT)
    assert err.code == "prompt_tokens_exceeded"
    assert err.param == "prompt[2]"


def test_everything_that_becomes_prompt_is_counted() -> None:
    big = text_of_tokens(T.max_prompt_tokens)
    base: dict[str, Any] = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    variants: list[tuple[dict[str, Any], str]] = [
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": big}]}]}, "messages"),
        ({"messages": [{"role": "assistant", "content": None, "reasoning_content": big}]}, "m"),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "tool_calls": [{"function": {"name": "f", "arguments": big}}],
                    }
                ]
            },
            "messages",
        ),
        ({"tools": [{"type": "function", "function": {"name": "f", "description": big}}]}, "tools"),
        ({"prompt_template": big}, "prompt_template"),
        ({"template_vars": {"x": big}}, "template_vars.x"),
    ]
    for extra, param in variants:
        err = rejection(base | extra, policy=NO_CONTEXT)
        assert err.code == "prompt_tokens_exceeded", extra.keys()
        assert err.param is not None and err.param.startswith(param[:1])
    responses = {"instructions": big, "input": [{"role": "user", "content": "x"}]}
    assert rejection(responses, "/v1/responses", NO_CONTEXT).code == "prompt_tokens_exceeded"
    assert rejection({"messages": [{"role": "user", "content": big}]}, "/tokenize").code == (
        "prompt_tokens_exceeded"
    )


def test_media_parts_are_not_text_but_estimated() -> None:
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 50_000}}
    body = {"messages": [{"role": "user", "content": [image]}], "max_tokens": 5}
    vllm = policy_from_yaml("limits: {tokens: {render_like: [vllm]}}")
    result = run(body, policy=vllm)
    assert result.rejection is None
    assert result.costs["media_tokens"] == T.tokens_per_image + 2  # and its newline
    assert result.costs["prompt_tokens"] < T.tokens_per_image + 50
    # llama-cpp-python gives a text-only template the part as it is: the URL is text.
    assert rejection(body).code == "prompt_tokens_exceeded"


def test_short_prompts_are_not_tokenized_unless_exact_costs() -> None:
    text = "hello there, how are you?"
    result = run(chat(text, max_tokens=5))
    assert result.costs["prompt_tokens_exact"] == 0
    assert result.costs["prompt_tokens"] == len(text) + CHAT_BYTES
    result = run(chat(text, max_tokens=5), policy=EXACT)
    assert result.costs["prompt_tokens_exact"] == 1
    assert result.costs["prompt_tokens"] == 7 + CHAT_COUNTED


def test_long_but_legal_prompts_pass() -> None:
    # ~7 KB of English: over the byte bound, under the token cap, so it is counted exactly.
    prose = "The quick brown fox jumps over the lazy dog. " * 160
    result = run(chat(prose, max_tokens=100))
    assert result.rejection is None
    assert result.costs["prompt_tokens_exact"] == 1
    assert result.costs["prompt_tokens"] == COUNTER.encode_count(prose) + CHAT_COUNTED


@pytest.mark.parametrize(
    "text",
    [
        "你好，世界。今天天气很好，我们去公园散步吧。" * 60,
        "Привет, мир! Как дела? " * 150,
        "مرحبا بالعالم. كيف حالك اليوم؟ " * 120,
        "🙂👍🏽 emoji " * 100,
    ],
)
def test_non_latin_text_is_counted_exactly(text: str) -> None:
    expected = COUNTER.encode_count(text) + CHAT_COUNTED
    result = run(chat(text, max_tokens=10), policy=NO_CONTEXT)
    if expected <= T.max_prompt_tokens:
        assert result.rejection is None
        assert result.costs["prompt_tokens"] <= len(text.encode()) + CHAT_BYTES
        if result.costs["prompt_tokens_exact"]:
            assert result.costs["prompt_tokens"] == expected
    else:
        assert result.rejection is not None


def test_huge_prompt_is_refused_without_tokenizing_it(monkeypatch: pytest.MonkeyPatch) -> None:
    tokenized = [0]  # characters and bytes handed to the tokenizer
    backend = COUNTER.backend  # type: ignore[attr-defined]
    encode_count, piece_lengths = backend.encode_count, backend.piece_lengths

    def counted_encode(text: str) -> int:
        tokenized[0] += len(text)
        return int(encode_count(text))

    def counted_pieces(piece: bytes) -> list[int]:
        tokenized[0] += len(piece)
        return list(piece_lengths(piece))

    monkeypatch.setattr(backend, "encode_count", counted_encode)
    monkeypatch.setattr(backend, "piece_lengths", counted_pieces)
    body = chat("a" * 900_000)
    assert rejection(body).code == "prompt_tokens_exceeded"
    assert tokenized[0] < 20_000, tokenized  # decided from the bytes, not 900 KB tokenized


# -- context length -----------------------------------------------------------------------------


def test_context_length_at_and_over() -> None:
    policy = policy_from_yaml("limits: {tokens: {context_length: 1000, max_output_tokens: 500}}")
    at = chat(text_of_tokens(1000 - 500 - CHAT_COUNTED), max_tokens=500)
    assert run(at, policy=policy).rejection is None
    over = chat(text_of_tokens(1000 - 500 - CHAT_COUNTED + 1), max_tokens=500)
    err = rejection(over, policy=policy)
    assert err.code == "context_length_exceeded"
    # A smaller output cap makes room.
    assert run(chat(text_of_tokens(600), max_tokens=300), policy=policy).rejection is None
    # The injected default counts too (the seed preset injects 256).
    seeded = policy_from_yaml(
        "{preset: seed, limits: {tokens: {context_length: 1000, max_output_tokens: 500}}}"
    )
    assert rejection(chat(text_of_tokens(800)), policy=seeded).code == "context_length_exceeded"
    # Without a default, a request without a cap needs one output token beside its prompt.
    assert run(chat(text_of_tokens(999 - CHAT_COUNTED)), policy=policy).rejection is None
    err = rejection(chat(text_of_tokens(1000 - CHAT_COUNTED)), policy=policy)
    assert err.code == "context_length_exceeded"


def test_context_length_applies_per_prompt() -> None:
    policy = policy_from_yaml(
        "limits: {tokens: {context_length: 600, max_output_tokens: 100, default_max_tokens: 100,"
        " max_prompt_tokens: 2048}}"
    )
    ok = {"prompt": [text_of_tokens(500 - SPECIALS)] * 3, "max_tokens": 100}
    assert run(ok, COMPLETIONS, policy).rejection is None
    over = {
        "prompt": [text_of_tokens(500 - SPECIALS), text_of_tokens(501 - SPECIALS)],
        "max_tokens": 100,
    }
    err = rejection(over, COMPLETIONS, policy)
    assert err.code == "context_length_exceeded"
    assert err.param == "prompt[1]"


def test_embeddings_inputs_fit_the_context() -> None:
    policy = policy_from_yaml("limits: {tokens: {context_length: 300, default_max_tokens: 100}}")
    ok = {"input": text_of_tokens(300 - SPECIALS)}
    assert run(ok, "/v1/embeddings", policy).rejection is None
    err = rejection({"input": text_of_tokens(301 - SPECIALS)}, "/v1/embeddings", policy)
    assert err.code == "context_length_exceeded"


def test_non_object_bodies_pass_through() -> None:
    assert run(None).rejection is None
    assert run([1, 2]).rejection is None


# -- prompt templates ---------------------------------------------------------------------------


def test_prompt_template_expansion_is_counted_as_expanded() -> None:
    limit = T.max_prompt_tokens - SPECIALS
    words = text_of_tokens(limit // 4)
    at = {"prompt_template": "{{a}}{{ a }}{{a}}{{a}}", "template_vars": {"a": words}}
    result = run(at | {"max_tokens": 1}, COMPLETIONS, NO_CONTEXT)
    assert result.rejection is None
    assert result.costs["prompt_tokens"] == limit // 4 * 4 + SPECIALS
    over = at | {"template_vars": {"a": words + " word"}, "max_tokens": 1}
    err = rejection(over, COMPLETIONS, NO_CONTEXT)
    assert err.code == "prompt_tokens_exceeded"
    assert err.param == "prompt_template"
    # Through a chain of variables, many tiny runs: cheap, and still bounded.
    chain = {"prompt_template": "{{b}}" * 300, "template_vars": {"b": "x{{c}}" * 3, "c": "yz"}}
    assert rejection(chain, COMPLETIONS, NO_CONTEXT).code == "prompt_tokens_exceeded"
    small = {"prompt_template": "{{b}}" * 10, "template_vars": {"b": "x{{c}}" * 3, "c": "yz"}}
    result = run(small | {"max_tokens": 1}, COMPLETIONS, NO_CONTEXT)
    assert result.rejection is None
    assert result.costs["prompt_tokens"] == 10 * 3 * 3 + SPECIALS  # bytes: an upper bound


def test_prompt_template_without_variables_is_plain_text() -> None:
    result = run({"prompt_template": "Hello {{system_prompt}}", "max_tokens": 1}, COMPLETIONS)
    assert result.rejection is None
    assert result.costs["prompt_tokens"] == len("Hello {{system_prompt}}") + SPECIALS


def test_hostile_templates_stay_cheap_for_the_tokens_check_alone() -> None:
    laughs = {f"a{i}": f"{{{{a{i + 1}}}}}" * 10 for i in range(7)} | {"a7": "lol" * 50}
    seed = "{{" * 1024 + "system_prompt}}" * 512
    bodies: list[dict[str, Any]] = [
        {"prompt_template": "{{a0}}", "template_vars": laughs},
        {"prompt_template": seed, "template_vars": {"system_prompt": "x"}},
        {"prompt_template": "{{a}}", "template_vars": {"a": "{{a}}{{a}}"}},
    ]
    for body in bodies:
        result, peak = peak_allocated(lambda: run(body, COMPLETIONS))  # noqa: B023 (called here)
        assert peak < 4 << 20, peak  # nothing expanded (the laughs alone are 10**7 * 3 chars)
        # Refused here or by the templates check: never expanded.
        assert result.rejection is None or result.rejection.code == "prompt_tokens_exceeded"


def test_many_messages_are_refused_from_one_bound_before_any_is_measured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sentence = "Please summarise the previous message in one short sentence, keeping every name."
    body = {"model": "m", "messages": [{"role": "user", "content": sentence}] * 400}
    measured: list[str] = []
    real_measure = COUNTER.measure

    def spy(text: str, *args: Any, **kwargs: Any) -> Any:
        measured.append(text)
        return real_measure(text, *args, **kwargs)

    monkeypatch.setattr(COUNTER, "measure", spy)
    err = rejection(body, policy=EXACT)
    assert err.code == "prompt_tokens_exceeded" and err.param == "messages"
    assert measured == []
    # When the bound does not decide, each message is still measured alone, and the one that
    # crosses the cap is named: 32 + 25 * 9 overhead + 18 * 101 tokens > 2048.
    body["messages"] = [{"role": "user", "content": text_of_tokens(100)}] * 25
    err = rejection(body, policy=EXACT)
    assert err.code == "prompt_tokens_exceeded" and err.param == "messages[17].content"
    assert measured


# -- the default policy: limits from the context window ---------------------------------------

WINDOW = 32_768
AT_32K = DEFAULT.with_upstream_context(WINDOW)


def test_defaults_have_no_cap_below_the_window() -> None:
    tokens = DEFAULT.limits.tokens
    assert tokens.max_prompt_tokens is None
    assert tokens.max_output_tokens is None
    assert tokens.default_max_tokens is None
    assert AT_32K.limits.tokens.output_limit == WINDOW - 1
    assert AT_32K.limits.tokens.prompt_limit == WINDOW


def test_a_request_without_a_cap_goes_unchanged_and_reserves_the_window() -> None:
    body = chat(text_of_tokens(3000))
    result = run(body, policy=AT_32K)
    assert result.rejection is None
    assert result.mutations == ()
    prompt = result.costs["prompt_tokens"]
    assert result.costs["output_tokens"] == 0
    assert result.costs["output_tokens_implicit"] == 1
    assert result.costs["output_tokens_reserved"] == WINDOW - prompt
    assert result.costs["tokens_reserved"] == WINDOW
    # n sequences share the prompt and each may run to the end of the window.
    result = run(chat(text_of_tokens(3000), n=3), policy=AT_32K)
    prompt = result.costs["prompt_tokens"]
    assert result.costs["tokens_reserved"] == prompt + 3 * (WINDOW - prompt)
    # Each prompt of a list leaves its own remainder (counted exactly here; by default a
    # prompt whose bytes prove it fits is weighed by its bytes, a larger count).
    exact = policy_from_yaml("limits: {tokens: {exact_costs: true}}").with_upstream_context(WINDOW)
    body = {"model": "m", "prompt": [text_of_tokens(100), text_of_tokens(2000)]}
    result = run(body, COMPLETIONS, exact)
    assert result.rejection is None and result.mutations == ()
    assert result.costs["output_tokens_reserved"] == (WINDOW - 100 - SPECIALS) + (
        WINDOW - 2000 - SPECIALS
    )


def test_a_conversation_near_the_window_is_admitted_and_one_over_it_refused() -> None:
    near = chat(text_of_tokens(WINDOW - 1 - CHAT_COUNTED))
    result = run(near, policy=AT_32K)
    assert result.rejection is None, result.rejection
    assert result.costs["prompt_tokens"] == WINDOW - 1
    over = chat(text_of_tokens(WINDOW - CHAT_COUNTED))
    assert rejection(over, policy=AT_32K).code == "context_length_exceeded"
    # With a cap, prompt plus cap must fit.
    fits = chat(text_of_tokens(WINDOW - 1000 - CHAT_COUNTED), max_tokens=1000)
    assert run(fits, policy=AT_32K).rejection is None
    too_much = chat(text_of_tokens(WINDOW - 1000 - CHAT_COUNTED + 1), max_tokens=1000)
    assert rejection(too_much, policy=AT_32K).code == "context_length_exceeded"


def test_an_output_cap_is_bounded_by_the_window_alone() -> None:
    assert run(chat("hi", max_tokens=WINDOW - 100), policy=AT_32K).rejection is None
    err = rejection(chat("hi", max_tokens=WINDOW), policy=AT_32K)
    assert err.code == "max_tokens_exceeded"
    assert f"the context window is {WINDOW} tokens" in err.message
    assert rejection(chat("hi", max_tokens=0), policy=AT_32K).code == "max_tokens_exceeded"
    assert rejection(chat("hi", max_tokens=-1), policy=AT_32K).code == "max_tokens_exceeded"


def test_llama_cpp_python_overshoot_is_reserved() -> None:
    from guard.checks.tokens import OUTPUT_OVERSHOOT
    from guard.policy import load_policy

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "n": 2}
    view = RequestView.build(body, path="/v1/chat/completions")
    base = load_policy(None, env={})
    # llama-cpp-python generates one sequence whatever n says (its server drops n and best_of).
    for kind, extra, sequences in (
        ("vllm", 0, 2),
        ("other", 0, 2),
        ("llama_cpp", OUTPUT_OVERSHOOT, 1),
    ):
        result = check_tokens(view, base.with_upstream_kind(kind))  # type: ignore[arg-type]
        assert result.costs["output_tokens"] == 8  # the relay's cap stays the request's
        assert result.costs["sequences"] == sequences
        assert result.costs["output_tokens_reserved"] == (8 + extra) * sequences


def test_logit_bias_that_keeps_llama_cpp_python_past_max_tokens_is_refused() -> None:
    from guard.policy import load_policy
    from guard.tokens import get_counter as counter_for

    base = load_policy(None, env={})
    llama_cpp, vllm = base.with_upstream_kind("llama_cpp"), base.with_upstream_kind("vllm")
    partial = sorted(counter_for().partial_char_ids or ())
    assert partial
    ok_id = next(i for i in range(1000) if i not in partial)

    def code(bias: dict[str, Any], policy: Policy) -> str | None:
        body = {
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 8,
            "logit_bias": bias,
        }
        result = check_tokens(RequestView.build(body, path="/v1/chat/completions"), policy)
        return None if result.rejection is None else result.rejection.code

    assert code({str(partial[0]): 5}, llama_cpp) == "output_cap_bypass"
    assert code({str(partial[0]): "100"}, llama_cpp) == "output_cap_bypass"
    assert code({str(partial[0]): -100}, llama_cpp) is None  # banning it is harmless
    assert code({str(ok_id): 100}, llama_cpp) is None
    assert code({str(partial[0]): 100}, vllm) is None  # vLLM stops at max_tokens
    assert code({str(partial[0]): 100}, base) == "output_cap_bypass"  # not known yet


def test_penalties_that_reward_repetition_are_refused_in_front_of_llama_cpp_python() -> None:
    """Steering the model into repeating a token that ends inside a character keeps
    llama-cpp-python past max_tokens as a bias on it does (the campaign's 14 s to the context
    for max_tokens 2): refused where the vocabulary has such tokens, not in front of vLLM."""
    from guard.policy import load_policy

    base = load_policy(None, env={})
    llama_cpp, vllm = base.with_upstream_kind("llama_cpp"), base.with_upstream_kind("vllm")

    def code(fields: dict[str, Any], policy: Policy) -> str | None:
        body = {"prompt": "request and server", "max_tokens": 2, **fields}
        result = check_tokens(RequestView.build(body, path="/v1/completions"), policy)
        return None if result.rejection is None else result.rejection.code

    for name, below, at_least in (
        ("frequency_penalty", -0.5, 0),
        ("presence_penalty", -2, 0.0),
        ("repeat_penalty", 0.5, 1),
    ):
        assert code({name: below}, llama_cpp) == "output_cap_bypass", name
        assert code({name: str(below)}, llama_cpp) == "output_cap_bypass", name  # lax, as pydantic
        assert code({name: below}, base) == "output_cap_bypass", name  # not known yet
        assert code({name: below}, vllm) is None, name  # vLLM stops at max_tokens
        assert code({name: at_least}, llama_cpp) is None, name
    # What ordinary requests send: discouraging repetition, or the defaults.
    assert (
        code({"frequency_penalty": 0.5, "presence_penalty": 0.3, "repeat_penalty": 1.1}, llama_cpp)
        is None
    )
    assert code({"frequency_penalty": None}, llama_cpp) is None

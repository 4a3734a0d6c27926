"""vLLM's pooling and scoring routes counted (issue 22): /score, /rerank, /classify, /pooling,
embeddings, with their fan-out caps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guard.checks import check_fanout, check_multimodal, check_tokens
from guard.policy import Policy, policy_from_yaml
from guard.request import RequestView
from guard.tokens import get_counter

ROUTES = "routes: [/score, /v1/score, /rerank, /v1/rerank, /v2/rerank, /classify, /pooling]\n"
DOC = "The committee reviewed the quarterly figures and adjourned until Thursday. " * 5


@pytest.fixture(scope="module")
def policy() -> Policy:
    return policy_from_yaml(ROUTES + "limits: {tokens: {exact_costs: true}}\n")


def _prompt(policy: Policy, path: str, body: dict[str, Any]) -> int:
    result = check_tokens(RequestView.build(body, path=path), policy)
    assert result.rejection is None, result.rejection
    return result.costs["prompt_tokens"]


def _pair(q: str, d: str) -> int:
    counter = get_counter()
    # Both texts, a token for a merge where they are joined, twice one sequence's specials.
    return counter.count(q) + counter.count(d) + 1 + 2 * counter.special_tokens


@pytest.mark.parametrize("path", ["/rerank", "/v1/rerank", "/v2/rerank"])
def test_rerank_counts_every_pair(policy: Policy, path: str) -> None:
    body = {"query": "What was decided?", "documents": [DOC, "Short.", DOC]}
    expected = _pair("What was decided?", DOC) * 2 + _pair("What was decided?", "Short.")
    assert _prompt(policy, path, body) == expected


@pytest.mark.parametrize(
    ("first", "second"),
    [("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2")],
)
def test_score_pairs_one_to_many_and_in_order(policy: Policy, first: str, second: str) -> None:
    one_to_many = {first: "q", second: [DOC, DOC, DOC]}
    assert _prompt(policy, "/score", one_to_many) == 3 * _pair("q", DOC)
    in_order = {first: ["a", "b"], second: ["c", DOC]}
    assert _prompt(policy, "/v1/score", in_order) == _pair("a", "c") + _pair("b", DOC)


def test_multimodal_inputs_and_the_instruction_count(policy: Policy) -> None:
    image = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    body = {
        "query": {"content": [{"type": "text", "text": "a red car"}, image]},
        "documents": ["car", "boat"],
        "instruction": "Judge relevance.",
    }
    tokens = policy.limits.tokens
    counted = _prompt(policy, "/rerank", body)
    assert counted >= 2 * (tokens.tokens_per_image + get_counter().count("Judge relevance."))


def test_a_score_template_is_rendered_per_pair_and_the_larger_count_wins(tmp_path: Path) -> None:
    template = tmp_path / "score.jinja"
    template.write_text(
        "<Instruct>: Judge whether the Document meets the requirements of the Query. " * 4
        + "{% for m in messages %}<{{ m.role }}>: {{ m.content }}\n{% endfor %}"
    )
    policy = policy_from_yaml(
        ROUTES + f"upstream: {{kind: vllm}}\nlimits: {{tokens: {{chat_template: '{template}'}}}}\n"
    )
    counter = get_counter()
    rendered = (
        counter.count(template.read_text().split("{%")[0] + "<query>: q\n<document>: d\n")
        + 2 * counter.special_tokens
    )
    assert _prompt(policy, "/rerank", {"query": "q", "documents": ["d", "d"]}) == 2 * rendered
    # A template that cannot render a pair does not refuse it: vLLM may not use it.
    chat_only = tmp_path / "chat.jinja"
    chat_only.write_text("{{ raise_exception('chat only') }}")
    raising = policy_from_yaml(
        ROUTES + f"upstream: {{kind: vllm}}\nlimits: {{tokens: {{chat_template: '{chat_only}'}}}}\n"
    )
    assert _prompt(raising, "/rerank", {"query": "q", "documents": ["d"]}) == _pair("q", "d")


def test_classify_and_pooling_read_inputs_and_messages(policy: Policy) -> None:
    counter = get_counter()
    specials = counter.special_tokens
    assert _prompt(policy, "/classify", {"input": ["good", "bad"]}) == sum(
        counter.count(t) + specials for t in ("good", "bad")
    )
    assert _prompt(policy, "/pooling", {"input": "good", "add_special_tokens": False}) == 1
    chat = {"messages": [{"role": "user", "content": DOC}]}
    assert _prompt(policy, "/pooling", chat) >= counter.count(DOC)
    assert _prompt(policy, "/pooling", {"data": {"text": DOC}}) >= counter.count(DOC)


def test_fan_out_caps_on_pairs_and_conversations(policy: Policy) -> None:
    limits = policy.limits.fanout

    def refused(path: str, body: dict[str, Any]) -> str | None:
        result = check_fanout(RequestView.build(body, path=path), policy)
        return None if result.rejection is None else result.rejection.code

    many = ["d"] * (limits.max_score_pairs + 1)
    assert refused("/rerank", {"query": "q", "documents": many}) == "prompts_exceeded"
    assert refused("/score", {"text_1": "q", "text_2": many}) == "prompts_exceeded"
    assert refused("/score", {"queries": many, "items": many}) == "prompts_exceeded"
    assert refused("/rerank", {"query": "q", "documents": many[:-1]}) is None
    conversations = [[{"role": "user", "content": "x"}]] * (limits.max_prompts + 1)
    assert refused("/v1/embeddings", {"messages": conversations}) == "prompts_exceeded"
    # Their messages together are held to max_messages: six of a sixth (and one) each.
    per = limits.max_messages // 6 + 1
    long = [[{"role": "user", "content": "x"}] * per] * 6
    assert refused("/v1/embeddings", {"input": long}) == "messages_exceeded"
    assert refused("/v1/embeddings", {"input": long[:5]}) is None


def test_score_inputs_go_through_the_multimodal_check(policy: Policy) -> None:
    huge = "data:image/png;base64," + "A" * (policy.limits.multimodal.max_data_url_bytes + 1)
    body = {
        "query": "q",
        "documents": [{"content": [{"type": "image_url", "image_url": {"url": huge}}]}],
    }
    result = check_multimodal(RequestView.build(body, path="/rerank"), policy)
    assert result.rejection is not None

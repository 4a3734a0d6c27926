"""The fan-out check: parameters that multiply the work of one request.

``n``, ``best_of``, ``logprobs`` / ``top_logprobs`` (and TGI's ``top_n_tokens``),
``prompt_logprobs``, the number of prompts in a list-valued ``prompt`` / ``input``, ``min_tokens``
against the output cap, the number and length of ``stop`` sequences, the size of ``logit_bias``,
of the token-id lists (``stop_token_ids``, ``allowed_token_ids``, ``logprob_token_ids``) and of
``bad_words``, the number of chat messages and content parts (and of conversations in a batch),
and the query-document pairs of vLLM's ``/score`` and ``/rerank``. Values are read leniently, as
upstreams read them (``"n": "1e6"`` is a million to vLLM), and a negative ``logprobs`` or
``prompt_logprobs`` (the whole vocabulary, to vLLM) is over any cap.

Codes (all 400): ``n_exceeded``, ``best_of_exceeded``, ``logprobs_exceeded``,
``top_logprobs_exceeded``, ``prompt_logprobs_exceeded``, ``prompts_exceeded``,
``min_tokens_exceeds_max_tokens``, ``stop_exceeded``, ``logit_bias_exceeded``,
``messages_exceeded``, ``content_parts_exceeded``, ``token_ids_exceeded``,
``bad_words_exceeded``.
"""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import Field

from guard._limits import LimitsModel, NonNegInt, PosInt
from guard.checks._output import effective_output
from guard.checks._policy import PolicyView
from guard.checks._result import CheckResult, pure_check
from guard.checks._tokens_limits import TokensLimits
from guard.errors import LimitExceeded
from guard.request import SCORE_SIDES, Endpoint, RequestView, lax_int, prompt_items, score_pairs

__all__ = ["FanoutLimits", "FanoutReads", "check_fanout"]


class FanoutLimits(LimitsModel):
    max_n: PosInt = Field(
        default=128,
        description="Largest `n` (choices per prompt): OpenAI's limit, 128 (vLLM has none). "
        "Each choice also reserves its output against the token rate. The `seed` preset: 16.",
    )
    max_best_of: PosInt = Field(
        default=20,
        description="Largest `best_of`: OpenAI's completions limit, 20 (TGI's default is 2; "
        "vLLM 0.32 ignores it). The `seed` preset: 2.",
    )
    max_logprobs: NonNegInt = Field(
        default=20,
        description="Largest completions `logprobs`: vLLM's default `--max-logprobs`, 20 "
        "(OpenAI's legacy completions allow 5). Negative values (vLLM: the whole vocabulary) "
        "are refused. The `seed` preset: 5.",
    )
    max_top_logprobs: NonNegInt = Field(
        default=20,
        description="Largest `top_logprobs` / TGI `top_n_tokens`: OpenAI's chat limit and "
        "vLLM's default `--max-logprobs`, 20. The `seed` preset: 5.",
    )
    max_prompt_logprobs: NonNegInt = Field(
        default=20,
        description="Largest vLLM `prompt_logprobs` (a score per prompt token per "
        "alternative): vLLM's default `--max-logprobs`, 20; -1 (the whole vocabulary) is "
        "refused. The `seed` preset: 5.",
    )
    max_prompts: PosInt = Field(
        default=64,
        description="Most prompts in a list-valued completions `prompt` (each is a sequence "
        "of up to the context window; vLLM GHSA-3mwp-wvh9-7528). In front of "
        "llama-cpp-python (`upstream.kind: llama_cpp`, set or detected) a completions `prompt` "
        "list is held to one whatever this says: its /v1/completions asserts it "
        '(`prompt: ["a", "b"]` is an empty 500), `prompts_exceeded` is the 400 instead.',
    )
    max_embedding_inputs: PosInt = Field(
        default=2048,
        description="Most inputs in a list-valued embeddings `input`: OpenAI's limit, 2048 "
        "(client libraries batch up to it: LangChain sends 1000). The `seed` preset: 64.",
    )
    max_stop_sequences: PosInt = Field(
        default=4,
        description="Most `stop` sequences (vLLM's `VLLM_MAX_STOP_STRINGS`, OpenAI and TGI: "
        "4; each is matched against every output delta).",
    )
    max_stop_bytes: PosInt = Field(
        default=256, description="Longest `stop` sequence, in UTF-8 bytes."
    )
    max_logit_bias: NonNegInt = Field(
        default=300, description="Most `logit_bias` entries (OpenAI's limit: 300)."
    )
    max_token_ids: NonNegInt = Field(
        default=1024,
        description="Most entries in each of `stop_token_ids`, `allowed_token_ids` and "
        "`logprob_token_ids` (vLLM builds a mask or scores each of them on every generated "
        "token; it caps only `logprob_token_ids`, at 128).",
    )
    max_bad_words: NonNegInt = Field(
        default=128,
        description="Most `bad_words` (each is tokenized twice and checked on every token; "
        "vLLM's `VLLM_MAX_NUM_BAD_WORDS`: 128).",
    )
    max_messages: PosInt = Field(
        default=2048,
        description="Most chat messages in one request (long agent sessions reach hundreds; "
        "the prompt's tokens bound the rest). The `seed` preset: 512.",
    )
    max_score_pairs: PosInt = Field(
        default=256,
        description="Most query-document pairs in one vLLM `/score` or `/rerank` request "
        "(`documents`, `items`, `text_2`, `data_2`, or the longer of the two lists): each pair "
        "is a sequence the model runs, its texts counted as prompt tokens "
        "(`prompts_exceeded`). Batched conversations in embeddings and pooling `messages` / "
        "`input` are held to `max_prompts` (each is a sequence) and their messages together to "
        "`max_messages`.",
    )
    max_content_parts: PosInt = Field(
        default=4096,
        description="Most content parts over all messages of one request (some clients send "
        "every message's content as a list of parts). The `seed` preset: 256.",
    )


def _cap(code: str, name: str, value: int, limit: int, *, negative_is_all: bool = False) -> None:
    """Refuse ``value`` above ``limit``; a negative value too when it means "all" (vLLM's -1
    logprobs). Other negatives are the schema check's (and the upstream's) to refuse."""
    if value > limit:
        raise LimitExceeded(code, f"{name} is {value}; the limit is {limit}", param=name)
    if value < 0 and negative_is_all:
        raise LimitExceeded(
            code, f"{name} is {value} (all of the vocabulary); the limit is {limit}", param=name
        )


# Token-id lists vLLM masks or scores on every generated token.
_TOKEN_ID_LISTS = ("stop_token_ids", "allowed_token_ids", "logprob_token_ids")

# Every top-level field the check reads besides messages; a body with none of them passes
# all but the messages part (absent fields are None, and None passes each cap).
_FANOUT_FIELDS = frozenset(
    {
        "n",
        "best_of",
        "logprobs",
        "top_logprobs",
        "top_n_tokens",
        "prompt_logprobs",
        "prompt",
        "input",
        "min_tokens",
        "stop",
        "logit_bias",
        *_TOKEN_ID_LISTS,
        "bad_words",
        *(side for pairing in SCORE_SIDES.values() for pair in pairing for side in pair),
    }
)


def _count(items: Any) -> int:
    return len(items) if isinstance(items, list | dict) else 0


class FanoutReads(Protocol):
    """The limit sets the fan-out check reads."""

    @property
    def fanout(self) -> FanoutLimits: ...

    @property
    def tokens(self) -> TokensLimits: ...


@pure_check
def check_fanout(view: RequestView, policy: PolicyView[FanoutReads]) -> CheckResult | None:
    body = view.obj
    if body is None:
        return None
    limits = policy.limits.fanout
    if body.keys().isdisjoint(_FANOUT_FIELDS):  # the usual request: only messages to count
        _check_messages(body, limits)
        return None
    _check_samples(body, limits)
    _check_logprobs(body, limits)
    _check_prompts(body, view.endpoint, limits)
    _check_pairs(body, view, limits.max_score_pairs)
    _check_min_tokens(body, view, policy)
    _check_stop(body.get("stop"), limits.max_stop_sequences, limits.max_stop_bytes)
    _check_entries(body, limits)
    _check_messages(body, limits)
    return None


def _check_samples(body: dict[str, Any], limits: FanoutLimits) -> None:
    """``n`` and ``best_of``: the sequences generated for one request."""
    n = lax_int(body.get("n"))
    if n is not None:
        _cap("n_exceeded", "n", n, limits.max_n)
    best_of = lax_int(body.get("best_of"))
    if best_of is not None:
        _cap("best_of_exceeded", "best_of", best_of, limits.max_best_of)


def _check_logprobs(body: dict[str, Any], limits: FanoutLimits) -> None:
    """The log-probabilities asked for: per output token, the top ones, per prompt token."""
    logprobs = body.get("logprobs")
    if not isinstance(logprobs, bool):  # chat's logprobs is a switch; completions' a count
        count = lax_int(logprobs)
        if count is not None:
            _cap("logprobs_exceeded", "logprobs", count, limits.max_logprobs, negative_is_all=True)
    for name in ("top_logprobs", "top_n_tokens"):
        count = lax_int(body.get(name))
        if count is not None:
            _cap(
                "top_logprobs_exceeded", name, count, limits.max_top_logprobs, negative_is_all=True
            )
    count = lax_int(body.get("prompt_logprobs"))
    if count is not None:
        _cap(
            "prompt_logprobs_exceeded",
            "prompt_logprobs",
            count,
            limits.max_prompt_logprobs,
            negative_is_all=True,
        )


def _check_prompts(body: dict[str, Any], endpoint: Endpoint, limits: FanoutLimits) -> None:
    """The number of prompts in a list-valued ``prompt`` or ``input`` (embeddings inputs have
    their own cap)."""
    for name in ("prompt", "input"):
        items = prompt_items(body.get(name))
        if items is None:
            continue
        embeddings = endpoint == "embeddings" and name == "input"
        most = limits.max_embedding_inputs if embeddings else limits.max_prompts
        if len(items) > most:
            raise LimitExceeded(
                "prompts_exceeded",
                f"{name} holds {len(items)} {'inputs' if embeddings else 'prompts'}; the limit "
                f"is {most}",
                param=name,
            )


def _check_pairs(body: dict[str, Any], view: RequestView, max_pairs: int) -> None:
    """The query-document pairs of a score or rerank request (each is a sequence)."""
    for first, second, pairs in score_pairs(body, view.endpoint):
        if pairs > max_pairs:
            raise LimitExceeded(
                "prompts_exceeded",
                f"{first} and {second} make {pairs} query-document pairs; the limit is {max_pairs}",
                param=second,
            )


def _check_min_tokens(
    body: dict[str, Any], view: RequestView, policy: PolicyView[FanoutReads]
) -> None:
    """``min_tokens`` against the output cap (the request's, else the policy's)."""
    min_tokens = lax_int(body.get("min_tokens"))
    if min_tokens is None or min_tokens <= 0:
        return
    tokens = policy.limits.tokens
    cap = effective_output(body, view.endpoint, tokens)
    if cap is None:
        cap = tokens.output_limit
    if cap is not None and min_tokens > cap:
        raise LimitExceeded(
            "min_tokens_exceeds_max_tokens",
            f"min_tokens is {min_tokens}, more than the output cap of {cap}",
            param="min_tokens",
        )


def _check_entries(body: dict[str, Any], limits: FanoutLimits) -> None:
    """The sizes of ``logit_bias``, the token-id lists and ``bad_words``."""
    _cap_entries("logit_bias_exceeded", "logit_bias", body.get("logit_bias"), limits.max_logit_bias)
    for name in _TOKEN_ID_LISTS:
        _cap_entries("token_ids_exceeded", name, body.get(name), limits.max_token_ids)
    _cap_entries("bad_words_exceeded", "bad_words", body.get("bad_words"), limits.max_bad_words)


def _cap_entries(code: str, name: str, items: Any, limit: int) -> None:
    entries = _count(items)
    if entries > limit:
        raise LimitExceeded(code, f"{name} has {entries} entries; the limit is {limit}", param=name)


def _check_stop(stop: Any, max_sequences: int, max_bytes: int) -> None:
    sequences = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
    if len(sequences) > max_sequences:
        raise LimitExceeded(
            "stop_exceeded",
            f"{len(sequences)} stop sequences; the limit is {max_sequences}",
            param="stop",
        )
    for i, item in enumerate(sequences):
        if not isinstance(item, str):
            continue
        size = len(item)
        if size <= max_bytes and not item.isascii():
            size = len(item.encode("utf-8", "surrogatepass"))
        if size > max_bytes:
            raise LimitExceeded(
                "stop_exceeded",
                f"a stop sequence is longer than {max_bytes} bytes",
                param="stop" if isinstance(stop, str) else f"stop[{i}]",
            )


def _check_messages(body: dict[str, Any], limits: FanoutLimits) -> None:
    # Chat messages, and the responses API's input items (the same thing by another name); a
    # batch of conversations (vLLM's batched chat and embeddings): each is a sequence.
    max_messages, max_parts = limits.max_messages, limits.max_content_parts
    for name in ("messages", "input"):
        items = body.get(name)
        if not isinstance(items, list) or not items:
            continue
        if isinstance(items[0], list):
            if not _are_messages(items[0]):
                continue  # token-id prompts (a list of id lists): the prompts' count
            if len(items) > limits.max_prompts:
                raise LimitExceeded(
                    "prompts_exceeded",
                    f"{name} holds {len(items)} conversations; the limit is {limits.max_prompts}",
                    param=name,
                )
            batch = [(f"{name}[{i}]", c) for i, c in enumerate(items) if isinstance(c, list)]
        elif name == "input" and not _are_messages(items):
            continue
        else:
            batch = [(name, items)]
        messages = parts = 0
        for where, conversation in batch:
            messages += len(conversation)
            if messages > max_messages:
                said = (
                    f"{messages} messages; the limit is {max_messages}"
                    if len(batch) == 1
                    else f"more than {max_messages} messages in the conversations"
                )
                raise LimitExceeded("messages_exceeded", said, param=where)
            for i, message in enumerate(conversation):
                content = message.get("content") if isinstance(message, dict) else None
                if isinstance(content, list):
                    parts += len(content)
                    if parts > max_parts:
                        raise LimitExceeded(
                            "content_parts_exceeded",
                            f"more than {max_parts} content parts in the request",
                            param=f"{where}[{i}].content",
                        )


def _are_messages(items: list[Any]) -> bool:
    return bool(items) and isinstance(items[0], dict)

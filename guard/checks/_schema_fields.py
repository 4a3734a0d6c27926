"""Field tables of the schema check: which top-level fields each endpoint knows and their types.

Known fields are OpenAI's and the common extensions of vLLM, SGLang, TGI and llama.cpp whose
effect is either harmless or bounded by another check. Fields that let a request reach code or
limits behind the guard's back are not known (``logits_processors``, ``vllm_xargs``,
``kv_transfer_params``, ...): with ``unknown_fields: reject`` they are refused.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from guard.errors import GuardError
from guard.request import (
    PART_TYPES,
    TEXT_TYPES,
    Path,
    classify_part,
    fmt_path,
    is_int,
    is_number,
    lax_bool,
)

Validator = Callable[[Any, Path], None]

INVALID_TYPE = "invalid_type"
INVALID_VALUE = "invalid_value"
CONTENT_PART_NOT_SUPPORTED = "content_part_not_supported"


def _type_error(path: Path, expected: str) -> GuardError:
    where = fmt_path(path)
    return GuardError(INVALID_TYPE, f"{where} must be {expected}", param=where)


def _value_error(path: Path, what: str) -> GuardError:
    where = fmt_path(path)
    return GuardError(INVALID_VALUE, f"{where} {what}", param=where)


def integer(minimum: int | None = None) -> Validator:
    def check(value: Any, path: Path) -> None:
        if not is_int(value):
            raise _type_error(path, "an integer")
        if minimum is not None and value < minimum:
            raise _value_error(path, f"must be >= {minimum}")

    return check


def number(value: Any, path: Path) -> None:
    if not is_number(value):
        raise _type_error(path, "a number")


def boolean(value: Any, path: Path) -> None:
    # Read as vLLM's pydantic models read it ("false", 0 and "no" are booleans to them).
    if lax_bool(value) is None:
        raise _type_error(path, "true or false")


def string(value: Any, path: Path) -> None:
    if not isinstance(value, str):
        raise _type_error(path, "a string")


def obj(value: Any, path: Path) -> None:
    if not isinstance(value, dict):
        raise _type_error(path, "an object")


def array(value: Any, path: Path) -> None:
    if not isinstance(value, list):
        raise _type_error(path, "an array")


def anything(value: Any, path: Path) -> None:
    return None


def string_or_object(value: Any, path: Path) -> None:
    if not isinstance(value, str | dict):
        raise _type_error(path, "a string or an object")


_INT_ONLY = frozenset({int})
_STR_ONLY = frozenset({str})


def string_list(value: Any, path: Path) -> None:
    if not isinstance(value, list):
        raise _type_error(path, "an array of strings")
    if _STR_ONLY.issuperset(map(type, value)):  # in C; the loop below only finds the culprit
        return
    for i, item in enumerate(value):
        if not isinstance(item, str):
            raise _type_error((*path, i), "a string")


def int_list(value: Any, path: Path) -> None:
    if not isinstance(value, list):
        raise _type_error(path, "an array of integers")
    if _INT_ONLY.issuperset(map(type, value)):  # in C; the loop below only finds the culprit
        return
    for i, item in enumerate(value):
        if not is_int(item):
            raise _type_error((*path, i), "an integer")


def stop(value: Any, path: Path) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _type_error(path, "a string or an array of strings")
    string_list(value, path)


def logit_bias(value: Any, path: Path) -> None:
    if not isinstance(value, dict):
        raise _type_error(path, "an object of token ids to numbers")
    for key, bias in value.items():
        text = key.strip().removeprefix("-")
        if not (text.isascii() and text.isdigit() and len(text) <= 10):
            raise _value_error(path, "keys must be token ids")
        if not is_number(bias):
            raise _type_error((*path, key), "a number")
        if not -100 <= bias <= 100:
            raise _value_error((*path, key), "must be between -100 and 100")


def string_map(value: Any, path: Path) -> None:
    if not isinstance(value, dict):
        raise _type_error(path, "an object of strings")
    for key, item in value.items():
        if not isinstance(item, str):
            raise _type_error((*path, key), "a string")


_MAX_TOKEN_ID = 2**31 - 1


def prompt(value: Any, path: Path) -> None:
    """A string, a list of strings, a list of token ids, or a list of token-id lists."""
    if isinstance(value, str):
        return
    expected = "a string, an array of strings, of token ids or of token-id arrays"
    if not isinstance(value, list):
        raise _type_error(path, expected)
    if not value:
        raise _value_error(path, "must not be empty")
    first = value[0]
    if is_int(first):
        _token_ids(value, path)
    elif isinstance(first, str):
        string_list(value, path)
    elif isinstance(first, list):
        for i, item in enumerate(value):
            if not isinstance(item, list):
                raise _type_error((*path, i), "an array of token ids")
            if not item:
                raise _value_error((*path, i), "must not be empty")
            _token_ids(item, (*path, i))
    else:
        raise _type_error(path, expected)


def _token_ids(value: list[Any], path: Path) -> None:
    # Types, then range, each in C; the loop below runs only to name the culprit.
    if not value or (
        _INT_ONLY.issuperset(map(type, value)) and min(value) >= 0 and max(value) <= _MAX_TOKEN_ID
    ):
        return
    for i, item in enumerate(value):
        if not is_int(item):
            raise _type_error((*path, i), "a token id (an integer)")
        if not 0 <= item <= _MAX_TOKEN_ID:
            raise _value_error((*path, i), "must be a token id >= 0")


ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


# The usual message: a role and string content, typed in one pass with no path built.
_PLAIN_MESSAGE_KEYS = frozenset({"role", "content"})


def messages(value: Any, path: Path) -> None:
    if not isinstance(value, list):
        raise _type_error(path, "an array of messages")
    if not value:
        raise _value_error(path, "must not be empty")
    for i, message in enumerate(value):
        if (
            type(message) is dict
            and message.keys() <= _PLAIN_MESSAGE_KEYS
            and type(message.get("role")) is str
            and message["role"] in ROLES
            and type(message.get("content")) is str
        ):
            continue
        at = (*path, i)
        if not isinstance(message, dict):
            raise _type_error(at, "an object")
        role = message.get("role")
        if not isinstance(role, str):
            raise _type_error((*at, "role"), "a string")
        if role not in ROLES:
            raise _value_error((*at, "role"), f"must be one of {', '.join(sorted(ROLES))}")
        content_parts(message.get("content"), (*at, "content"))
        for key in ("name", "tool_call_id", "reasoning_content", "reasoning"):
            if message.get(key) is not None:
                string(message[key], (*at, key))
        calls = message.get("tool_calls")
        if calls is not None:
            array(calls, (*at, "tool_calls"))
            for j, call in enumerate(calls):
                obj(call, (*at, "tool_calls", j))
                if call.get("function") is not None:
                    obj(call["function"], (*at, "tool_calls", j, "function"))


# Part types the guard reads, and the string field each text type must carry.
_PART_TEXT = TEXT_TYPES
_PART_TYPES = PART_TYPES


def conversations(value: Any, path: Path) -> None:
    """Chat messages, or a list of conversations (vLLM's batched embeddings chat)."""
    if isinstance(value, list) and value and isinstance(value[0], list):
        for i, conversation in enumerate(value):
            messages(conversation, (*path, i))
        return
    messages(value, path)


def embeddings_input(value: Any, path: Path) -> None:
    """A prompt (:func:`prompt`), or chat messages or a batch of conversations given as
    ``input`` (vLLM 0.32's EmbeddingChatInputRequest, EmbeddingBatchChatInputRequest)."""
    if isinstance(value, list) and value:
        first = value[0]
        if isinstance(first, dict) or (
            isinstance(first, list) and first and isinstance(first[0], dict)
        ):
            conversations(value, path)
            return
    prompt(value, path)


def content_parts(value: Any, path: Path) -> None:
    """Message content: null, a string, or an array of parts: strings (text to vLLM) and
    objects with a ``type`` the guard reads (text types with their text as a string). A part
    with a ``uuid``, or without a ``type`` (vLLM's ``{"image_url": "..."}``, read by its first
    media key), is the multimodal check's to judge (vLLM then reads the part by its keys)."""
    if value is None or isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _type_error(path, "a string or an array of content parts")
    for i, part in enumerate(value):
        if isinstance(part, str):
            continue
        at = (*path, i)
        if not isinstance(part, dict):
            raise _type_error(at, "a string or an object")
        if part.get("uuid") is not None:
            continue
        if "type" not in part and classify_part(part).inferred:
            continue
        kind = part.get("type")
        if not isinstance(kind, str):
            raise _type_error((*at, "type"), "a string")
        if kind not in _PART_TYPES:
            raise GuardError(
                CONTENT_PART_NOT_SUPPORTED,
                f"content parts of type {kind[:40]!r} are not accepted; known types: "
                f"{', '.join(sorted(_PART_TYPES))}",
                param=fmt_path((*at, "type")),
            )
        field = _PART_TEXT.get(kind)
        if field is not None and not isinstance(part.get(field), str):
            raise _type_error((*at, field), "a string")


def tools(value: Any, path: Path) -> None:
    if not isinstance(value, list):
        raise _type_error(path, "an array of tools")
    for i, tool in enumerate(value):
        at = (*path, i)
        if not isinstance(tool, dict):
            raise _type_error(at, "an object")
        function = tool.get("function")
        if function is not None:
            obj(function, (*at, "function"))
            if not isinstance(function.get("name"), str):
                raise _type_error((*at, "function", "name"), "a string")


def named_tool_choice(body: dict[str, Any]) -> None:
    """A ``tool_choice`` object makes vLLM 0.32 look the name up in the raw ``tools``, before
    its request model validates them (``check_tool_usage``): ``tool["function"]["name"]`` on
    each tool up to the one named. A tool there without a ``function`` object (``{}``, a custom
    tool, ``"function": null``) is a KeyError or TypeError: a 500. Refused here, in vLLM's
    order (tools after the named one are not read there)."""
    choice = body.get("tool_choice")
    if not isinstance(choice, dict):
        return
    function = choice.get("function")
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or not name:
        return  # vLLM refuses these itself (400)
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else ()):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(fn, dict) or "name" not in fn:
            raise _value_error(
                ("tools", i),
                "has no function with a name, and tool_choice names a function (vLLM looks "
                "the name up in every tool before it: a 500)",
            )
        if fn["name"] == name:
            return
    # A name no tool has: OpenAI and vLLM answer 400, llama-cpp-python a 500 ("Tool choice
    # '...' not found in tools").
    raise _value_error(
        ("tool_choice", "function", "name"), f"names {name[:64]!r}, which no tool in tools has"
    )


def named_function_call(body: dict[str, Any]) -> None:
    """The legacy ``function_call`` naming a function: it must be one of ``functions``
    (llama-cpp-python looks it up there and answers 500 when it is not)."""
    call = body.get("function_call")
    name = call.get("name") if isinstance(call, dict) else None
    if not isinstance(name, str) or not name:
        return
    functions = body.get("functions")
    for fn in functions if isinstance(functions, list) else ():
        if isinstance(fn, dict) and fn.get("name") == name:
            return
    raise _value_error(
        ("function_call", "name"), f"names {name[:64]!r}, which no function in functions has"
    )


_GUIDED_FIELDS = ("guided_json", "guided_regex", "guided_choice", "guided_grammar")


def structured_output_field(body: dict[str, Any]) -> str | None:
    """The field that makes vLLM constrain this request's output with a grammar, if any:
    ``structured_outputs`` (any constraint), the legacy ``guided_*``, a ``response_format``
    other than text, a ``tool_choice`` of ``required`` or a named function."""
    so = body.get("structured_outputs")
    if isinstance(so, dict) and any(v is not None for v in so.values()):
        return "structured_outputs"
    for name in _GUIDED_FIELDS:
        if body.get(name) is not None:
            return name
    rf = body.get("response_format")
    if isinstance(rf, dict) and rf.get("type") not in (None, "text"):
        return "response_format"
    choice = body.get("tool_choice")
    if choice == "required" or isinstance(choice, dict):
        return "tool_choice"
    return None


def token_mask_combination(body: dict[str, Any]) -> None:
    """vLLM 0.32 masks tokens for ``allowed_token_ids`` and ``bad_words`` and again for the
    structured-output grammar, and validates neither against the other: when no token is
    left that both allow (a few ids, or banned words that are the grammar's only way on), the
    sampler draws a token the grammar rejects and the engine terminates the request, a 500
    ("grammar rejected tokens"). Whether the sets meet depends on the vocabulary and the
    grammar, which the guard does not model, so the combination is refused."""
    for name in ("allowed_token_ids", "bad_words"):
        if not body.get(name):
            continue
        other = structured_output_field(body)
        if other is not None:
            raise _value_error(
                (name,),
                f"cannot be combined with structured output ({other}): vLLM fails the "
                "request (a 500) when no token is left that both allow",
            )


def typed_object(value: Any, path: Path) -> None:
    """An object with a string ``type`` (``response_format``)."""
    obj(value, path)
    if not isinstance(value.get("type"), str):
        raise _type_error((*path, "type"), "a string")


def responses_input(value: Any, path: Path) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise _type_error(path, "a string or an array of input items")
    for i, item in enumerate(value):
        at = (*path, i)
        if not isinstance(item, dict):
            raise _type_error(at, "an object")
        content_parts(item.get("content"), (*at, "content"))
        output = item.get("output")
        if isinstance(output, list):
            content_parts(output, (*at, "output"))


# -- the tables -------------------------------------------------------------------------------

_SAMPLING: dict[str, Validator] = {
    "model": string,
    "n": integer(1),
    "best_of": integer(1),
    "max_tokens": integer(0),
    "temperature": number,
    "top_p": number,
    "top_k": integer(-1),
    "min_p": number,
    "presence_penalty": number,
    "frequency_penalty": number,
    "repetition_penalty": number,
    "length_penalty": number,
    "seed": integer(),
    "stop": stop,
    "stop_token_ids": int_list,
    "include_stop_str_in_output": boolean,
    "ignore_eos": boolean,
    "min_tokens": integer(0),
    "logit_bias": logit_bias,
    "top_logprobs": integer(0),
    "prompt_logprobs": integer(),
    "stream": boolean,
    "stream_options": obj,
    "user": string,
    "skip_special_tokens": boolean,
    "spaces_between_special_tokens": boolean,
    "truncate_prompt_tokens": integer(1),
    "allowed_token_ids": int_list,
    "bad_words": string_list,
    "priority": integer(),
    "request_id": string,
    "cache_salt": string,
    "add_special_tokens": boolean,
    "use_beam_search": boolean,
    "return_tokens_as_token_ids": boolean,
    "return_token_ids": boolean,
    "response_format": typed_object,
    "metadata": obj,
    "store": boolean,
    "service_tier": string,
    # guided decoding (bounded by the guided check)
    "guided_json": string_or_object,
    "guided_regex": string,
    "guided_choice": string_list,
    "guided_grammar": string,
    "guided_decoding_backend": string,
    "guided_whitespace_pattern": string,
    "structured_outputs": obj,
    "structural_tag": string_or_object,
    "regex": string,
    "ebnf": string,
    "json_schema": string_or_object,
    "grammar": string_or_object,
    # llama.cpp / TGI spellings (bounded by the tokens and fan-out checks)
    "n_predict": integer(),
    "max_new_tokens": integer(0),
    "top_n_tokens": integer(0),
    "cache_prompt": boolean,
    # schedguard extras (bounded by the templates check)
    "prompt_template": string,
    "template_vars": string_map,
    "chat_template": string,
    "chat_template_kwargs": obj,
}

CHAT: dict[str, Validator] = {
    **_SAMPLING,
    "messages": messages,
    "max_completion_tokens": integer(1),
    "max_tokens": integer(1),
    "logprobs": boolean,
    "echo": boolean,
    "tools": tools,
    "functions": tools,
    "tool_choice": string_or_object,
    "function_call": string_or_object,
    "parallel_tool_calls": boolean,
    "add_generation_prompt": boolean,
    "continue_final_message": boolean,
    "documents": array,
    "modalities": string_list,
    "audio": obj,
    "prediction": obj,
    "reasoning_effort": string,
    "web_search_options": obj,
    "separate_reasoning": boolean,
    "stream_reasoning": boolean,
}

COMPLETIONS: dict[str, Validator] = {
    **_SAMPLING,
    "prompt": prompt,
    "suffix": string,
    "echo": boolean,
    "logprobs": integer(),
}

EMBEDDINGS: dict[str, Validator] = {
    "model": string,
    "input": embeddings_input,
    "messages": conversations,
    "add_generation_prompt": boolean,
    "continue_final_message": boolean,
    "chat_template": string,
    "chat_template_kwargs": obj,
    "encoding_format": string,
    "dimensions": integer(1),
    "user": string,
    "truncate_prompt_tokens": integer(1),
    "add_special_tokens": boolean,
    "priority": integer(),
    "request_id": string,
}

RESPONSES: dict[str, Validator] = {
    "model": string,
    "input": responses_input,
    "instructions": string,
    "max_output_tokens": integer(1),
    "temperature": number,
    "top_p": number,
    "top_logprobs": integer(0),
    "stream": boolean,
    "tools": tools,
    "tool_choice": string_or_object,
    "parallel_tool_calls": boolean,
    "previous_response_id": string,
    "store": boolean,
    "metadata": obj,
    "text": obj,
    "reasoning": obj,
    "truncation": string,
    "user": string,
    "include": string_list,
    "background": boolean,
    "service_tier": string,
    "prompt_template": string,
    "template_vars": string_map,
    "chat_template": string,
    "chat_template_kwargs": obj,
}

TOKENIZE: dict[str, Validator] = {
    "model": string,
    "prompt": prompt,
    "messages": messages,
    "add_special_tokens": boolean,
    "add_generation_prompt": boolean,
    "continue_final_message": boolean,
    "return_token_strs": boolean,
    "tools": tools,
    "chat_template": string,
    "chat_template_kwargs": obj,
}

# Required fields: at least one of each group must be present (and not null).
REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    "chat": (("messages",),),
    "completions": (("prompt", "prompt_template"),),
    "embeddings": (("input", "messages"),),
    "tokenize": (("prompt", "messages"),),
}

# Both set: the upstream reads one of them (which one varies), so the request is ambiguous.
EXCLUSIVE: dict[str, tuple[tuple[str, str], ...]] = {
    "completions": (("prompt", "prompt_template"),),
    "embeddings": (("input", "messages"),),
    "tokenize": (("prompt", "messages"),),
}

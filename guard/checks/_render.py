"""Exact prompt counts: the conversation rebuilt as the upstream builds it, rendered with the
upstream's own chat template in the hardened sandbox, and tokenized.

The template comes from the policy (``limits.tokens.chat_template``: a ``.jinja`` file, a
``tokenizer_config.json`` or a model directory; ``auto`` finds one next to a ``tokenizer.json``
tokenizer), or from the request when the policy accepts request templates (the upstream then
renders that one). Each upstream listed in ``limits.tokens.render_like`` builds the
conversation its own way, and the largest count wins:

- ``vllm`` (0.32, ``vllm/renderers/chat_utils.py`` and ``hf.py``): content becomes a list of
  ``{"type": "text", "text": ..., **extra keys}`` / ``{"type": "image", **extra keys}`` dicts
  when the template loops over content (``openai`` format, detected from the template's syntax
  tree as vLLM detects it), else the texts joined with ``"\\n"``; ``refusal``/``thinking`` parts
  become text, ``tool_reference`` its name; ``reasoning_content`` becomes ``reasoning`` (both
  keys set); ``tool_calls`` only on assistant messages, each call's ``arguments`` parsed into a
  dict (``{}`` when it is not a JSON object); ``tool_call_id`` only on tool messages (whose text
  parts are joined); ``name`` and ``task`` when strings; ``tools`` on developer messages;
  developer messages become system ones (and all system messages merge into the first) when the
  template does not mention ``developer``; tools as vLLM dumps them; the template's variables
  merged as vLLM merges them (``chat_template_kwargs``, then ``add_generation_prompt``,
  ``continue_final_message``, ``documents``, ``reasoning_effort`` and ``enable_thinking``), over
  the tokenizer's special tokens (``bos_token``, ...);
- ``llama_cpp`` (llama-cpp-python 0.3.36's ``Jinja2ChatFormatter``): the messages as sent (list
  content and ``arguments`` strings untouched), ``tools``, ``functions``, ``function_call``,
  ``tool_choice``, ``add_generation_prompt`` true, ``bos_token``/``eos_token``.

Each distinct rendered prompt is counted once, with an early stop past the limit, by the
policy's tokenizer, special-token text parsed as the special tokens, as both servers do (the
sandbox bounds the render itself: output, values, loops, time).
``continue_final_message`` (which cuts the prompt) is not applied: the count stays an upper
bound. Media placeholders are not rendered: the media tokens are the per-item estimates.

A render that fails the way the upstream's would not (the sandbox refusing an operation, the
template raising on this input) or that runs past the sandbox's deadline returns ``None``: the
caller falls back to the bound. The other budget limits (tokens, output, values, loops) are
refusals: the upstream would pay them too.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import jinja2
import jinja2.nodes
from jinja2.ext import loopcontrols

from guard.budget import Budget, Limits
from guard.checks._parts import KNOWN_PART_FIELDS, classify_part
from guard.checks._text import ChatInput, parse_arguments
from guard.errors import LimitExceeded, TemplateError
from guard.jinja import ChatTemplateLimits, GuardedTemplate, compile_chat_template
from guard.jinja import render_chat_template as _render
from guard.tokens import TokenCounter

__all__ = [
    "ChatTemplateSource",
    "ContentFormat",
    "check_chat_template_source",
    "detect_content_format",
    "llama_cpp_variables",
    "load_chat_template",
    "render_count",
    "vllm_variables",
]

ContentFormat = Literal["string", "openai"]
Flavour = Literal["vllm", "llama_cpp"]

_SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
# Transformers' `{% generation %}` blocks (assistant masks) render their body: a no-op here.
_GENERATION_TAG = re.compile(r"\{%(-?)\s*(end)?generation\s*(-?)%\}")


@dataclass(frozen=True)
class ChatTemplateSource:
    """The upstream's chat template(s) and the special tokens its tokenizer exposes to them.

    ``tool_use``: the template ``tokenizer_config.json`` names for requests with tools.
    """

    default: str
    tool_use: str | None
    special_tokens: tuple[tuple[str, str], ...]
    origin: str

    def source_for(self, has_tools: bool) -> str:
        return self.tool_use if has_tools and self.tool_use is not None else self.default


def _no_generation_tags(source: str) -> str:
    def repl(m: re.Match[str]) -> str:
        left, end, right = m.group(1), m.group(2), m.group(3)
        return f"{{%{left} endif {right}%}}" if end else f"{{%{left} if true {right}%}}"

    return _GENERATION_TAG.sub(repl, source)


def _special_tokens(config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    out = []
    for name in _SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out.append((name, value))
    return tuple(out)


def _read_config(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def _templates_of(config: dict[str, Any], path: Path) -> tuple[str, str | None]:
    value = config.get("chat_template")
    if isinstance(value, str):
        return value, None
    if isinstance(value, list):
        named = {
            t.get("name"): t.get("template")
            for t in value
            if isinstance(t, dict) and isinstance(t.get("template"), str)
        }
        default = named.get("default")
        if isinstance(default, str):
            tool_use = named.get("tool_use")
            return default, tool_use if isinstance(tool_use, str) else None
    raise ValueError(f"{path} has no chat_template")


# -- GGUF metadata (llama.cpp models carry their chat template and special tokens) ---------------

_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
_GGUF_SCALARS |= {10: "<Q", 11: "<q", 12: "<d"}
_GGUF_WANTED = (
    "tokenizer.chat_template",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, fmt: str) -> Any:
        value = struct.unpack_from(fmt, self.data, self.pos)[0]
        self.pos += struct.calcsize(fmt)
        return value

    def string(self) -> str:
        n = self.take("<Q")
        text = self.data[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return text

    def value(self, kind: int, keep: bool) -> Any:
        if kind in _GGUF_SCALARS:
            return self.take(_GGUF_SCALARS[kind])
        if kind == 8:
            return self.string()
        if kind == 9:
            inner, n = self.take("<I"), self.take("<Q")
            if inner in _GGUF_SCALARS and not keep:
                self.pos += n * struct.calcsize(_GGUF_SCALARS[inner])
                return None
            items = [self.value(inner, keep) for _ in range(n)]
            return items if keep else None
        raise ValueError(f"unknown GGUF value type {kind}")


def _gguf_metadata(path: Path) -> dict[str, Any]:
    """The chat template and special-token metadata of a GGUF file (the header only is read:
    metadata comes before the tensors)."""
    with path.open("rb") as f:
        head = f.read(64 << 20)  # metadata (vocabulary included) is far smaller
    reader = _Reader(head)
    if reader.take("<4s") != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    reader.take("<I")  # version
    reader.take("<Q")  # tensor count
    out: dict[str, Any] = {}
    for _ in range(reader.take("<Q")):
        key = reader.string()
        kind = reader.take("<I")
        value = reader.value(kind, keep=key in _GGUF_WANTED)
        if key in _GGUF_WANTED:
            out[key] = value
    return out


def _from_gguf(path: Path) -> ChatTemplateSource:
    meta = _gguf_metadata(path)
    template = meta.get("tokenizer.chat_template")
    if not isinstance(template, str):
        raise ValueError(f"{path} has no tokenizer.chat_template")
    tokens = meta.get("tokenizer.ggml.tokens") or []
    special = []
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
        index = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and 0 <= index < len(tokens):
            special.append((name, str(tokens[index])))
    return ChatTemplateSource(_no_generation_tags(template), None, tuple(special), str(path))


@functools.lru_cache(maxsize=16)
def load_chat_template(spec: str | None, tokenizer: str) -> ChatTemplateSource | None:
    """The template ``limits.tokens.chat_template`` names (``auto``: a ``chat_template.jinja``,
    a ``tokenizer_config.json`` with one, or a single ``.gguf`` model next to a
    ``tokenizer.json`` tokenizer; None when there is none). Raises OSError/ValueError when a
    named file cannot be used."""
    if spec is None:
        return None
    if spec == "auto":
        if not tokenizer.endswith(".json"):
            return None
        directory = Path(tokenizer).resolve().parent
        if not (directory / "chat_template.jinja").is_file():
            candidate = directory / "tokenizer_config.json"
            if not candidate.is_file() or "chat_template" not in _read_config(candidate):
                ggufs = sorted(directory.glob("*.gguf"))
                return _from_gguf(ggufs[0]) if len(ggufs) == 1 else None
        path = directory
    else:
        path = Path(spec).expanduser().resolve()
    if path.suffix == ".gguf":
        return _from_gguf(path)
    if path.is_dir():
        jinja_file = path / "chat_template.jinja"
        config_file = path / "tokenizer_config.json"
    elif path.suffix == ".json":
        jinja_file, config_file = None, path
    else:
        jinja_file, config_file = path, path.parent / "tokenizer_config.json"
    if jinja_file is not None and not path.is_dir() and not jinja_file.is_file():
        raise FileNotFoundError(f"no chat template at {path}")
    config = _read_config(config_file) if config_file.is_file() else {}
    if jinja_file is not None and jinja_file.is_file():
        default, tool_use = jinja_file.read_text(encoding="utf-8"), None
    elif config:
        default, tool_use = _templates_of(config, config_file)
    else:
        raise FileNotFoundError(f"no chat template at {path}")
    return ChatTemplateSource(
        _no_generation_tags(default),
        None if tool_use is None else _no_generation_tags(tool_use),
        _special_tokens(config),
        str(path),
    )


def check_chat_template_source(policy: Any) -> ChatTemplateSource | None:
    """Load and compile the policy's chat template (for errors at start-up, not per request)."""
    tokens = policy.limits.tokens
    source = load_chat_template(tokens.chat_template, tokens.tokenizer)
    if source is not None:
        sandbox = policy.limits.templates.chat_template
        for text in (source.default, source.tool_use):
            if text is not None:
                compile_chat_template(text, sandbox)
    return source


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
    for key in ("strict", "defer_loading"):
        if function.get(key) is not None:
            dumped[key] = function[key]
    out: dict[str, Any] = {"type": "function", "function": dumped}
    if tool.get("defer_loading") is not None:
        out["defer_loading"] = tool["defer_loading"]
    return out


def vllm_variables(
    chat: ChatInput,
    source: str,
    special_tokens: tuple[tuple[str, str], ...],
    max_depth: int,
    content_format: str = "auto",
) -> dict[str, Any]:
    """The template's variables as vLLM 0.32 passes them (module docstring)."""
    body = chat.body
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
    tools = body.get("tools")
    variables: dict[str, Any] = dict(special_tokens)
    kwargs = body.get("chat_template_kwargs")
    if isinstance(kwargs, dict):
        variables.update(
            (k, v)
            for k, v in kwargs.items()
            if isinstance(k, str) and k not in ("chat_template", "tokenize")
        )
    for key, default in (
        ("add_generation_prompt", True),
        ("continue_final_message", False),
        ("documents", None),
        ("reasoning_effort", None),
    ):
        value = body.get(key, default)
        if value is not None and value != "auto":
            variables[key] = value
    effort = body.get("reasoning_effort")
    if effort is not None and not (isinstance(kwargs, dict) and "enable_thinking" in kwargs):
        variables["enable_thinking"] = effort != "none"
    variables.pop("continue_final_message", None)  # consumed by transformers, not the template
    variables.setdefault("add_generation_prompt", False)
    variables.setdefault("documents", None)
    variables["messages"] = conversation
    variables["tools"] = (
        [_vllm_tool(t) for t in tools] if isinstance(tools, list) and tools else None
    )
    return variables


def llama_cpp_variables(
    chat: ChatInput, special_tokens: tuple[tuple[str, str], ...]
) -> dict[str, Any]:
    """The template's variables as llama-cpp-python 0.3.36's Jinja2ChatFormatter passes them."""
    body = chat.body
    tokens = dict(special_tokens)
    return {
        "messages": chat.messages,
        "bos_token": tokens.get("bos_token", ""),
        "eos_token": tokens.get("eos_token", ""),
        "add_generation_prompt": True,
        "functions": body.get("functions"),
        "function_call": body.get("function_call"),
        "tools": body.get("tools"),
        "tool_choice": body.get("tool_choice"),
    }


# -- rendering and counting -----------------------------------------------------------------------


def render_count(
    chat: ChatInput,
    text: str,
    special_tokens: tuple[tuple[str, str], ...],
    flavours: tuple[Flavour, ...],
    counter: TokenCounter,
    limit: int,
    sandbox: ChatTemplateLimits,
    max_depth: int,
    content_format: str = "auto",
    param: str | None = None,
) -> int | None:
    """The largest token count of the conversation rendered with the template ``text`` as each
    upstream in ``flavours`` renders it; raises ``prompt_tokens_exceeded`` (or a sandbox limit)
    once past ``limit``; None when a render fails for a reason of its own (module docstring)."""
    compiled: GuardedTemplate = compile_chat_template(text, sandbox)
    counted: dict[str, int] = {}
    for flavour in flavours:
        if flavour == "vllm":
            variables = vllm_variables(chat, text, special_tokens, max_depth, content_format)
        else:
            variables = llama_cpp_variables(chat, special_tokens)
        # Output, loops, values and time are the sandbox's to bound; tokens are counted once
        # per distinct prompt (the flavours usually render the same one).
        budget = Budget(Limits(deadline_s=sandbox.deadline_s))
        try:
            prompt = _render(compiled, variables, limits=sandbox, budget=budget)
        except TemplateError:
            return None  # the sandbox or the template refused this input: not a cost
        except LimitExceeded as exc:
            if exc.code == "deadline_exceeded":
                return None  # the guard is slow (a loaded machine): the bound decides
            raise
        if prompt not in counted:
            stats = counter.measure(prompt, limit, exact=True)
            if not stats.within_limit:
                raise LimitExceeded(
                    "prompt_tokens_exceeded",
                    f"the rendered prompt has more tokens than the limit of {limit}",
                    param=param,
                )
            counted[prompt] = stats.tokens
    return max(counted.values(), default=0)

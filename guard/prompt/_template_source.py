"""The upstream's chat template, and the special tokens its tokenizer hands the template.

The template comes from ``limits.tokens.chat_template``: a ``.jinja`` file (vLLM's
``--chat-template FILE``), a ``tokenizer_config.json`` (its ``chat_template``, or the named
``default`` / ``tool_use`` pair), a ``.gguf`` model (llama.cpp's ``tokenizer.chat_template``), or
a model directory; ``auto`` finds one next to a ``tokenizer.json`` tokenizer.

The special tokens (``bos_token``, ``eos_token``, ...) come from where the upstream takes them,
whatever file the template is read from: transformers' ``special_tokens_map`` of the tokenizer
(the ``tokenizer_config.json`` beside ``tokenizer.json``, and the legacy
``special_tokens_map.json`` when the config lists no ``added_tokens_decoder``), or the GGUF's
BOS/EOS for a GGUF model (llama.cpp's tokenizer is the GGUF). A template configured from another
folder still renders ``{{ bos_token }}`` as the model's BOS: vLLM takes it from the tokenizer.
"""

from __future__ import annotations

import functools
import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from guard.errors import GuardError, LimitExceeded
from guard.jinja import (
    CODE_INVALID,
    CODE_NOT_ALLOWED,
    CODE_SECURITY,
    ChatTemplateLimits,
    compile_chat_template,
    render_chat_template,
)
from guard.prompt._units import ChatInput
from guard.prompt._vllm_chat import vllm_call

__all__ = [
    "ChatTemplate",
    "ChatTemplateSource",
    "chat_template_for",
    "check_chat_template_source",
    "load_chat_template",
    "tokenizer_special_tokens",
]

# transformers' SPECIAL_TOKENS_ATTRIBUTES: what its special_tokens_map passes to templates.
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

SpecialTokens = tuple[tuple[str, str], ...]
# A template's source and the special tokens it is rendered with.
ChatTemplate = tuple[str, SpecialTokens]


@dataclass(frozen=True)
class ChatTemplateSource:
    """The upstream's chat template(s) and the special tokens its tokenizer exposes to them.

    ``tool_use``: the template ``tokenizer_config.json`` names for requests with tools.
    """

    default: str
    tool_use: str | None
    special_tokens: SpecialTokens
    origin: str

    def source_for(self, has_tools: bool) -> str:
        return self.tool_use if has_tools and self.tool_use is not None else self.default


def _no_generation_tags(source: str) -> str:
    def repl(m: re.Match[str]) -> str:
        left, end, right = m.group(1), m.group(2), m.group(3)
        return f"{{%{left} endif {right}%}}" if end else f"{{%{left} if true {right}%}}"

    return _GENERATION_TAG.sub(repl, source)


def _special_tokens(config: dict[str, Any]) -> dict[str, str]:
    out = {}
    for name in _SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[name] = value
    return out


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


def _config_tokens(directory: Path) -> dict[str, str] | None:
    """transformers' special_tokens_map for a tokenizer saved in ``directory`` (None: no
    tokenizer_config.json nor special_tokens_map.json there)."""
    config_file = directory / "tokenizer_config.json"
    map_file = directory / "special_tokens_map.json"
    config = _read_config(config_file) if config_file.is_file() else None
    tokens = {} if config is None else _special_tokens(config)
    # Legacy: special_tokens_map.json is merged over the config unless the config lists its
    # added tokens (PreTrainedTokenizerBase._from_pretrained).
    if map_file.is_file() and (config is None or "added_tokens_decoder" not in config):
        tokens |= _special_tokens(_read_config(map_file))
    elif config is None:
        return None
    return tokens


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


def _gguf_tokens(meta: dict[str, Any]) -> dict[str, str]:
    tokens = meta.get("tokenizer.ggml.tokens") or []
    special = {}
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
        index = meta.get(f"tokenizer.ggml.{key}")
        if isinstance(index, int) and 0 <= index < len(tokens):
            special[name] = str(tokens[index])
    return special


def _from_gguf(path: Path) -> ChatTemplateSource:
    meta = _gguf_metadata(path)
    template = meta.get("tokenizer.chat_template")
    if not isinstance(template, str):
        raise ValueError(f"{path} has no tokenizer.chat_template")
    special = tuple(_gguf_tokens(meta).items())
    return ChatTemplateSource(_no_generation_tags(template), None, special, str(path))


def _single_gguf(directory: Path) -> Path | None:
    ggufs = sorted(directory.glob("*.gguf"))
    return ggufs[0] if len(ggufs) == 1 else None


@functools.lru_cache(maxsize=16)
def tokenizer_special_tokens(tokenizer: str) -> SpecialTokens | None:
    """The special tokens a ``tokenizer.json`` tokenizer gives chat templates (from the
    ``tokenizer_config.json`` / ``special_tokens_map.json`` beside it, else a single GGUF model
    there); None for a tokenizer that is not a file (tiktoken) or has nothing beside it."""
    if not tokenizer.endswith(".json"):
        return None
    directory = Path(tokenizer).resolve().parent
    tokens = _config_tokens(directory)
    if tokens is None:
        gguf = _single_gguf(directory)
        if gguf is None:
            return None
        tokens = _gguf_tokens(_gguf_metadata(gguf))
    return tuple(tokens.items())


@functools.lru_cache(maxsize=16)
def load_chat_template(spec: str | None, tokenizer: str) -> ChatTemplateSource | None:
    """The template ``limits.tokens.chat_template`` names (``auto``: a ``chat_template.jinja``,
    a ``tokenizer_config.json`` with one, or a single ``.gguf`` model next to a
    ``tokenizer.json`` tokenizer; None when there is none), with the tokenizer's special tokens
    (module docstring). Raises OSError/ValueError when a named file cannot be used."""
    if spec is None:
        return None
    if spec == "auto":
        if not tokenizer.endswith(".json"):
            return None
        directory = Path(tokenizer).resolve().parent
        if not (directory / "chat_template.jinja").is_file():
            candidate = directory / "tokenizer_config.json"
            if not candidate.is_file() or "chat_template" not in _read_config(candidate):
                gguf = _single_gguf(directory)
                return _from_gguf(gguf) if gguf is not None else None
        path = directory
    else:
        path = Path(spec).expanduser().resolve()
    if path.suffix == ".gguf":
        return _from_gguf(path)  # llama.cpp's tokenizer is the GGUF: its BOS/EOS
    if path.is_dir():
        jinja_file: Path | None = path / "chat_template.jinja"
        config_file = path / "tokenizer_config.json"
    elif path.suffix == ".json":
        jinja_file, config_file = None, path
    else:
        jinja_file, config_file = path, path.parent / "tokenizer_config.json"
    if jinja_file is not None and not path.is_dir() and not jinja_file.is_file():
        raise FileNotFoundError(f"no chat template at {path}")
    if jinja_file is not None and jinja_file.is_file():
        default, tool_use = jinja_file.read_text(encoding="utf-8"), None
    elif config_file.is_file():
        default, tool_use = _templates_of(_read_config(config_file), config_file)
    else:
        raise FileNotFoundError(f"no chat template at {path}")
    special = tokenizer_special_tokens(tokenizer)
    if special is None:  # no tokenizer files: the tokens saved with the template, if any
        special = tuple((_config_tokens(config_file.parent) or {}).items())
    return ChatTemplateSource(
        _no_generation_tags(default),
        None if tool_use is None else _no_generation_tags(tool_use),
        special,
        str(path),
    )


# The guard's own refusals of a template (not of one input): at start-up, an error.
def chat_template_for(
    body: dict[str, Any], configured: str | None, tokenizer: str, request_templates: bool
) -> ChatTemplate | None:
    """The chat template the upstream renders this request with, and its special tokens: the
    request's own when the policy accepts request templates, else the ``configured`` one."""
    found = load_chat_template(configured, tokenizer)
    if found is not None:
        special = found.special_tokens
    else:  # a request's template alone: the tokenizer's tokens all the same
        special = tokenizer_special_tokens(tokenizer) or ()
    if request_templates:
        kwargs = body.get("chat_template_kwargs")
        for source in (
            body.get("chat_template"),
            kwargs.get("chat_template") if isinstance(kwargs, dict) else None,
        ):
            if isinstance(source, str):
                return source, special
    if found is None:
        return None
    return found.source_for(bool(body.get("tools"))), special


_SANDBOX_CODES = frozenset({CODE_SECURITY, CODE_NOT_ALLOWED, CODE_INVALID})


def check_chat_template_source(
    spec: str | None, tokenizer: str, sandbox: ChatTemplateLimits
) -> ChatTemplateSource | None:
    """Load, compile and render once the chat template ``spec`` names (for errors at start-up,
    naming the file, not per request). The render is an ordinary chat as vLLM passes it: a
    template the sandbox cannot render (an operation it refuses, a filter it lacks) is an error;
    one that raises for this input (a RAG template without documents) is not."""
    source = load_chat_template(spec, tokenizer)
    if source is None:
        return None
    chat = ChatInput(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], {}
    )
    for text in (source.default, source.tool_use):
        if text is None:
            continue
        try:
            compiled = compile_chat_template(text, sandbox)
            variables = vllm_call(chat, text, source.special_tokens, 32).variables
            render_chat_template(compiled, variables, limits=sandbox)
        except GuardError as exc:
            if exc.code in _SANDBOX_CODES or isinstance(exc, LimitExceeded):
                raise ValueError(f"{source.origin}: {exc.message}") from None
    return source

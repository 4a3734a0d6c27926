"""guard.prompt._template_source: the special tokens come from the tokenizer, whatever file the
chat template is read from (vLLM takes them from the tokenizer, not from the template's folder)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from guard.jinja import ChatTemplateLimits
from guard.prompt._render import render_count
from guard.prompt._template_source import load_chat_template, tokenizer_special_tokens
from guard.prompt._units import ChatInput
from guard.tokens import get_counter

TEMPLATE = "{{ bos_token }}{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"


@pytest.fixture(autouse=True)
def _fresh() -> None:
    load_chat_template.cache_clear()
    tokenizer_special_tokens.cache_clear()


def _model(directory: Path, config: dict[str, object]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tokenizer.json").write_text("{}")
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory / "tokenizer.json"


def test_a_template_from_another_folder_gets_the_tokenizers_bos(tmp_path: Path) -> None:
    tokenizer = _model(tmp_path / "model", {"bos_token": "<|begin_of_text|>", "eos_token": None})
    template = tmp_path / "templates" / "llama.jinja"
    template.parent.mkdir()
    template.write_text(TEMPLATE)
    # A config beside the template is not the tokenizer's: it is not read.
    (template.parent / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<wrong>"}))
    source = load_chat_template(str(template), str(tokenizer))
    assert source is not None and source.default == TEMPLATE
    assert dict(source.special_tokens) == {"bos_token": "<|begin_of_text|>"}


def test_the_legacy_special_tokens_map_is_merged_unless_the_config_lists_added_tokens(
    tmp_path: Path,
) -> None:
    tokenizer = _model(tmp_path / "a", {"bos_token": "<s>"})
    (tmp_path / "a" / "special_tokens_map.json").write_text(
        json.dumps({"bos_token": {"content": "<B>"}, "eos_token": "</E>"})
    )
    assert dict(tokenizer_special_tokens(str(tokenizer)) or ()) == {
        "bos_token": "<B>",
        "eos_token": "</E>",
    }
    modern = _model(tmp_path / "b", {"bos_token": "<s>", "added_tokens_decoder": {}})
    (tmp_path / "b" / "special_tokens_map.json").write_text(json.dumps({"eos_token": "</E>"}))
    assert dict(tokenizer_special_tokens(str(modern)) or ()) == {"bos_token": "<s>"}
    assert tokenizer_special_tokens("cl100k_base") is None


def test_a_template_alone_without_a_tokenizer_file_keeps_its_own_config(tmp_path: Path) -> None:
    (tmp_path / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": TEMPLATE, "bos_token": "<s>"})
    )
    source = load_chat_template(str(tmp_path / "tokenizer_config.json"), "cl100k_base")
    assert source is not None and dict(source.special_tokens) == {"bos_token": "<s>"}


def test_the_render_prints_the_tokenizers_bos(tmp_path: Path) -> None:
    bos = "<|begin_of_text|>"
    tokenizer = _model(tmp_path / "model", {"bos_token": bos})
    template = tmp_path / "elsewhere" / "t.jinja"
    template.parent.mkdir()
    template.write_text(TEMPLATE)
    source = load_chat_template(str(template), str(tokenizer))
    assert source is not None
    chat = ChatInput([{"role": "user", "content": "hi"}], {})
    counter = get_counter()
    outcome = render_count(
        chat, TEMPLATE, source.special_tokens, ("vllm",), counter, 1000, ChatTemplateLimits(), 32
    )
    assert outcome.tokens == counter.count(bos + "user: hi\n")

"""The vocabulary the structured-output backend targets compile against.

Backends' costs grow with the vocabulary, so the targets use a realistic one: a byte-level BPE
(GPT-2 pre-tokenizer and decoder, the 256-byte alphabet included) trained here with the
``tokenizers`` library on the interpreter's own standard-library sources, deterministic for a
given Python and ``tokenizers`` version, cached under
``${XDG_CACHE_HOME:-~/.cache}/schedguard/vocab/bpe-<size>.json``. Or a real model's
``tokenizer.json`` (``SCHEDGUARD_BACKENDS_TOKENIZER``; the vLLM tiny model's, at
``~/.cache/schedguard/upstreams/vllm/model/tokenizer.json``, is one). The size comes from
``SCHEDGUARD_BACKENDS_VOCAB`` (default 4096; the calibration uses 32768).

Each backend gets the vocabulary the way vLLM 0.32 builds it: outlines-core a map from token
bytes to ids without the special tokens (``_reduced_vocabulary``), llguidance the tokenizer's
JSON, xgrammar the byte-level token strings.
"""

from __future__ import annotations

import json
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Vocab", "default_vocab_size", "load_vocab", "train_bpe"]

_EOS_NAMES = ("<|endoftext|>", "<|im_end|>", "<|end_of_text|>", "</s>", "<|eot_id|>")
_CORPUS_BYTES = 48 << 20


def default_vocab_size() -> int:
    raw = os.environ.get("SCHEDGUARD_BACKENDS_VOCAB", "4096")
    return max(300, int(raw))


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "schedguard" / "vocab"


def _corpus() -> list[str]:
    """Standard-library sources in a fixed order, up to ~48 MB."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts: list[str] = []
    total = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        texts.append(text)
        total += len(text)
        if total > _CORPUS_BYTES:
            break
    return texts


def train_bpe(vocab_size: int) -> str:
    """A byte-level BPE of ``vocab_size`` tokens as ``tokenizer.json`` text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    text: str = tok.to_str()
    return text


def tokenizer_json(vocab_size: int | None = None) -> tuple[str, str]:
    """(tokenizer.json text, where it came from)."""
    path = os.environ.get("SCHEDGUARD_BACKENDS_TOKENIZER")
    if path:
        return Path(path).read_text(encoding="utf-8"), path
    size = vocab_size or default_vocab_size()
    cached = _cache_dir() / f"bpe-{size}.json"
    if not cached.exists():
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(train_bpe(size), encoding="utf-8")
        tmp.replace(cached)
    return cached.read_text(encoding="utf-8"), str(cached)


def _byte_decoder() -> dict[str, int]:
    """GPT-2's bytes_to_unicode, inverted: byte-level token characters -> bytes."""
    bs = list(range(ord("!"), ord("~") + 1))
    bs += list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs, strict=True)}


@dataclass
class Vocab:
    """One tokenizer's vocabulary in the forms the backends take."""

    text: str  # tokenizer.json
    source: str
    size: int  # ids 0..size-1
    eos: int
    tokens: list[str]  # byte-level token strings by id ("" for holes)
    special: frozenset[int]

    def token_bytes(self) -> dict[bytes, list[int]]:
        """outlines-core's map (vLLM ``_reduced_vocabulary`` for a byte-level BPE): token
        bytes -> ids, special tokens left out."""
        dec = _byte_decoder()
        out: dict[bytes, list[int]] = {}
        for i, tok in enumerate(self.tokens):
            if not tok or i in self.special:
                continue
            try:
                raw = bytes(dec[c] for c in tok)
            except KeyError:
                raw = tok.encode("utf-8")
            out.setdefault(raw, []).append(i)
        return out


def load_vocab(vocab_size: int | None = None) -> Vocab:
    text, source = tokenizer_json(vocab_size)
    doc: dict[str, Any] = json.loads(text)
    vocab: dict[str, int] = doc["model"]["vocab"]
    added = {t["id"]: t["content"] for t in doc.get("added_tokens", [])}
    size = max([*vocab.values(), *added.keys()]) + 1
    tokens = [""] * size
    for tok, i in vocab.items():
        tokens[i] = tok
    for i, tok in added.items():
        tokens[i] = tok
    special = frozenset(i for i, t in enumerate(doc.get("added_tokens", [])) if t.get("special"))
    special = frozenset(t["id"] for t in doc.get("added_tokens", []) if t.get("special"))
    eos = next((i for i, t in added.items() if t in _EOS_NAMES), min(added, default=0))
    return Vocab(text, source, size, eos, tokens, special)

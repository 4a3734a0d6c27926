"""The tiny models' shared tokenizer: a byte-level BPE trained here on Python's own docstrings.

Imported by make_hf_model.py (vLLM's venv) and make_gguf_model.py (llama-cpp-python's venv),
so both upstreams tokenize the same way when their `tokenizers` versions match (setup pins
them). Needs only the `tokenizers` package. Nothing is downloaded: the corpus is the
docstrings of a fixed list of standard-library modules of the interpreter running this, so the
result is the same for the same Python and `tokenizers` versions (both recorded in the stamp).
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

HERE = Path(__file__).resolve().parent
CHAT_TEMPLATE = (HERE / "chat_template.jinja").read_text(encoding="utf-8")

BOS = "<|begin_of_text|>"
PAD = "<|end_of_text|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
# Ids 0..3 in this order: the trainer places special tokens first.
SPECIAL_TOKENS = [BOS, PAD, IM_START, IM_END]
EOS = IM_END  # a chat model stops at the end of its turn
VOCAB_SIZE = 4096


def corpus() -> list[str]:
    """The training texts, in a fixed order, computed in a pristine interpreter."""
    out = subprocess.run(
        [sys.executable, "-I", "-S", str(HERE / "stdlib_corpus.py")],
        capture_output=True,
        check=True,
    )
    texts: list[str] = json.loads(out.stdout)
    return texts


def train(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    """Train the byte-level BPE: the 256-byte alphabet is always in the vocabulary, so any
    text (any language, emoji, invalid-looking bytes) encodes without an unknown token."""
    tokenizer = Tokenizer(models.BPE())
    # GPT-2's pre-tokenizer regex: llama.cpp's "gpt-2" pre-tokenizer is the same one.
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    # Plain (non-chat) encodings start with BOS like Llama 3's; the chat template writes its
    # own BOS and servers encode rendered chats without adding another.
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tokenizer.token_to_id(BOS))],
    )
    for i, token in enumerate(SPECIAL_TOKENS):
        if tokenizer.token_to_id(token) != i:
            raise RuntimeError(f"special token {token!r} is not id {i}")
    return tokenizer


def fingerprint(tokenizer: Tokenizer) -> str:
    """sha256 of the serialised tokenizer: equal across the two venvs when training matched."""
    return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()

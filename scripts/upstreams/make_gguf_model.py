"""Write the tiny Llama GGUF that llama-cpp-python serves: random float32 weights, the shared
byte-level BPE vocabulary and the chat template in the metadata.

Runs inside the llama-cpp-python venv (needs gguf, numpy, tokenizers):

    VENV/bin/python scripts/upstreams/make_gguf_model.py OUT_DIR

Writes OUT_DIR/model.gguf and OUT_DIR/tokenizer.json (the same vocabulary in Hugging Face
form, for tools that count tokens), and OUT_DIR/text/model.gguf: the same weights but for a
constant residual dimension that puts every token whose bytes are not whole UTF-8 characters
about 34 logits down, so its text decodes token by token as a real model's does (the random
model's mostly does not, which llama-cpp-python streams in superlinear time:
docs/findings/llamacpp-undecodable-stream-superlinear.yaml). Deterministic: fixed seed, fixed
corpus.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gguf
import numpy as np
import tiny_tokenizer

SEED = 0
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
INTERMEDIATE = 256
CONTEXT = 4096
HEAD_DIM = HIDDEN // HEADS
# In a folder of its own: tools that read a chat template from "the single .gguf next to
# tokenizer.json" (the guard's `chat_template: auto`) must still find one.
TEXT_FILE = "text/model.gguf"
# text/model.gguf: residual dimension 0 holds this constant (no layer writes it), so after the
# final RMS norm it is ~sqrt(HIDDEN) = 11.3 and a token whose output row has _PENALTY there is
# ~34 logits below the rest (random rows give logits of ~0.1).
_CONSTANT = 1.0
_PENALTY = -3.0


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-to-unicode map, inverted: how byte-level tokens spell their bytes."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
                 *range(ord("\u00ae"), ord("\u00ff") + 1)]  # fmt: skip
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in chars.items()}


def undecodable(tokens: list[str], special: set[str]) -> list[bool]:
    """Whether each token's bytes are not whole UTF-8 characters on their own."""
    to_byte = _byte_decoder()
    out = []
    for token in tokens:
        if token in special:
            out.append(False)
            continue
        try:
            bytes(to_byte[c] for c in token).decode("utf-8")
        except (KeyError, UnicodeDecodeError):
            out.append(True)
        else:
            out.append(False)
    return out


def _merges(tokenizer_json: dict[str, object]) -> list[str]:
    model = tokenizer_json["model"]
    assert isinstance(model, dict)
    # tokenizers >= 0.20 writes merges as [left, right] pairs, older ones as "left right".
    return [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write model.gguf into")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    raw = tiny_tokenizer.train()
    raw.save(str(out / "tokenizer.json"))
    vocab = raw.get_vocab(with_added_tokens=True)
    n_vocab = len(vocab)
    tokens = [""] * n_vocab
    for token, index in vocab.items():
        tokens[index] = token
    special = set(tiny_tokenizer.SPECIAL_TOKENS)
    types = [gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens]
    merges = _merges(json.loads(raw.to_str()))

    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        # numpy shapes are (out, in) like PyTorch's; the writer reverses them into ggml order.
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    kv_dim = KV_HEADS * HEAD_DIM
    weights: dict[str, np.ndarray] = {"token_embd.weight": normal(n_vocab, HIDDEN)}
    for i in range(LAYERS):
        weights[f"blk.{i}.attn_norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        weights[f"blk.{i}.attn_q.weight"] = normal(HIDDEN, HIDDEN)
        weights[f"blk.{i}.attn_k.weight"] = normal(kv_dim, HIDDEN)
        weights[f"blk.{i}.attn_v.weight"] = normal(kv_dim, HIDDEN)
        weights[f"blk.{i}.attn_output.weight"] = normal(HIDDEN, HIDDEN)
        weights[f"blk.{i}.ffn_norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        weights[f"blk.{i}.ffn_gate.weight"] = normal(INTERMEDIATE, HIDDEN)
        weights[f"blk.{i}.ffn_up.weight"] = normal(INTERMEDIATE, HIDDEN)
        weights[f"blk.{i}.ffn_down.weight"] = normal(HIDDEN, INTERMEDIATE)
    weights["output_norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    weights["output.weight"] = normal(n_vocab, HIDDEN)

    def write(path: Path, tensors: dict[str, np.ndarray]) -> None:
        writer = gguf.GGUFWriter(str(path), arch="llama")
        writer.add_name("schedguard-tiny-llama")
        writer.add_context_length(CONTEXT)
        writer.add_embedding_length(HIDDEN)
        writer.add_block_count(LAYERS)
        writer.add_feed_forward_length(INTERMEDIATE)
        writer.add_head_count(HEADS)
        writer.add_head_count_kv(KV_HEADS)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_rope_dimension_count(HEAD_DIM)
        writer.add_rope_freq_base(10000.0)
        writer.add_file_type(gguf.LlamaFileType.ALL_F32)
        writer.add_vocab_size(n_vocab)
        # "gpt2" = byte-level BPE (tokens stored in GPT-2's byte-to-unicode form, as tokenizers
        # writes them); "gpt-2" = the same pre-tokenizer regex as tokenizers' ByteLevel.
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("gpt-2")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_merges(merges)
        writer.add_bos_token_id(raw.token_to_id(tiny_tokenizer.BOS))
        writer.add_eos_token_id(raw.token_to_id(tiny_tokenizer.EOS))
        writer.add_eot_token_id(raw.token_to_id(tiny_tokenizer.EOS))
        writer.add_pad_token_id(raw.token_to_id(tiny_tokenizer.PAD))
        # Plain prompts get BOS like the HF tokenizer's; llama-cpp-python adds none to a rendered
        # chat template, which writes its own.
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        writer.add_chat_template(tiny_tokenizer.CHAT_TEMPLATE)

        for name, tensor in tensors.items():
            writer.add_tensor(name, tensor)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    path = out / "model.gguf"
    write(path, weights)
    text = {name: tensor.copy() for name, tensor in weights.items()}
    text["token_embd.weight"][:, 0] = _CONSTANT
    for i in range(LAYERS):
        text[f"blk.{i}.attn_output.weight"][0, :] = 0.0
        text[f"blk.{i}.ffn_down.weight"][0, :] = 0.0
    barred = undecodable(tokens, special)
    text["output.weight"][:, 0] = np.where(barred, _PENALTY, 0.0).astype(np.float32)
    (out / TEXT_FILE).parent.mkdir(exist_ok=True)
    write(out / TEXT_FILE, text)
    print(
        json.dumps(
            {
                "file": str(path),
                "bytes": path.stat().st_size,
                "vocab_size": n_vocab,
                "tokenizer_sha256": tiny_tokenizer.fingerprint(raw),
                "text_model_barred_tokens": sum(barred),
            }
        )
    )


if __name__ == "__main__":
    main()

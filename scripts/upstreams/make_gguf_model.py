"""Write the tiny Llama GGUF that llama-cpp-python serves: random float32 weights, the shared
byte-level BPE vocabulary and the chat template in the metadata.

Runs inside the llama-cpp-python venv (needs gguf, numpy, tokenizers):

    VENV/bin/python scripts/upstreams/make_gguf_model.py OUT_DIR

Writes OUT_DIR/model.gguf and OUT_DIR/tokenizer.json (the same vocabulary in Hugging Face
form, for tools that count tokens). Deterministic: fixed seed, fixed corpus.
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

    path = out / "model.gguf"
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

    rng = np.random.default_rng(SEED)

    def normal(*shape: int) -> np.ndarray:
        # numpy shapes are (out, in) like PyTorch's; the writer reverses them into ggml order.
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    kv_dim = KV_HEADS * HEAD_DIM
    writer.add_tensor("token_embd.weight", normal(n_vocab, HIDDEN))
    for i in range(LAYERS):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", normal(HIDDEN, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_k.weight", normal(kv_dim, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_v.weight", normal(kv_dim, HIDDEN))
        writer.add_tensor(f"blk.{i}.attn_output.weight", normal(HIDDEN, HIDDEN))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(HIDDEN, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", normal(INTERMEDIATE, HIDDEN))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", normal(INTERMEDIATE, HIDDEN))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", normal(HIDDEN, INTERMEDIATE))
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    writer.add_tensor("output.weight", normal(n_vocab, HIDDEN))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    print(
        json.dumps(
            {
                "file": str(path),
                "bytes": path.stat().st_size,
                "vocab_size": n_vocab,
                "tokenizer_sha256": tiny_tokenizer.fingerprint(raw),
            }
        )
    )


if __name__ == "__main__":
    main()

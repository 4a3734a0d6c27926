"""Write the tiny Llama that vLLM serves: random float32 weights plus the shared tokenizer.

Runs inside the vLLM venv (needs torch, transformers, tokenizers):

    VENV/bin/python scripts/upstreams/make_hf_model.py OUT_DIR

Writes config.json, generation_config.json, model.safetensors, tokenizer.json,
tokenizer_config.json (with the chat template) and special_tokens_map.json into OUT_DIR.
Deterministic: fixed seed, fixed corpus (see tiny_tokenizer.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import tiny_tokenizer
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 0
HIDDEN = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2  # grouped-query attention, as in real Llama 3 checkpoints
INTERMEDIATE = 256
MAX_POSITIONS = 4096


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory to write the model into")
    args = parser.parse_args()
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)

    raw = tiny_tokenizer.train()
    # Before wrapping: PreTrainedTokenizerFast sets padding/truncation on the object it wraps.
    tokenizer_sha256 = tiny_tokenizer.fingerprint(raw)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=tiny_tokenizer.BOS,
        eos_token=tiny_tokenizer.EOS,
        pad_token=tiny_tokenizer.PAD,
        additional_special_tokens=[tiny_tokenizer.IM_START],
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = tiny_tokenizer.CHAT_TEMPLATE
    tokenizer.save_pretrained(out)

    bos_id = raw.token_to_id(tiny_tokenizer.BOS)
    eos_id = raw.token_to_id(tiny_tokenizer.EOS)
    pad_id = raw.token_to_id(tiny_tokenizer.PAD)
    config = LlamaConfig(
        vocab_size=raw.get_vocab_size(),
        hidden_size=HIDDEN,
        intermediate_size=INTERMEDIATE,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config).to(torch.float32).eval()
    model.save_pretrained(out, safe_serialization=True)
    # Servers read stop ids from here: the turn end and the text end both stop generation.
    GenerationConfig(
        bos_token_id=bos_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id
    ).save_pretrained(out)

    # A check that the saved files round-trip through the classes vLLM will use.
    reloaded = PreTrainedTokenizerFast.from_pretrained(out)
    prompt = reloaded.apply_chat_template(
        [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True
    )
    summary = {
        "dir": str(out),
        "vocab_size": raw.get_vocab_size(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokenizer_sha256": tokenizer_sha256,
        "hello_prompt": prompt,
        "hello_prompt_tokens": len(reloaded(prompt, add_special_tokens=False)["input_ids"]),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

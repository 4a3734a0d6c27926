"""What log-probabilities cost llama-cpp-python 0.3.36, beside the same requests without them.

Starts the e2e llama-cpp-python server (scripts/upstreams, memory-capped) and, for each number of
positions ``P``, times side by side in one run: a completion echoing a ``P``-token prompt with
``logprobs: 1`` against the same without logprobs, and ``P`` generated tokens (EOS pushed down)
with ``logprobs: 1`` against the same without. Prints seconds, the ratio, the work the guard
counts (``P x (V + 3P)``, guard.checks._logprob_work) and microseconds per unit of work, and
the default limit's cost at this vocabulary. ``--json`` prints the rows. Progress on stderr.

    .venv/bin/python bench/llamacpp_logprobs.py
    .venv/bin/python bench/llamacpp_logprobs.py --positions 500,1000,2000 --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402

from guard.checks import TokensLimits, logprob_work  # noqa: E402
from guard.tokens import get_counter  # noqa: E402
from loadtests.upstream_corpus import ScriptUpstream  # noqa: E402
from schedguard.servers import free_port  # noqa: E402

WORD = " fox"


def _prompt(counter: Any, tokens: int) -> str:
    text = WORD * tokens
    while counter.encode_count(text) > tokens:
        text = text[: -len(WORD)]
    return text


def _eos_id(tokenizer_json: Path) -> int:
    """The e2e model's EOS (scripts/upstreams/tiny_tokenizer.py: the end of a turn)."""
    from tokenizers import Tokenizer

    eos = Tokenizer.from_file(str(tokenizer_json)).token_to_id("<|im_end|>")
    assert eos is not None, tokenizer_json
    return int(eos)


def _time(url: str, body: dict[str, Any]) -> tuple[float, int]:
    started = time.perf_counter()
    reply = httpx.post(f"{url}/v1/completions", json=body, timeout=600)
    elapsed = time.perf_counter() - started
    reply.raise_for_status()
    usage = reply.json()["usage"]
    return elapsed, int(usage["prompt_tokens"]) + int(usage["completion_tokens"])


def measure(url: str, model: str, counter: Any, eos: int, positions: int) -> list[dict[str, Any]]:
    vocabulary = counter.vocabulary_size
    prompt = _prompt(counter, positions)
    shapes = {
        "echo": {"prompt": prompt, "echo": True, "max_tokens": 1},
        "generate": {"prompt": "Once", "max_tokens": positions, "logit_bias": {str(eos): -100}},
    }
    rows = []
    for shape, fields in shapes.items():
        body = {"model": model, "temperature": 0, **fields}
        plain_s, _ = _time(url, body)
        scored_s, tokens = _time(url, {**body, "logprobs": 1})
        work = logprob_work(tokens, vocabulary)
        rows.append(
            {
                "shape": shape,
                "positions": tokens,
                "plain_s": round(plain_s, 3),
                "logprobs_s": round(scored_s, 3),
                "ratio": round(scored_s / plain_s, 1),
                "work": work,
                "us_per_work": round((scored_s - plain_s) / work * 1e6, 3),
            }
        )
        print(f"  {shape} P={tokens}: {plain_s:.2f} s -> {scored_s:.2f} s", file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--positions",
        default="250,500,1000,2000",
        help="comma-separated numbers of scored positions (default 250,500,1000,2000; at most "
        "the 4096-token window)",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--version", action="version", version="schedguard bench 1")
    args = parser.parse_args(argv)
    wanted = [int(p) for p in args.positions.split(",") if p.strip()]
    up = ScriptUpstream("llamacpp", free_port("127.0.0.1"))
    print("starting llama-cpp-python ...", file=sys.stderr)
    up.start()
    try:
        counter = get_counter(str(up.tokenizer_json))
        eos = _eos_id(up.tokenizer_json)
        rows = [r for p in wanted for r in measure(up.base_url, up.model, counter, eos, p)]
    finally:
        up.stop()
    limit = TokensLimits().max_logprob_work
    fitted = sorted(r["us_per_work"] for r in rows)[len(rows) // 2]
    if args.json:
        print(json.dumps({"vocabulary": counter.vocabulary_size, "rows": rows}, indent=2))
        return 0
    print(f"vocabulary {counter.vocabulary_size}; work = P x (V + 3P)")
    print(f"{'shape':9} {'P':>5} {'plain s':>8} {'logprobs s':>10} {'ratio':>6} {'us/work':>8}")
    for r in rows:
        print(
            f"{r['shape']:9} {r['positions']:>5} {r['plain_s']:>8} {r['logprobs_s']:>10} "
            f"{r['ratio']:>6} {r['us_per_work']:>8}"
        )
    if limit is not None:
        print(
            f"the default limit ({limit:,}) at the median {fitted} us/work: {limit * fitted / 1e6:.1f} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

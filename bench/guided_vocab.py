"""Issue 23's calibration at real vocabularies: xgrammar's cold compile of every structured-output
constraint in the benign and public corpora (payloads/public/structured/ among them) and payloads/pinned/xgrammar,
plus a few costly shapes, beside the guard's estimate and the default policy's verdict.

The vocabulary is tiktoken's cl100k_base (the guard's default tokenizer, 100,277 ids), padded
with filler tokens to larger sizes (``--vocab 128256``) and cut to its first ranks for smaller
ones (``--vocab 32768``: the 32,768 most frequent merges): the cost grows with the vocabulary's
size. Each vocabulary is measured in one child process (``--python``: an interpreter with
xgrammar 0.2.8, such as the vLLM venv of scripts/upstreams; it needs no schedguard), under an
8 GiB ``RLIMIT_AS``, one compile at a time with a fresh compiler (``cache_enabled=False``,
``max_threads=1``), timed in CPU seconds of the process (``getrusage``), with the compiled
grammar's ``memory_size_bytes``.

    .venv/bin/python bench/guided_vocab.py \\
        --python ~/.cache/schedguard/upstreams/vllm/venv/bin/python --vocab 100277 128256

Progress on stderr, the table on stdout (``--json``: the rows as JSON instead).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MEM_LIMIT = 8 << 30


def _costly() -> list[tuple[str, str, Any]]:
    def obj(lens: list[int]) -> dict[str, Any]:
        props = {f"p{i}": {"type": "string", "maxLength": n} for i, n in enumerate(lens)}
        return {"type": "object", "properties": props, "required": list(props)}

    return [
        ("x-str-2000", "json", {"type": "string", "maxLength": 2000}),
        ("x-re-dot-3000", "regex", ".{0,3000}"),
        ("x-obj-3x1000", "json", obj([1000] * 3)),
        ("x-obj-4-distinct", "json", obj([101, 102, 103, 104])),
        ("x-obj-12-distinct", "json", obj(list(range(101, 113)))),
        ("x-obj-24-distinct", "json", obj(list(range(101, 125)))),
    ]


def _cases() -> list[dict[str, Any]]:
    from guard.guided.backends import constraints
    from payloads import load_payload

    paths = [
        *sorted((ROOT / "payloads" / "benign").rglob("*.yaml")),
        *sorted((ROOT / "payloads" / "public").rglob("*.yaml")),
        *sorted((ROOT / "payloads" / "pinned" / "xgrammar").glob("*.yaml")),
    ]
    out: list[dict[str, Any]] = []
    for path in paths:
        payload = load_payload(path)
        try:
            body = json.loads(payload.body_bytes())
        except ValueError:
            continue
        if not isinstance(body, dict):
            continue
        for kind, spec, _ in constraints(body):
            if kind in ("json", "regex"):
                out.append({"id": payload.id, "kind": kind, "spec": spec, "class": payload.kind})
    out += [{"id": i, "kind": k, "spec": s, "class": "costly"} for i, k, s in _costly()]
    return out


def _estimates(case: dict[str, Any], vocab: int) -> tuple[float, str | None]:
    from guard.errors import GuardError
    from guard.guided import GuidedLimits, check_structured_outputs
    from guard.guided.backends import xgrammar_cost

    est = xgrammar_cost(case["kind"], case["spec"], vocab).compile_s
    if case["kind"] == "regex":
        body: dict[str, Any] = {"structured_outputs": {"regex": case["spec"]}}
    else:
        body = {"structured_outputs": {"json": case["spec"]}}
    try:
        check_structured_outputs(body, GuidedLimits(), vocab=vocab)
    except GuardError as err:
        return est, err.code
    return est, None


def _vocabulary() -> list[str]:
    from guard.tokens import get_counter

    counter = get_counter("cl100k_base")
    words: list[bytes] = list(getattr(counter, "backend").token_bytes)  # noqa: B009 - by rank
    # the special tokens' ids (100,257 and up) as fillers: they are never text
    words += [f"<|special_{i}|>".encode() for i in range(len(words), counter.vocabulary_size)]
    return [w.hex() for w in words]


def _child(vocab_path: str, size: int, cases_path: str, out_path: str) -> None:
    import time

    import xgrammar as xgr  # the --python interpreter's

    words = [bytes.fromhex(h) for h in json.loads(Path(vocab_path).read_text())][:size]
    words += [f"<|pad_{i}|>".encode() for i in range(max(0, size - len(words)))]
    info = xgr.TokenizerInfo(words, vocab_type=xgr.VocabType.RAW, vocab_size=size)
    cases = json.loads(Path(cases_path).read_text())
    with open(out_path, "w", encoding="utf-8") as out:
        for case in cases:
            compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            r0 = resource.getrusage(resource.RUSAGE_SELF)
            w0 = time.monotonic()
            mb: float | None = None
            error = None
            try:
                if case["kind"] == "json":
                    grammar = compiler.compile_json_schema(json.dumps(case["spec"]))
                else:
                    grammar = compiler.compile_regex(case["spec"])
                mb = grammar.memory_size_bytes / 1e6
            except Exception as exc:  # the backend refuses it: vLLM answers 400
                error = type(exc).__name__
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
            row = {"cpu_s": round(cpu, 3), "wall_s": round(time.monotonic() - w0, 3)}
            out.write(json.dumps({**row, "mb": mb, "error": error}) + "\n")
            out.flush()
            print(f"  {size}: {case['id']}: {cpu:.3f} s", file=sys.stderr)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="an interpreter with xgrammar")
    parser.add_argument("--vocab", type=int, nargs="+", default=[100_277, 128_256])
    parser.add_argument("--only", default="", help="comma-separated case ids (default: all)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        vocab_path, size, cases_path, out_path = args.child
        _child(vocab_path, int(size), cases_path, out_path)
        return 0
    sys.path.insert(0, str(ROOT))
    cases = _cases()
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c["id"] in wanted]
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        vocab_path = os.path.join(tmp, "vocab.json")
        cases_path = os.path.join(tmp, "cases.json")
        Path(vocab_path).write_text(json.dumps(_vocabulary()))
        Path(cases_path).write_text(json.dumps(cases))
        for size in args.vocab:
            out_path = os.path.join(tmp, f"out-{size}.jsonl")
            argv = [args.python, __file__, "--child", vocab_path, str(size), cases_path, out_path]
            print(f"xgrammar at {size:,} tokens ({len(cases)} constraints)", file=sys.stderr)
            subprocess.run(argv, check=True, preexec_fn=_limit, timeout=3600)
            measured = [json.loads(line) for line in Path(out_path).read_text().splitlines()]
            for case, got in zip(cases, measured, strict=True):
                est, verdict = _estimates(case, size)
                rows.append(
                    {
                        "id": case["id"],
                        "class": case["class"],
                        "kind": case["kind"],
                        "vocab": size,
                        "estimate_s": round(est, 3),
                        **got,
                        "verdict": verdict or "admit",
                    }
                )
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
        return 0
    print(
        "| constraint | class | vocabulary | xgrammar CPU s | grammar MB | estimate s | verdict |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mb = "-" if r["mb"] is None else f"{r['mb']:.1f}"
        cpu = r["error"] or f"{r['cpu_s']:.3g}"
        print(
            f"| `{r['id']}` | {r['class']} | {r['vocab']:,} | {cpu} | {mb} | "
            f"{r['estimate_s']:.3g} | {r['verdict']} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

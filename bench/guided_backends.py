"""The calibration table: each structured-output corpus case compiled by the real backends, next to
the guard's verdict under each policy.

    SCHEDGUARD_BACKENDS_VOCAB=32768 python bench/guided_backends.py --backends outlines guidance \\
        --out build/cal-og.json
    SCHEDGUARD_BACKENDS_VOCAB=32768 <python with xgrammar> bench/guided_backends.py \\
        --backends xgrammar --out build/cal-x.json
    python bench/guided_backends.py --merge build/cal-og.json build/cal-x.json

Every case of :mod:`fuzz.targets.backends_corpus` (the benign corpus and issue 16's expensive
inputs) runs through the backend fuzz target with the guard's cost check off
(``SCHEDGUARD_BACKENDS_POLICY=off``), in the oracle's isolated worker (``RLIMIT_AS`` at 2 GiB
over its baseline, killed after ~8 s): compile CPU seconds, peak RSS growth, or how it ended.
The guard's verdicts come from :func:`guard.guided.check_structured_outputs` at the same
vocabulary size, under the default policy (``auto``: xgrammar, guidance, outlines through the
fallback) and with the policy naming one backend. A case is *over budget* when it took more than
1 s of CPU or 256 MiB, or a token mask over 0.05 s (a finding of the target), or did not finish.
The merge recomputes the guard's verdicts with the code as it is, and prints the markdown table
and the two checks: no benign case refused where its
reachable backends are within budget, and no over-budget case admitted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BACKENDS = ("outlines", "xgrammar", "guidance")
POLICIES = ("default", "xgrammar", "guidance", "outlines")


def verdicts(kind: str, spec: Any, vocab: int) -> dict[str, str]:
    from fuzz.targets.backends_corpus import request_body
    from guard.errors import GuardError
    from guard.guided import GuidedLimits, check_structured_outputs

    out = {}
    for name in POLICIES:
        backends: tuple[Any, ...] = BACKENDS if name == "default" else (name,)
        limits = GuidedLimits(backends=backends, vocab_size=vocab)
        try:
            check_structured_outputs(request_body(kind, spec), limits)
            out[name] = "admit"
        except GuardError as e:
            head = e.message.split(":", 1)[0] if e.code == "guided_backend_cost_exceeded" else ""
            out[name] = f"refuse ({head or e.code})"
    return out


def measure(backends: list[str]) -> dict[str, Any]:
    from fuzz.oracle import Oracle
    from fuzz.targets import Budgets, load_vocab
    from fuzz.targets.backends import join_input
    from fuzz.targets.backends_corpus import BENIGN, EXPENSIVE

    os.environ["SCHEDGUARD_BACKENDS_POLICY"] = "off"
    vocab = load_vocab()
    cases = [("benign", *c) for c in BENIGN] + [("expensive", *c) for c in EXPENSIVE]
    rows: dict[str, Any] = {
        "vocab": vocab.size,
        "tokenizer": vocab.source,
        "cases": {cid: {"group": g, "kind": k} for g, cid, k, _ in cases},
    }
    for backend in backends:
        budgets = Budgets(wall_s=5.0, mem_bytes=1 << 30)
        with Oracle(f"backend-{backend}", isolate=True, budgets=budgets) as oracle:
            for _group, cid, kind, spec in cases:
                out = oracle.run(join_input(kind, spec))
                c = out.cost
                cell: dict[str, Any]
                if out.verdict in ("ok", "budget"):
                    cell = {"cpu_s": round(c.busy_s, 4), "mem_mb": round(c.peak_mem_bytes / 2**20)}
                elif out.verdict == "rejected":
                    cell = {"rejected": (out.error_message or "")[:80]}
                else:  # timeout, oom, crash (a mask over budget, a signal)
                    cell = {"failed": out.verdict, "why": (out.error_message or "")[:80]}
                rows["cases"][cid][backend] = cell
                print(backend, cid, cell, file=sys.stderr, flush=True)
    for _group, cid, kind, spec in cases:
        rows["cases"][cid]["guard"] = verdicts(kind, spec, vocab.size)
    return rows


def _over(cell: dict[str, Any] | None) -> bool | None:
    if cell is None or "rejected" in cell:
        return None
    if "failed" in cell:
        return True
    return bool(cell["cpu_s"] > 1.0 or cell["mem_mb"] > 256)


def _cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return "-"
    if "rejected" in cell:
        return "refused by it"
    if "failed" in cell:
        return f"**{cell['failed']}**"
    text = f"{cell['cpu_s']:.3g} s / {cell['mem_mb']} MB"
    return f"**{text}**" if _over(cell) else text


def merge(paths: list[str]) -> int:
    from fuzz.targets.backends_corpus import BENIGN, EXPENSIVE

    docs = [json.loads(Path(p).read_text()) for p in paths]
    cases: dict[str, Any] = {}
    for d in docs:
        for cid, row in d["cases"].items():
            cases.setdefault(cid, {}).update(row)
    # the guard's verdicts from the code as it is now (the measurements are the backends')
    specs = {cid: (kind, spec) for cid, kind, spec in [*BENIGN, *EXPENSIVE]}
    for cid, row in cases.items():
        if cid in specs:
            row["guard"] = verdicts(*specs[cid], docs[0]["vocab"])
    print(f"vocabulary: {docs[0]['vocab']} tokens ({docs[0]['tokenizer']})\n")
    head = "| case | " + " | ".join(BACKENDS) + " | guard: " + " | ".join(POLICIES) + " |"
    print(head)
    print("|" + "---|" * (1 + len(BACKENDS) + len(POLICIES)))
    false_refusals, bypasses = [], []
    for cid, row in cases.items():
        g = row["guard"]
        cells = [_cell(row.get(b)) for b in BACKENDS]
        print(
            f"| `{cid}` | " + " | ".join(cells) + " | " + " | ".join(g[p] for p in POLICIES) + " |"
        )
        for p in POLICIES:
            reach = ("xgrammar", "guidance") if p == "default" else (p,)
            over = [_over(row.get(b)) for b in reach]
            if p == "default" and "outlines" in g[p]:
                continue  # routed to outlines: refused whatever it costs (the sticky backend)
            if any(
                o is None and b in row and "rejected" not in row[b]
                for o, b in zip(over, reach, strict=True)
            ):
                continue
            measured_over = any(o for o in over if o is not None)
            if g[p] == "admit" and measured_over:
                bypasses.append(f"{cid} under {p}")
            measured_all = all(b in row for b in reach)
            if row["group"] == "benign" and g[p] != "admit" and not measured_over and measured_all:
                false_refusals.append(f"{cid} under {p}: {g[p]}")
    print(f"\nadmitted over budget: {len(bypasses)} {bypasses}")
    print(f"benign refused although within budget: {len(false_refusals)} {false_refusals}")
    return 1 if bypasses else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", nargs="+", choices=BACKENDS, default=["outlines", "guidance"])
    ap.add_argument("--out", default=str(ROOT / "build" / "guided_backends.json"))
    ap.add_argument("--merge", nargs="+", help="print the table of these result files")
    args = ap.parse_args()
    if args.merge:
        return merge(args.merge)
    rows = measure(args.backends)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

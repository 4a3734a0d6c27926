"""Issue 4's proof campaign: 60 s of the ``search`` engine from the trivial seed corpus.

- ``placeholder-vulnerable`` and ``chat-template-vulnerable`` must yield a finding that crosses
  the time or memory budget, minimised to at most 512 bytes (saved under --out, or the corpus
  root --found-root names);
- ``placeholder-hardened`` and ``chat-template-hardened`` must yield none in the same time.

Prints one row per target and writes each campaign's reports under ``--out``; exits 1 when the
proof does not hold. Not part of the test suite (4 minutes).

    .venv/bin/python bench/fuzz_proof.py [--duration 60] [--seed 1] [--out build/fuzz-proof]
        [--found-root DIR] [--targets a,b]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from fuzz.campaign import CampaignOptions, run_campaign  # noqa: E402

TARGETS = (
    "placeholder-vulnerable",
    "chat-template-vulnerable",
    "placeholder-hardened",
    "chat-template-hardened",
)
MAX_FINDING_BYTES = 512


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "build" / "fuzz-proof")
    ap.add_argument(
        "--found-root",
        type=Path,
        default=None,
        help="corpus root the findings are saved under (default: each target's --out directory)",
    )
    ap.add_argument("--targets", default=",".join(TARGETS))
    args = ap.parse_args(argv)
    ok = True
    rows = []
    for name in args.targets.split(","):
        rep = run_campaign(
            CampaignOptions(
                target=name,
                engine="search",
                duration_s=args.duration,
                seed=args.seed,
                out_dir=args.out / name,
                save_root=args.found_root,
                minimise_s=20.0,
                progress=None,
            )
        )
        if rep.kind == "vulnerable":
            good = [
                f
                for f in rep.findings
                if f.cause in ("time", "memory") and f.size_bytes <= MAX_FINDING_BYTES
            ]
            holds = bool(good)
        else:
            good = []
            holds = not rep.findings
        ok &= holds
        ttff = rep.time_to_first_finding_s
        sizes = ", ".join(
            f"{f.cause} {len(f.original)}->{f.size_bytes} B ({f.outcome.verdict})"
            for f in rep.findings
        )
        rows.append(
            f"{name:26} {rep.kind:10} {rep.execs:>9,} execs  first finding "
            f"{'-' if ttff is None else f'{ttff:6.2f} s'}  {sizes or 'no findings'}  "
            f"{'OK' if holds else 'FAILS'}"
        )
        print(rows[-1], flush=True)
    print("proof holds" if ok else "proof FAILS")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

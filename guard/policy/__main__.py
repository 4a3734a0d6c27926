"""``python -m guard.policy``: the policy's defaults as YAML, or its reference as Markdown."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version
from pathlib import Path

from guard.policy._load import default_policy, policy_to_yaml


def _write_reference(path: Path) -> None:
    """Replace the generated part of ``path`` (between its markers), keeping the rest."""
    from guard.policy._docs import BEGIN, END, policy_reference

    text = path.read_text(encoding="utf-8")
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no generated part ({BEGIN} ... {END}) to replace")
    reference = policy_reference().rstrip("\n")
    path.write_text(text[:start] + reference + text[end + len(END) :], encoding="utf-8")


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m guard.policy", description=__doc__)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--yaml", action="store_true", help="print the defaults as YAML (default)")
    what.add_argument(
        "--markdown", action="store_true", help="print the reference (docs/POLICY.md's part)"
    )
    what.add_argument(
        "--write",
        type=Path,
        metavar="PATH",
        help="replace the reference between PATH's markers (docs/POLICY.md), keeping the rest",
    )
    parser.add_argument(
        "--version", action="version", version=f"schedguard {version('schedguard')}"
    )
    args = parser.parse_args(argv)
    if args.write is not None:
        _write_reference(args.write)
        return 0
    if args.markdown:
        from guard.policy._docs import policy_reference

        sys.stdout.write(policy_reference())
        return 0
    sys.stdout.write(policy_to_yaml(default_policy()))
    return 0


raise SystemExit(_main(sys.argv[1:]))

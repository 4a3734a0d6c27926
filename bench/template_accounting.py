"""The guard's prompt count against real vLLM, chat template by chat template (issue 22).

Each template of ``loadtests/chat_templates`` (or ``--templates``) is served by vLLM 0.32 started
with ``--chat-template FILE`` (one server at a time), and given to ``schedguard serve`` in front
of it the way an operator would: a copy alone in another folder, the model's ``tokenizer.json``
as the tokenizer. Every request of ``loadtests.chat_accounting.CHATS`` goes to the guard's dry
run (``costs.prompt_tokens``) and to vLLM (``usage.prompt_tokens``, ``max_tokens`` 1). Prints,
per template: requests both served, how many the count matched exactly, how many it was over
(the largest ratio and the most tokens over), how many under (must be none), and the requests
either side refused; ``--json`` prints every request instead. Progress goes to stderr.

    .venv/bin/python bench/template_accounting.py
    .venv/bin/python bench/template_accounting.py --templates granite_3.jinja --json
    .venv/bin/python bench/template_accounting.py --render-like vllm,llama_cpp   # both modelled
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from corpus_upstreams import start_guard  # noqa: E402  (this folder: the guard as run there)

from loadtests.chat_accounting import (  # noqa: E402
    CHATS,
    TEMPLATES_DIR,
    TemplateSummary,
    compare,
    guard_policy_yaml,
    post_json,
    separate_template,
    summarize,
)
from loadtests.upstream_corpus import ScriptUpstream  # noqa: E402
from schedguard.servers import RunningServer, free_port  # noqa: E402


def run_template(
    template: Path, render_like: tuple[str, ...] | None, tmp: Path
) -> tuple[TemplateSummary, list[dict[str, Any]], float]:
    up = ScriptUpstream("vllm", free_port("127.0.0.1"), extra=["--chat-template", str(template)])
    started = time.monotonic()
    up.start()
    guard: RunningServer | None = None
    try:
        separate = separate_template(template, tmp / template.stem / "templates")
        policy = tmp / template.stem / "policy.yaml"
        policy.write_text(
            guard_policy_yaml(up.tokenizer_json, separate, 4096, render_like=render_like)
        )
        guard = start_guard(up.base_url, policy)
        url = guard.url

        def count(body: dict[str, Any]) -> tuple[int | None, str]:
            _, verdict = post_json(f"{url}/guard/v1/check?path=/v1/chat/completions", body)
            if verdict.get("allowed"):
                return int(verdict["costs"]["prompt_tokens"]), ""
            return None, f"guard {verdict.get('code')}"

        comparisons = []
        for name, body in CHATS.items():
            c = compare(name, body, count, up.base_url, up.model)
            print(f"  {template.name} {name}: {c.bound} vs {c.usage} {c.why}", file=sys.stderr)
            comparisons.append(c)
    finally:
        if guard is not None:
            guard.stop()
        up.stop()
    summary = summarize(template.name, comparisons)
    return summary, [asdict(c) for c in comparisons], time.monotonic() - started


def table(summaries: list[TemplateSummary]) -> str:
    lines = [
        "| template | compared | exact | over (max ratio, most tokens) | under | refused by vLLM "
        "| refused by the guard only |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summaries:
        over = f"{s.over} ({s.max_ratio:.2f}x, +{s.max_over_tokens})" if s.over else "0"
        lines.append(
            f"| {s.template} | {s.compared} | {s.exact} | {over} | {len(s.under)} "
            f"| {s.refused_by_upstream} | {len(s.refused_by_guard)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--templates",
        help="comma-separated template files or names in loadtests/chat_templates "
        "(default: all of them)",
    )
    parser.add_argument(
        "--render-like",
        help="the guard's limits.tokens.render_like, comma-separated (default: left out, so it "
        "follows the upstream kind: vllm)",
    )
    parser.add_argument("--json", action="store_true", help="print every request as JSON")
    parser.add_argument("--version", action="version", version="schedguard bench 1")
    args = parser.parse_args(argv)
    names = args.templates.split(",") if args.templates else None
    templates = (
        [p if (p := Path(n)).is_file() else TEMPLATES_DIR / n for n in names]
        if names
        else sorted(TEMPLATES_DIR.glob("*.jinja"))
    )
    render_like = tuple(args.render_like.split(",")) if args.render_like else None
    summaries: list[TemplateSummary] = []
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for template in templates:
            print(f"{template.name}: starting vLLM with --chat-template", file=sys.stderr)
            summary, requests, seconds = run_template(template, render_like, Path(tmp))
            summaries.append(summary)
            runs[template.name] = {"summary": asdict(summary), "requests": requests,
                                   "seconds": round(seconds, 1)}  # fmt: skip
    if args.json:
        print(json.dumps(runs, indent=2))
    else:
        print(table(summaries))
    return 0 if all(not s.under for s in summaries) else 1


if __name__ == "__main__":
    raise SystemExit(main())

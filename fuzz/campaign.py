"""Campaigns on in-process targets (``schedguard fuzz run --target NAME``).

A campaign runs one or more engines on one target for a total duration (``--engine all``
splits it evenly between the engines available here), shares one deduplicating finding set
between them, prints a live progress line and writes the reports (:mod:`fuzz.report`). Its
exit status is 1 when a target whose kind fails CI (hardened, guard) has a finding.

A live server's campaign (:func:`fuzz.live.run_live_campaign`) shares its progress line, run
context, finding set and reports.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TextIO

from fuzz.engines import (
    ENGINE_NAMES,
    EngineResult,
    EngineRun,
    EngineUnavailable,
    Progress,
    RunOptions,
    get_engine,
)
from fuzz.findings import FindingSet, known_causes
from fuzz.oracle import Oracle
from fuzz.report import CampaignReport, write_reports
from fuzz.targets import FAILS_CI, FuzzTarget, get_target

__all__ = [
    "CampaignOptions",
    "ProgressLine",
    "default_minimise_s",
    "draw_seed",
    "engine_names",
    "run_campaign",
]


@dataclass
class CampaignOptions:
    """``out_dir``: where the reports and the engines' working files go (None: no reports).
    ``save_root``: the corpus root findings are saved under, as ``<root>/found/<target>/``
    (None: ``out_dir``; a campaign writes into a corpus such as ``payloads/`` only when asked
    to, never into the installed package by default); ``save=False``: no payload files.
    ``isolate``: None follows the target (vulnerable targets always run in the worker process).
    ``max_execs``: each engine also ends after about this many executions (a count that means
    the same on any machine; ``duration_s`` stays the outer bound).
    """

    target: str
    engine: str = "search"
    duration_s: float = 60.0
    jobs: int = 1
    out_dir: Path | None = None
    seed: int | None = None
    save_root: Path | None = None
    save: bool = True
    minimise_s: float | None = None
    isolate: bool | None = None
    max_execs: int | None = None
    progress: TextIO | None = field(default_factory=lambda: sys.stderr)


def default_minimise_s(duration_s: float) -> float:
    """Minimisation time per finding: a third of the campaign, between 5 and 20 s."""
    return min(20.0, max(5.0, duration_s / 3))


def engine_names(engine: str) -> tuple[list[str], dict[str, str]]:
    """The engines ``engine`` stands for here, and those skipped with the reason."""
    names = list(ENGINE_NAMES) if engine == "all" else [engine]
    ok: list[str] = []
    skipped: dict[str, str] = {}
    for name in names:
        try:
            get_engine(name)
        except EngineUnavailable as exc:
            if engine != "all":
                raise
            skipped[name] = str(exc)
            continue
        ok.append(name)
    return ok, skipped


class ProgressLine:
    """The live progress line: rewritten in place on a terminal, one line every 5 s otherwise."""

    def __init__(self, stream: TextIO | None, target: str) -> None:
        self.stream = stream
        self.target = target
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self._last = -1e9
        self._width = 0

    def __call__(self, p: Progress) -> None:
        if self.stream is None:
            return
        now = time.monotonic()
        if not self.tty and now - self._last < 5.0:
            return
        self._last = now
        cov = "-" if p.coverage is None else f"{p.coverage:,}"
        line = (
            f"[{self.target} {p.engine}] {p.elapsed_s:6.1f}s  execs {p.execs:,} "
            f"({p.execs_per_s:,.0f}/s)  coverage {cov}  best cost {p.best_cost:,.1f}  "
            f"findings {p.findings}"
        )
        if self.tty:
            pad = max(0, self._width - len(line))
            self.stream.write("\r" + line + " " * pad)
            self._width = len(line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def note(self, text: str) -> None:
        if self.stream is None:
            return
        if self.tty and self._width:
            self.stream.write("\n")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()

    def done(self) -> None:
        if self.stream is not None and self.tty and self._width:
            self.stream.write("\n")
            self.stream.flush()
            self._width = 0


def draw_seed(seed: int | None) -> int:
    """The campaign's seed: the one asked for, else one drawn here, so that the report
    always records the seed that repeats the run (``--seed``)."""
    return random.randrange(1 << 30) if seed is None else seed


def run_campaign(opts: CampaignOptions) -> CampaignReport:
    target = get_target(opts.target)
    opts = replace(opts, seed=draw_seed(opts.seed))
    names, skipped = engine_names(opts.engine)
    save_root = _save_root(opts)
    progress = ProgressLine(opts.progress, target.name)
    for name, why in skipped.items():
        progress.note(f"engine {name} skipped: {why}")
    findings = FindingSet(known_causes(target.name, save_root) if save_root is not None else {})
    start = time.monotonic()
    results = [
        _run_engine(name, target, opts, save_root, findings, progress, len(names)) for name in names
    ]
    progress.done()
    report = CampaignReport(
        target=target.name,
        kind=target.kind,
        description=str(getattr(target, "description", "")),
        engine=opts.engine if opts.engine != "all" else "all:" + "+".join(names),
        duration_s=time.monotonic() - start,
        budgets=target.budgets.to_dict(),
        results=results,
        findings=list(findings.findings),
        fails_ci=target.kind in FAILS_CI,
        seed=opts.seed,
        jobs=opts.jobs,
        source=str(getattr(target, "source", "")),
        skipped=skipped,
    )
    if opts.out_dir is not None:
        write_reports(report, opts.out_dir)
    return report


def _save_root(opts: CampaignOptions) -> Path | None:
    if not opts.save:
        return None
    root = opts.save_root if opts.save_root is not None else opts.out_dir
    if root is None:
        raise ValueError("findings are saved under save_root or out_dir: give one (or save=False)")
    return root


def _run_engine(
    name: str,
    target: FuzzTarget,
    opts: CampaignOptions,
    save_root: Path | None,
    findings: FindingSet,
    progress: ProgressLine,
    engines: int,
) -> EngineResult:
    """One engine's share of the campaign; an engine that fails is reported, not raised."""
    isolate = target.isolate_by_default if opts.isolate is None else opts.isolate
    if target.kind == "vulnerable":
        isolate = True  # never run a vulnerable engine in this process

    def factory() -> Oracle:
        return Oracle(target.name, isolate=isolate)

    options = RunOptions(
        duration_s=opts.duration_s / max(1, engines),
        jobs=opts.jobs,
        # Absolute: engines may run tools from another working directory.
        out_dir=None if opts.out_dir is None else opts.out_dir.resolve() / f"engine-{name}",
        seed=opts.seed,
        minimise_s=(
            opts.minimise_s if opts.minimise_s is not None else default_minimise_s(opts.duration_s)
        ),
        save_root=save_root,
        max_execs=opts.max_execs,
    )
    run = EngineRun(target, factory, options, engine=name, findings=findings, on_progress=progress)
    try:
        result = get_engine(name)(run)
    except Exception as exc:  # one engine failing must not lose the others' results
        progress.note(f"engine {name} failed: {type(exc).__name__}: {exc}")
        run.error(exc)
        result = run.result()
    for err in result.extra.get("errors") or []:
        progress.note(f"engine {name}: {err}")
    return result

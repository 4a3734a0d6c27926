"""Plain-text tables of the demo's rows, and the seed write-up's numbers beside ours."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from schedguard.demo import DemoConfig, Row

MiB = 1 << 20

# From the seed write-up (SEED.md): the seed payload before and after the patch.
SEED_BEFORE = ("infinite (timeout)", "4.2 GB")
SEED_AFTER_MS = 127.0
SEED_AFTER_MB = 312.0


def outcome_text(row: Row, config: DemoConfig) -> str:
    if row.status is not None:
        return f"{row.status} {row.code or ''}".rstrip()
    if row.outcome == "killed":
        return f"killed (cap {config.mem_limit_bytes // MiB} MiB)"
    if row.outcome == "timeout":
        return f"timeout (> {config.timeout_s:g} s)"
    return f"error: {row.detail}"[:60]


def _latency(ms: float) -> str:
    return f"{ms / 1000:.1f} s" if ms >= 1000 else f"{ms:.1f} ms"


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    fmt = [("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
           for r in [header, *body]]  # fmt: skip
    return "\n".join([fmt[0], line, *fmt[1:]])


def render_rows(rows: Sequence[Row], config: DemoConfig) -> str:
    header = ("target", "profile", "payload", "outcome", "latency", "peak RSS", "growth")
    body = [
        (
            r.target,
            r.profile,
            r.payload,
            outcome_text(r, config),
            _latency(r.latency_ms),
            f"{r.peak_rss_mb:.0f} MB",
            f"+{r.rss_growth_mb:.1f} MB",
        )
        for r in rows
    ]
    notes = [
        f"  {r.target} ({r.profile}), {r.payload}: "
        + ", ".join(
            f"{name} {mb:.0f} MB (+{r.server_rss_growth_mb.get(name, 0.0):.1f})"
            for name, mb in r.server_peak_rss_mb.items()
        )
        for r in rows
        if len(r.server_peak_rss_mb) > 1
    ]
    if not notes:
        return _table(header, body)
    return "\n".join([_table(header, body), "", "peak RSS per server (growth):", *notes])


def render_comparison(rows: Sequence[Row], config: DemoConfig) -> str:
    """The seed write-up's before/after beside this run's vulnerable/hardened seed rows, and the
    guard's row when it ran."""

    def ours(profile: str) -> Row | None:
        return next(
            (r for r in rows if r.payload == "seed" and r.profile == profile
             and r.target == "scheduler_ref"),
            None,
        )  # fmt: skip

    before, after = ours("vulnerable"), ours("hardened")
    guarded = next((r for r in rows if r.payload == "seed" and r.target == "guard"), None)
    body = [("before patch", *SEED_BEFORE, "vulnerable", *_ours_cells(before, config))]
    ratio = ""
    if after is not None and after.outcome == "rejected" and after.latency_ms > 0:
        ratio = (
            f"  ({SEED_AFTER_MS / after.latency_ms:.0f}x faster, "
            f"{SEED_AFTER_MB / max(after.peak_rss_mb, 0.1):.1f}x less memory than the write-up)"
        )
    body.append(
        ("after patch", f"{SEED_AFTER_MS:.0f} ms", f"{SEED_AFTER_MB:.0f} MB", "hardened",
         *_ours_cells(after, config))
    )  # fmt: skip
    if guarded is not None:
        body.append(
            ("guard in front", "-", "-", f"guard + {guarded.profile}",
             *_ours_cells(guarded, config))
        )  # fmt: skip
    header = ("seed payload", "write-up", "peak", "this run", "outcome", "latency", "peak RSS")
    return _table(header, body) + ("\n" + ratio.strip() if ratio else "")


def _ours_cells(row: Row | None, config: DemoConfig) -> tuple[str, str, str]:
    if row is None:
        return ("-", "-", "-")
    return (outcome_text(row, config), _latency(row.latency_ms), f"{row.peak_rss_mb:.0f} MB")

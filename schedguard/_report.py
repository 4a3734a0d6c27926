"""Plain-text tables of the demo's rows, and the seed write-up's numbers beside ours.

A row's ``latency`` is its first request (connecting to a cold server included); ``steady`` is a
refusal's steady-state latency, the median of many more on a kept-alive connection: the figure
the write-up's "after patch" latency (a warm server's refusal) is comparable with.
"""

from __future__ import annotations

from collections.abc import Sequence

from schedguard._demo_rows import DemoConfig, MiB, Row

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


def _steady(row: Row) -> str:
    return "-" if row.steady_latency_ms is None else _latency(row.steady_latency_ms)


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    line = "  ".join("-" * w for w in widths)
    fmt = [("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))).rstrip()
           for r in [header, *body]]  # fmt: skip
    return "\n".join([fmt[0], line, *fmt[1:]])


def render_rows(rows: Sequence[Row], config: DemoConfig) -> str:
    header = ("target", "profile", "payload", "outcome", "first", "steady", "peak RSS", "growth")
    body = [
        (
            r.target,
            r.profile,
            r.payload,
            outcome_text(r, config),
            _latency(r.latency_ms),
            _steady(r),
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
    legend = (
        "first: the first request (connecting included); steady: a refusal's median over "
        f"{max((r.steady_requests for r in rows), default=0)} more on a kept-alive connection"
    )
    if not notes:
        return "\n".join([_table(header, body), legend])
    return "\n".join([_table(header, body), legend, "", "peak RSS per server (growth):", *notes])


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
        # The write-up's 127 ms is a warm server's refusal: compare the steady state with it.
        ms, which = after.latency_ms, "first request"
        if after.steady_latency_ms:
            ms, which = after.steady_latency_ms, "steady state"
        ratio = (
            f"  ({SEED_AFTER_MS / ms:.0f}x faster ({which}), "
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
    header = ("seed payload", "write-up", "peak", "this run", "outcome", "first", "steady",
              "peak RSS")  # fmt: skip
    return _table(header, body) + ("\n" + ratio.strip() if ratio else "")


def _ours_cells(row: Row | None, config: DemoConfig) -> tuple[str, str, str, str]:
    if row is None:
        return ("-", "-", "-", "-")
    return (
        outcome_text(row, config),
        _latency(row.latency_ms),
        _steady(row),
        f"{row.peak_rss_mb:.0f} MB",
    )

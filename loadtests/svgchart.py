"""Time charts as inline SVG, drawn in Python: the load report and the live dashboard embed them
as they are (no script, no external asset, so a report opens offline and renders the same in
every browser).

Two kinds, both over "seconds into the run" with labelled axes and grid lines:

- :func:`line_chart`: lines (gaps where a point is ``None``), optional dashed horizontal
  thresholds, vertical markers (a process that died) and shaded bands on a 0-100% right axis
  (the attack share and the benign error share behind the latency);
- :func:`bar_chart`: stacked bars per time window (rates by code).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Band",
    "Bars",
    "HLine",
    "Line",
    "Marker",
    "Point",
    "bar_chart",
    "format_seconds",
    "line_chart",
    "nice_ticks",
    "time_ticks",
]

# A point of a line: (seconds, value); a None value breaks the line.
Point = tuple[float, float | None]

_LEFT, _RIGHT, _TOP, _BOTTOM = 62, 52, 14, 40
_AXIS = "#444"
_GRID = "#e3e3e3"
_FONT = 'font-family="system-ui,sans-serif" font-size="12"'


@dataclass(frozen=True)
class Line:
    label: str
    color: str
    points: Sequence[Point]
    dashed: bool = False
    width: float = 2.0


@dataclass(frozen=True)
class Band:
    """An area on the right axis (0..1 shown as 0-100%), drawn behind the lines."""

    label: str
    color: str
    points: Sequence[Point]
    opacity: float = 0.16


@dataclass(frozen=True)
class HLine:
    label: str
    color: str
    y: float
    dash: str = "7 5"


@dataclass(frozen=True)
class Marker:
    """A vertical line at ``x`` (e.g. the time a server was found gone)."""

    label: str
    color: str
    x: float


@dataclass(frozen=True)
class Bars:
    """Stacked bars: ``starts[i]`` to ``starts[i] + width`` carries ``stacks[label][i]``;
    ``counts[label][i]``, when given, is what that height was computed from (each rectangle
    carries it as ``data-count``, so a page can be checked against its tables)."""

    starts: Sequence[float]
    width: float
    stacks: Sequence[tuple[str, str, Sequence[float]]] = field(default_factory=tuple)
    counts: Mapping[str, Sequence[float]] = field(default_factory=dict)


def nice_ticks(hi: float, n: int = 5) -> list[float]:
    """0 and round steps up to at least ``hi`` (1, 2, 2.5 or 5 times a power of ten)."""
    if not hi > 0:
        return [0.0, 1.0]
    raw = hi / n
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    count = math.ceil(hi / step - 1e-9)
    return [round(i * step, 10) for i in range(count + 1)]


_TIME_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200)


def time_ticks(hi: float, n: int = 8) -> list[float]:
    """Ticks over ``[0, hi]`` seconds at a step a clock reads well (5 s, 30 s, 1 min, 5 min)."""
    hi = max(hi, 1.0)
    step = next((s for s in _TIME_STEPS if hi / s <= n), _TIME_STEPS[-1])
    return [float(i * step) for i in range(int(hi // step) + 1)]


def format_seconds(t: float, hi: float) -> str:
    if hi <= 120:
        return f"{t:g} s"
    minutes, seconds = divmod(round(t), 60)
    return f"{minutes}:{seconds:02d}"


def _fmt(v: float) -> str:
    if v >= 100 or v == int(v):
        return f"{v:,.0f}"
    return f"{v:.3g}"


class _Frame:
    def __init__(
        self, width: int, height: int, x_max: float, y_max: float, *, right_axis: bool
    ) -> None:
        self.width, self.height = width, height
        self.x_max = max(x_max, 1e-9)
        self.y_ticks = nice_ticks(y_max)
        self.y_max = self.y_ticks[-1]
        self.x0, self.x1 = _LEFT, width - (_RIGHT if right_axis else 16)
        self.y0, self.y1 = height - _BOTTOM, _TOP

    def x(self, v: float) -> float:
        return self.x0 + (self.x1 - self.x0) * min(max(v, 0.0), self.x_max) / self.x_max

    def y(self, v: float) -> float:
        return self.y0 - (self.y0 - self.y1) * min(max(v, 0.0), self.y_max) / self.y_max

    def y_share(self, v: float) -> float:
        return self.y0 - (self.y0 - self.y1) * min(max(v, 0.0), 1.0)

    def axes(self, y_unit: str, x_label: str = "time into the run") -> list[str]:
        out = []
        for v in self.y_ticks:
            y = self.y(v)
            out.append(
                f'<line x1="{self.x0}" y1="{y:.1f}" x2="{self.x1}" y2="{y:.1f}" stroke="{_GRID}"/>'
            )
            out.append(
                f'<text x="{self.x0 - 6}" y="{y + 4:.1f}" text-anchor="end" fill="{_AXIS}">'
                f"{_fmt(v)}</text>"
            )
        for t in time_ticks(self.x_max):
            x = self.x(t)
            out.append(
                f'<line x1="{x:.1f}" y1="{self.y1}" x2="{x:.1f}" y2="{self.y0}" stroke="{_GRID}"/>'
            )
            out.append(
                f'<text x="{x:.1f}" y="{self.y0 + 16}" text-anchor="middle" fill="{_AXIS}">'
                f"{format_seconds(t, self.x_max)}</text>"
            )
        out.append(
            f'<polyline fill="none" stroke="{_AXIS}" points="{self.x0},{self.y1} '
            f'{self.x0},{self.y0} {self.x1},{self.y0}"/>'
        )
        out.append(
            f'<text x="14" y="{(self.y0 + self.y1) / 2:.1f}" text-anchor="middle" fill="{_AXIS}" '
            f'transform="rotate(-90 14 {(self.y0 + self.y1) / 2:.1f})">{html.escape(y_unit)}</text>'
        )
        out.append(
            f'<text x="{(self.x0 + self.x1) / 2:.1f}" y="{self.height - 4}" '
            f'text-anchor="middle" fill="{_AXIS}">{html.escape(x_label)}</text>'
        )
        return out


def _svg(chart_id: str, title: str, width: int, height: int, body: Sequence[str]) -> str:
    return (
        f'<svg id="{html.escape(chart_id)}" class="chart" data-chart="{html.escape(chart_id)}" '
        f'xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
        f'width="{width}" height="{height}" role="img" aria-label="{html.escape(title)}" {_FONT}>'
        f"<title>{html.escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _empty(frame: _Frame, text: str) -> str:
    return (
        f'<text class="empty" x="{(frame.x0 + frame.x1) / 2:.1f}" '
        f'y="{(frame.y0 + frame.y1) / 2:.1f}" text-anchor="middle" fill="#888" font-size="14">'
        f"{html.escape(text)}</text>"
    )


def _segments(points: Sequence[Point]) -> list[list[tuple[float, float]]]:
    out: list[list[tuple[float, float]]] = [[]]
    for x, y in points:
        if y is None:
            if out[-1]:
                out.append([])
        else:
            out[-1].append((x, y))
    return [s for s in out if s]


def line_chart(
    chart_id: str,
    title: str,
    *,
    lines: Sequence[Line],
    x_max: float,
    y_unit: str,
    y_max: float | None = None,
    bands: Sequence[Band] = (),
    hlines: Sequence[HLine] = (),
    markers: Sequence[Marker] = (),
    width: int = 1240,
    height: int = 260,
    empty_text: str = "no data",
    x_label: str = "time into the run",
) -> str:
    """An SVG line chart; ``y_max`` (e.g. shared by two runs side by side) defaults to the
    data's and the thresholds' maximum plus a tenth."""
    values = [y for line in lines for _, y in line.points if y is not None]
    top = y_max if y_max is not None else max([*values, *(h.y for h in hlines), 0.0]) * 1.1
    frame = _Frame(width, height, x_max, top or 1.0, right_axis=bool(bands))
    body = frame.axes(y_unit, x_label)
    if bands:
        body += _share_axis(frame, bands[0].color)
    for band in bands:
        body += _band(frame, band)
    for h in hlines:
        if h.y > frame.y_max:
            continue
        y = frame.y(h.y)
        body.append(
            f'<line class="threshold" x1="{frame.x0}" y1="{y:.1f}" x2="{frame.x1}" y2="{y:.1f}" '
            f'stroke="{h.color}" stroke-width="1.5" stroke-dasharray="{h.dash}">'
            f"<title>{html.escape(h.label)}</title></line>"
            f'<text x="{frame.x1 - 4}" y="{y - 5:.1f}" text-anchor="end" fill="{h.color}">'
            f"{html.escape(h.label)}</text>"
        )
    for m in markers:
        x = frame.x(m.x)
        # The label on the side with room (a server gone at the end: left of the line).
        left = x > (frame.x0 + frame.x1) / 2
        body.append(
            f'<line class="marker" x1="{x:.1f}" y1="{frame.y1}" x2="{x:.1f}" y2="{frame.y0}" '
            f'stroke="{m.color}" stroke-width="2" stroke-dasharray="3 3"/>'
            f'<text x="{x - 4 if left else x + 4:.1f}" y="{frame.y1 + 14}" fill="{m.color}" '
            f'text-anchor="{"end" if left else "start"}" font-weight="600">'
            f"{html.escape(m.label)}</text>"
        )
    drawn = 0
    for line in lines:
        for seg in _segments(line.points):
            pts = " ".join(f"{frame.x(x):.1f},{frame.y(y):.1f}" for x, y in seg)
            dash = ' stroke-dasharray="6 4"' if line.dashed else ""
            if len(seg) == 1:
                x, y = seg[0]
                body.append(
                    f'<circle cx="{frame.x(x):.1f}" cy="{frame.y(y):.1f}" r="2.5" '
                    f'fill="{line.color}"/>'
                )
            body.append(
                f'<polyline class="series" fill="none" stroke="{line.color}" '
                f'stroke-width="{line.width}" stroke-linejoin="round"{dash} points="{pts}">'
                f"<title>{html.escape(line.label)}</title></polyline>"
            )
            drawn += 1
    if not drawn and not bands:
        body.append(_empty(frame, empty_text))
    return _svg(chart_id, title, width, height, body)


def _share_axis(frame: _Frame, color: str) -> list[str]:
    return [
        f'<text x="{frame.x1 + 6}" y="{frame.y_share(v) + 4:.1f}" fill="{color}">{v:.0%}</text>'
        for v in (0.0, 0.5, 1.0)
    ]


def _band(frame: _Frame, band: Band) -> list[str]:
    out = []
    for seg in _segments(band.points):
        first, last = seg[0][0], seg[-1][0]
        pts = " ".join(f"{frame.x(x):.1f},{frame.y_share(y):.1f}" for x, y in seg)
        out.append(
            f'<polygon class="band" fill="{band.color}" fill-opacity="{band.opacity}" '
            f'stroke="{band.color}" '
            f'stroke-opacity="0.5" points="{frame.x(first):.1f},{frame.y0} {pts} '
            f'{frame.x(last):.1f},{frame.y0}"><title>{html.escape(band.label)}</title></polygon>'
        )
    return out


def bar_chart(
    chart_id: str,
    title: str,
    *,
    bars: Bars,
    x_max: float,
    y_unit: str,
    y_max: float | None = None,
    width: int = 1240,
    height: int = 260,
    empty_text: str = "no data",
) -> str:
    """Stacked bars per window; each rectangle's tooltip names its label, window and value."""
    totals = [sum(values[i] for _, _, values in bars.stacks) for i in range(len(bars.starts))]
    top = y_max if y_max is not None else max(totals, default=0.0) * 1.1
    frame = _Frame(width, height, x_max, top or 1.0, right_axis=False)
    body = frame.axes(y_unit)
    drawn = 0
    for i, start in enumerate(bars.starts):
        x_a, x_b = frame.x(start), frame.x(start + bars.width)
        gap = min(2.0, (x_b - x_a) * 0.15)
        base = 0.0
        for label, color, values in bars.stacks:
            v = values[i]
            if v <= 0:
                continue
            y_top, y_bottom = frame.y(base + v), frame.y(base)
            base += v
            tip = f"{label}: {_fmt(v)} {y_unit} ({format_seconds(start, x_max)}+)"
            data = f' data-series="{html.escape(label, quote=True)}"'
            if label in bars.counts:
                n = bars.counts[label][i]
                tip += f", {n:g} in all"
                data += f' data-count="{n:g}"'
            body.append(
                f'<rect class="bar"{data} x="{x_a + gap / 2:.1f}" y="{y_top:.1f}" '
                f'width="{max(0.5, x_b - x_a - gap):.1f}" height="{max(0.5, y_bottom - y_top):.1f}" '
                f'fill="{color}"><title>{html.escape(tip)}</title></rect>'
            )
            drawn += 1
    if not drawn:
        body.append(_empty(frame, empty_text))
    return _svg(chart_id, title, width, height, body)

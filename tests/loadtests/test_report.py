"""report.html (loadtests/report.py): one self-contained file with the SLO verdicts and the run
over time, alone or beside a ``--no-guard`` run, checked as HTML and in headless Chromium.

The fixtures in tests/data/load_report/ are two real runs of ``schedguard load`` (see the README
there): the guard in front of the vulnerable reference scheduler, and the same traffic with
``--no-guard``, where the upstream dies of memory 15 s in. Nothing here imports locust.
"""

from __future__ import annotations

import collections
import json
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from loadtests import dashboard, outcomes, report, slo, svgchart, timeline
from schedguard import _load_cli
from schedguard.cli import build_parser
from tests import _chromium
from tests._support import TESTS_DIR

DATA = TESTS_DIR / "data" / "load_report"
GUARD, NO_GUARD = DATA / "guard", DATA / "no-guard"


# ------------------------------------------------------------------------------ parsing


class _Page(HTMLParser):
    """What the tests look for: SLO rows, charts and their drawn shapes, resources loaded."""

    def __init__(self) -> None:
        super().__init__()
        self.slo_rows: list[str] = []
        self.charts: dict[str, dict[str, int]] = {}
        self.empty_charts: set[str] = set()
        self.scripts = 0
        self.resources: list[str] = []  # src= / external href= / url( in styles
        self.styles = ""
        self.verdict = ""
        self._chart: str | None = None
        self._in_style = self._in_verdict = self._in_empty = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "tr" and a.get("data-slo"):
            self.slo_rows.append(a["data-slo"] or "")
        if tag == "svg" and "chart" in (a.get("class") or "").split():
            self._chart = a.get("id") or ""
            self.charts[self._chart] = {}
        elif self._chart is not None:
            self.charts[self._chart][tag] = self.charts[self._chart].get(tag, 0) + 1
            if tag == "text" and a.get("class") == "empty":
                self._in_empty = True
        if tag == "script":
            self.scripts += 1
        if a.get("src"):
            self.resources.append(a["src"] or "")
        if tag == "link" or (a.get("href") or "").startswith(("http:", "https:", "//")):
            self.resources.append(a.get("href") or tag)
        if tag == "style":
            self._in_style = True
        if a.get("id") == "verdict":
            self._in_verdict = True

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = None
        self._in_style = self._in_verdict = self._in_empty = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles += data
        if self._in_verdict:
            self.verdict += data
        if self._in_empty and self._chart is not None:
            self.empty_charts.add(self._chart)


def _parse(text: str) -> _Page:
    page = _Page()
    page.feed(text)
    page.close()
    return page


def _assert_self_contained(page: _Page) -> None:
    assert page.scripts == 0  # the charts are drawn in Python: nothing to run
    assert page.resources == []
    assert "url(" not in page.styles and "@import" not in page.styles


def _svg_of(text: str, chart_id: str) -> str:
    start = text.index(f'<svg id="{chart_id}"')
    return text[start : text.index("</svg>", start)]


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ------------------------------------------------------------------------------ timeline


def test_timeline_buckets_merge_and_build() -> None:
    worker, master = timeline.Timeline(), timeline.Timeline()
    worker.request(1000.2, "BENIGN", 730.0, failed=False)
    worker.request(1000.7, "BENIGN", 12.0, failed=True)  # counted, not a latency
    limited = outcomes.key("volume", outcomes.FLOOD, 429, "rate_limited_tokens")
    lost = outcomes.key("fan_out", outcomes.CONTENT_ATTACK, 0, None, "timeout: read")
    worker.attack(1001.5, limited)
    worker.attack(1001.6, lost)
    worker.burst(1001.7, stopped=True)
    sent = json.loads(json.dumps(worker.drain()))  # as it travels to the master
    assert worker.buckets == {}
    master.merge(sent)
    master.request(1000.9, "BENIGN", 1234.0, failed=False)
    master.sample_users(1000.5, {"benign": 3, "attack": 1})
    data = timeline.build(
        master,
        t0=1000.0,
        end=1002.5,
        rss={"guard": [(1000.5, 100 << 20)]},
        rejections=[(1000.0, {}), (1002.0, {"rate_limited_tokens": 1.0})],
        died={"upstream": 1002.0},
        periods={"rss_s": 1.0},
    )
    assert data["duration_s"] == 2.5
    assert data["buckets"]["0"]["lat BENIGN"] == {"730": 1, "1200": 1}
    assert data["buckets"]["0"]["req BENIGN"] == {"ok": 2, "fail": 1}
    assert data["buckets"]["1"][timeline.ATTACKS] == {limited: 1, lost: 1}
    assert timeline.attack_records(data["buckets"]) == {limited: 1, lost: 1}
    assert timeline.burst_records(data["buckets"]) == {outcomes.BURST_STOPPED: 1}
    assert data["periods_s"] == {"rss_s": 1.0} and data["version"] == 2
    assert data["rss_mb"] == {"guard": [[0.5, 100.0]]}
    assert data["guard_rejections"][1] == [2.0, {"rate_limited_tokens": 1.0}]
    assert data["users"] == [[0.5, {"benign": 3, "attack": 1}]]
    assert data["died_s"] == {"upstream": 2.0}
    assert timeline.bucket_ms(1234.0) == 1200 and timeline.bucket_ms(47.4) == 47


def test_rejections_count_each_increase_at_the_scrape_that_saw_it() -> None:
    samples = [[-1.0, {}], [4.0, {"a": 5.0}], [6.0, {"a": 5.0, "b": 10.0}], [31.0, {"a": 7.0}]]
    counts = report._counts_from_counters(samples, 5.0, 6)  # a 27 s run
    assert counts["a"] == [5.0, 0.0, 0.0, 0.0, 0.0, 2.0]  # 2 seen past the end: the last bar
    assert counts["b"] == [0.0, 10.0, 0.0, 0.0, 0.0, 0.0]


# ------------------------------------------------------------------------------ series


def test_series_of_the_recorded_runs() -> None:
    guard = report.series(report.load_run(GUARD))
    bare = report.series(report.load_run(NO_GUARD))
    assert 29 <= guard.duration <= 33 and guard.has_timeline
    # The burst shape: attackers only between 30% and 70% of the run.
    shares = {t: v for t, v in guard.attack_share if v is not None}
    assert max(v for t, v in shares.items() if t < 8) == 0.0
    assert max(v for t, v in shares.items() if 12 <= t <= 20) > 0.3
    assert any(v is not None for _, v in guard.latency["BENIGN"]["p99"])
    assert any(v is not None for _, v in guard.latency["TTFT"]["p50"])
    # Every rejection the guard counted during the run is in a bar.
    counts = report.count(report.load_run(GUARD))
    numbers = report.load_run(GUARD).numbers
    counted = sum(sum(row) for row in counts.rejections.values())
    assert counted == sum(numbers["guard_rejections_by_code"].values())
    # Every attack request the gate counted is in a bar, by what refused it.
    assert sum(sum(row) for row in counts.answers.values()) == numbers["attacks"]["requests"]
    assert {outcomes.CONTENT, outcomes.RATE, outcomes.SERVED_BEFORE_LIMIT} <= set(guard.answers)
    assert guard.answers[outcomes.CONTENT][0] == counts.answers[outcomes.CONTENT][0] / 5.0
    # Without the guard the upstream died 15 s in; benign requests failed from then on.
    assert 12 <= bare.died["upstream"] <= 18 and not bare.rejections
    late = [v for t, v in bare.benign_error_share if t > bare.died["upstream"] + 4]
    assert late and min(v for v in late if v is not None) > 0.9
    # Recorded before attack records (timeline.json version 1): no bars, said so.
    assert not bare.answers and not report.count(report.load_run(NO_GUARD)).recorded
    assert bare.peak_rss["upstream"] > 512


# ------------------------------------------------------------------------------ HTML


def test_report_of_one_run_has_every_slo_and_chart(tmp_path: Path) -> None:
    run = report.load_run(_copy_run(GUARD, tmp_path / "guard"))
    text = report.build_html(run)
    page = _parse(text)
    assert page.slo_rows == [c["name"] for c in run.checks]
    assert page.verdict == "PASS"
    assert set(page.charts) == set(report.CHARTS)
    for chart in ("benign-latency", "ttft", "itl", "rss"):
        assert page.charts[chart].get("polyline", 0) >= 2, chart  # p50 and p99 / two servers
    for chart in ("benign-latency", "ttft", "itl"):
        assert page.charts[chart].get("polygon", 0) >= 1, chart  # the attack share
    assert page.charts["guard-rejections"].get("rect", 0) >= 5
    assert page.charts["attack-answers"].get("rect", 0) >= 5
    assert not page.empty_charts
    _assert_self_contained(page)
    for code in run.numbers["guard_rejections_by_code"]:
        assert code in text
    for classes in run.numbers["attacks"]["by_intent"].values():
        for cls in classes:
            assert f'data-class="{cls}"' in text


def test_report_beside_a_no_guard_run(tmp_path: Path) -> None:
    out = _copy_run(GUARD, tmp_path / "guard")
    path = report.write_report(out, NO_GUARD)
    text = path.read_text()
    page = _parse(text)
    names = [c["name"] for c in report.load_run(GUARD).checks]
    older = [c["name"] for c in report.load_run(NO_GUARD).checks if c["name"] not in names]
    assert page.slo_rows == names + older == [*names, "attacks rejected"]  # its gate's, then
    assert set(page.charts) == {*report.CHARTS, *(f"{c}-compare" for c in report.CHARTS)}
    # No guard: nothing rejects; a version 1 timeline: no attack records to draw.
    assert page.empty_charts == {"guard-rejections-compare", "attack-answers-compare"}
    assert "no attack records in this run" in _svg_of(text, "attack-answers-compare")
    assert "not recorded (this run's timeline.json is older than attack records)" in text
    assert "without the guard (--no-guard)" in text and "upstream gone" in text
    assert "process gone" in text  # the no-guard run's failed health check, in its column
    rss = _svg_of(text, "rss-compare")
    assert 'class="marker"' in rss and "upstream SLO 512 MB" in rss  # gone past its SLO
    assert 'class="marker"' not in _svg_of(text, "rss")
    _assert_self_contained(page)


def test_report_of_a_run_without_a_timeline(tmp_path: Path) -> None:
    """An older run (slo.json only): verdicts, numbers and RSS from the SLO report; the other
    charts say why they are empty."""
    out = tmp_path / "old"
    out.mkdir()
    data = json.loads((GUARD / "report.json").read_text())
    data["numbers"]["rss_series_mb"] = {"guard": [[0, 90.0], [5, 95.0]]}
    for key in ("mode", "servers", "files"):
        data.pop(key)
    (out / "slo.json").write_text(json.dumps(data))
    text = report.build_html(report.load_run(out / "slo.json"))
    page = _parse(text)
    assert "No timeline.json in this run: no attack records." in text
    assert page.slo_rows == [c["name"] for c in data["checks"]]
    assert "rss" not in page.empty_charts and page.charts["rss"].get("polyline")
    assert {"benign-latency", "attack-answers"} <= page.empty_charts


def test_load_run_refuses_what_is_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        report.load_run(tmp_path)
    (tmp_path / "slo.json").write_text("{}")
    with pytest.raises(ValueError):
        report.load_run(tmp_path)


def test_schedguard_load_report_only_and_compare(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = _copy_run(GUARD, tmp_path / "guard")
    args = build_parser().parse_args(
        ["load", "--report-only", "--out", str(out), "--compare", str(NO_GUARD)]
    )
    assert _load_cli.run(args) == 0
    assert "-compare" in (out / "report.html").read_text()
    bad = build_parser().parse_args(["load", "--out", str(out), "--compare", str(tmp_path / "x")])
    assert _load_cli.run(bad) == 2
    assert "--compare" in capsys.readouterr().err
    same = build_parser().parse_args(["load", "--out", str(out), "--compare", str(out)])
    assert _load_cli.run(same) == 2
    assert "itself" in capsys.readouterr().err


def test_locust_writes_its_report_beside_ours() -> None:
    args = build_parser().parse_args(["load"])
    target = _load_cli.LoadEndpoints("http://g", "http://g", "http://u", 1, 2)
    cmd = _load_cli.locust_argv(args, target, Path("out"))
    assert cmd[cmd.index("--html") + 1] == str(Path("out") / "locust_report.html")
    assert cmd[cmd.index("--timeline-json") + 1] == str(Path("out") / "timeline.json")


# ------------------------------------------------------------------------------ charts


def test_ticks() -> None:
    assert svgchart.nice_ticks(4300) == [0, 1000, 2000, 3000, 4000, 5000]
    assert svgchart.nice_ticks(0) == [0.0, 1.0]
    assert svgchart.time_ticks(30) == [0, 5, 10, 15, 20, 25, 30]
    assert svgchart.time_ticks(600)[:3] == [0, 120, 240]
    assert svgchart.format_seconds(120, 600) == "2:00" and svgchart.format_seconds(5, 30) == "5 s"


def test_live_dashboard_memory_chart_has_a_time_axis() -> None:
    status: dict[str, Any] = {
        "guard": {"series": [[t, 90.0 + t / 10] for t in range(0, 61, 2)]},
        "upstream": {"series": [[t, 300.0] for t in range(0, 61, 2)]},
        "slo": {"thresholds": {"max_guard_rss_mb": 150.0, "max_upstream_rss_mb": 512.0}},
    }
    svg = dashboard.memory_svg(status)
    page = _parse(svg)
    assert page.charts["memory"].get("polyline", 0) >= 3  # two servers and the axes
    for tick in ("0 s", "30 s", "60 s"):
        assert f">{tick}</text>" in svg
    assert "time since the monitor started" in svg
    assert "guard SLO 150 MB" in svg and "upstream SLO 512 MB" in svg
    assert "<!--memory-->" not in dashboard.page(status) and "<svg" in dashboard.page(status)
    assert "no RSS samples yet" in dashboard.memory_svg({})


# ------------------------------------------------------------------------------ Chromium


def _close(rgb: tuple[int, ...], hex_colour: str, tolerance: int = 10) -> bool:
    want = bytes.fromhex(hex_colour.lstrip("#"))
    return all(abs(a - b) <= tolerance for a, b in zip(rgb, want, strict=True))


@pytest.mark.timeout(240)
def test_report_renders_in_chromium(tmp_path: Path) -> None:
    """The compared report in a real headless Chromium: a 1400x3000 screenshot that is not
    blank (every band of the page down to the charts' end has ink, with the series' colours
    drawn), and the DOM Chromium built has every SLO row and chart, with no console error."""
    _chromium.require_chromium()
    out = _copy_run(GUARD, tmp_path / "guard")
    html_path = report.write_report(out, NO_GUARD)
    url = html_path.resolve().as_uri()

    dom, console = _chromium.dump_dom(url)
    assert console == []
    page = _parse(dom)
    assert page.slo_rows == [c["name"] for c in report.load_run(GUARD).checks] + [
        "attacks rejected"  # the older no-guard run's gate
    ]
    assert set(page.charts) == {*report.CHARTS, *(f"{c}-compare" for c in report.CHARTS)}
    assert page.verdict == "PASS"

    png = tmp_path / "report.png"
    console = _chromium.screenshot(url, png)
    assert console == []
    image = _chromium.read_png(png)
    assert (image.width, image.height) == (1400, 3000)
    counts = collections.Counter(image.pixels(step=2))
    assert len(counts) > 500  # text, lines, areas, bars: not a blank or flat page
    # The charts span y ~ 450-2550: each 300-pixel band there has ink of its own (neither
    # the white of the figures nor the page's background).
    for y in range(450, 2550, 300):
        band = image.pixels(y, y + 300, step=2)
        ink = sum(1 for p in band if not (_close(p, "#ffffff", 6) or _close(p, "#f6f7f9", 6)))
        assert ink > 0.03 * len(band), f"rows {y}-{y + 300} look empty"
    # The series were drawn, not only the frames: their colours are on the page.
    for name, colour in (
        ("p99", report._P99),
        ("p50", report._P50),
        ("guard RSS", report._RSS["guard"]),
        ("upstream RSS", report._RSS["upstream"]),
        ("a rejection code", report._CODE_COLORS[0]),
        ("flood served", report._FLOOD_SERVED),
        ("benign errors", report._ERRORS),
    ):
        assert sum(n for p, n in counts.items() if _close(p, colour)) > 100, name


# ------------------------------------------------------------------------------ one set of counts


# A short run's records, made with the functions the locustfile records with: per second, the
# benign requests (ok, failed) and the attack requests' answers (class, aim, status, code).
_T0 = 1_000_000.0
_CONTENT_ANSWERS = [  # (second, class, status, code, count)
    (2, "json_body_bomb", 400, "json_depth_exceeded", 4),
    (3, "fan_out", 400, "n_exceeded", 2),
    (9, "fan_out", 429, "rate_limited_tokens", 3),  # the key out of tokens: never judged
    (11, "guided_decoding", 400, "guided_regex_unsafe", 1),
    (26, "template_kwargs", 400, "chat_template_kwarg_not_allowed", 2),
    (27, "redos_parser", 429, "concurrency_limited", 1),
    (46, "fan_out", 400, "stop_exceeded", 1),  # answered after the test stopped: in the last bar
]
_FLOOD_ANSWERS = [  # one burst of 12: 4 served before the limit, 8 refused by it
    (14, 200, None, 4),
    (15, 429, "rate_limited_requests", 5),
    (15, 429, "concurrency_limited", 3),
]


def _recorded_run(out: Path) -> Path:
    """``report.json`` and ``timeline.json`` of a 45 s run, as ``schedguard load`` writes them:
    the gate evaluated on the very records timeline.json keeps; the upstream seen gone 40 s in
    while ``schedguard load`` still read it as running; a soak threshold on a run too short
    for it."""
    line = timeline.Timeline()
    for s in range(45):
        line.request(_T0 + s + 0.5, "BENIGN", 300.0, failed=s == 41)
        if s % 5 == 0:
            line.request(_T0 + s + 0.2, "LOOKALIKE", 120.0, failed=False)
    for s, cls, status, code, n in _CONTENT_ANSWERS:
        record = outcomes.key(cls, outcomes.CONTENT_ATTACK, status, code)
        line.attack(_T0 + s + 0.3, record, n)
    for s, status, answer, n in _FLOOD_ANSWERS:
        line.attack(_T0 + s + 0.1, outcomes.key("volume", outcomes.FLOOD, status, answer), n)
    line.burst(_T0 + 15.5, outcomes.burst_stopped([(429, "rate_limited_requests")]))
    mb = 1 << 20
    rss = {
        "guard": [(_T0 + t, (90 + t // 5) * mb) for t in range(45)],
        "upstream": [(_T0 + t, 300 * mb) for t in range(41)],
    }
    scrapes = [
        (_T0 - 1.0, {}),
        (_T0 + 4.0, {"json_depth_exceeded": 4.0, "n_exceeded": 2.0}),
        (_T0 + 10.0, {"json_depth_exceeded": 4.0, "n_exceeded": 2.0, "rate_limited_tokens": 3.0}),
        (
            _T0 + 16.0,
            {
                "json_depth_exceeded": 4.0,
                "n_exceeded": 2.0,
                "rate_limited_tokens": 3.0,
                "guided_regex_unsafe": 1.0,
                "rate_limited_requests": 5.0,
                "concurrency_limited": 3.0,
            },
        ),
    ]
    data = slo.RunData(
        duration_s=45.0,
        benign_latency_ms={300: 44},
        benign_requests=45,
        benign_failures=1,
        lookalike_requests=9,
        attack_records=timeline.attack_records(line.buckets),
        flood_bursts=timeline.burst_records(line.buckets),
        guard_peak_rss=100 * mb,
        upstream_peak_rss=300 * mb,
        upstream_alive=False,
        upstream_status="process gone (40.0 s into the run)",
        guard_rejections=dict(scrapes[-1][1]),
        rss_series={name: [(t - _T0, b) for t, b in pts] for name, pts in rss.items()},
    )
    gate = slo.evaluate(data, slo.Thresholds(max_rss_slope_mb_per_min=1.0)).to_dict()
    servers = {
        name: {"url": "http://127.0.0.1:1", "pid": pid, "peak_rss_mb": peak, "exit": "running"}
        for name, pid, peak in (("guard", 11, 100.0), ("upstream", 12, 300.0))
    }
    servers["guard"].update(peak_rss_sample_s=0.2, exit_code=None)
    out.mkdir()
    (out / "report.json").write_text(json.dumps({**gate, "servers": servers, "mode": "guard"}))
    built = timeline.build(
        line,
        t0=_T0,
        end=_T0 + 45.0,
        rss=rss,
        rejections=scrapes,
        died={"upstream": _T0 + 40.0},
        periods={"rss_s": 1.01, "rss_asked_s": 1.0, "metrics_s": 2.03, "metrics_asked_s": 2.0},
    )
    timeline.write(out / "timeline.json", built)
    return out


class _Counted(HTMLParser):
    """``data-count`` numbers of the tables (by key) and the bars (by chart and series), the
    legends' totals, the SLO rows' measured text, the servers' states, the sampling text."""

    def __init__(self) -> None:
        super().__init__()
        self.table: dict[str, int] = {}
        self.bars: dict[str, collections.Counter[str]] = {}
        self.legends: dict[str, dict[str, str]] = {}
        self.measured: dict[str, str] = {}
        self.states: dict[str, str] = {}
        self.sampling: list[str] = []
        self._chart = self._figure = self._key = self._slo = self._state = ""
        self._cell = 0
        self._text = ""
        self._capture = ""

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "figure":
            self._figure = a.get("data-figure", "")
        if tag == "svg":
            self._chart = a.get("id", "")
        if tag == "rect" and "data-count" in a:
            bars = self.bars.setdefault(self._chart, collections.Counter())
            bars[a["data-series"]] += int(float(a["data-count"]))
        elif tag == "span" and "data-count" in a:
            self._key, self._capture, self._text = a["data-count"], "count", ""
        elif tag == "li" and self._figure:
            self._capture, self._text = "legend", ""
        elif tag == "tr" and a.get("data-slo"):
            self._slo, self._cell = a["data-slo"], 0
        elif tag == "td" and self._slo:
            self._cell += 1
            if self._cell == 3:  # name, threshold, measured
                self._capture, self._text = "measured", ""
        elif tag == "td" and "data-state" in a:
            self._state, self._capture, self._text = a["data-state"], "state", ""
        elif tag == "p" and "data-sampling" in a:
            self._capture, self._text = "sampling", ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "svg":
            self._chart = ""
        if tag == "figure":
            self._figure = ""
        if tag == "tr":
            self._slo = ""
        done = {"count": "span", "legend": "li", "measured": "td", "state": "td", "sampling": "p"}
        if self._capture and done[self._capture] == tag:
            if self._capture == "count":
                value = int(self._text.replace(",", ""))
                # A count shown in two places is the same number in both.
                assert self.table.setdefault(self._key, value) == value, self._key
            elif self._capture == "legend":
                label, _, total = self._text.rpartition(" (")
                self.legends.setdefault(self._figure, {})[label] = total.rstrip(")")
            elif self._capture == "measured":
                self.measured[self._slo] = self._text
            elif self._capture == "state":
                self.states[self._state] = self._text
            else:
                self.sampling.append(self._text)
            self._capture = ""

    def handle_data(self, data: str) -> None:
        if self._capture:
            self._text += data


def _counted(text: str) -> _Counted:
    page = _Counted()
    page.feed(text)
    page.close()
    return page


def test_every_figure_of_the_page_is_one_count(tmp_path: Path) -> None:
    """Each table number equals the charts' bars summed and the legends, and the SLO rows say
    the same numbers: all come from the run's records."""
    text = report.write_report(_recorded_run(tmp_path / "run")).read_text()
    page = _counted(text)
    answers = page.bars["attack-answers"]
    for category in outcomes.CATEGORIES:
        shown = page.table.get(f"attacks/{category}", 0)
        assert shown == answers.get(category, 0), category
        if shown:
            assert page.legends["attack-answers"][category] == str(shown)
    assert page.table["attacks/requests"] == sum(answers.values())
    rejections = page.bars["guard-rejections"]
    for key, shown in page.table.items():
        if key.startswith("rejections/"):
            code = key.removeprefix("rejections/")
            assert shown == rejections[code] == int(page.legends["guard-rejections"][code])
    assert sum(rejections.values()) == 18
    # What refused them, by aim: the decisions of loadtests.outcomes.
    t = page.table
    assert (t["content/content check"], t["content/rate limit"]) == (10, 3)
    assert t["content/concurrency limit"] == 1 and t["content/requests"] == 14
    assert t[f"flood/{outcomes.SERVED_BEFORE_LIMIT}"] == 4 and t["flood/requests"] == 12
    assert "attacks/served" not in t and "served" not in answers  # a flood's are expected
    assert (t["bursts/sent"], t["bursts/stopped"]) == (1, 1)
    # The gate's rows read the same records.
    judged = t["content/requests"] - sum(t.get(f"content/{c}", 0) for c in outcomes.LIMITS)
    assert page.measured[slo.CONTENT_CHECK] == (
        f"100.0% ({t['content/content check']}/{judged}); 4 refused by a limit first, not judged"
    )
    assert page.measured[slo.FLOOD_CHECK] == "100.0% (1/1 bursts)"
    assert page.measured["benign errors"] == (
        f"{t['benign/failed']} of {t['benign/requests']} "
        f"({t['benign/synthetic']} synthetic, {t['benign/lookalike']} look-alikes)"
    )
    assert t["benign/requests"] == t["benign/synthetic"] + t["benign/lookalike"] == 54
    # The latency charts' attack share counts requests as the tables do (each of a burst):
    # seconds 11-15 (the 5 s window before t = 16 s) hold the burst's 12 requests, one content
    # attack, and 6 benign requests (one a look-alike).
    share = dict(report.series(report.load_run(tmp_path / "run")).attack_share)
    assert share[16.0] == pytest.approx(13 / 19)
    # A 45 s run under a soak threshold: no slope, the reason instead, in the gate and table.
    assert page.measured["guard RSS slope"] == "too short to judge (44 s < 120 s)"
    assert "MB/min (gate" not in text
    # Sampling: said once, as measured; no other period anywhere on the page.
    assert len(page.sampling) == 1
    assert "RSS every 1.01 s (median gap; asked: 1 s)" in page.sampling[0]
    assert "every 0.2 s by schedguard load" in page.sampling[0]
    assert "/metrics scraped every 2.03 s" in page.sampling[0]
    assert "every second" not in text and "0.2 s samples" not in text
    # The upstream went 40 s in: never "running", whatever the exit status said.
    assert page.states["upstream"].startswith("gone, first seen gone 40.0 s into the run")
    assert "exit code unknown" in page.states["upstream"]
    assert page.states["guard"].startswith("running when the load ended")


def test_a_served_content_attack_is_counted_and_marked(tmp_path: Path) -> None:
    run = _recorded_run(tmp_path / "run")
    data = json.loads((run / "timeline.json").read_text())
    served = outcomes.key("fan_out", outcomes.CONTENT_ATTACK, 200, None)
    data["buckets"]["30"][timeline.ATTACKS] = {served: 1}
    (run / "timeline.json").write_text(json.dumps(data))
    text = report.write_report(run).read_text()
    page = _counted(text)
    assert page.table["attacks/served"] == page.bars["attack-answers"]["served"] == 1
    assert page.table["content/fan_out/served"] == 1
    assert '<td class="num status fail"><span data-count="content/fan_out/served">' in text

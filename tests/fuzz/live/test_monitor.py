"""fuzz.live._monitor: a server's resident memory, from its processes and its Prometheus metrics."""

from __future__ import annotations

from fuzz.live import HttpClient, RequestPacer, RssMonitor, parse_prometheus_rss
from tests.fuzz.live._fake import Fake


def test_parse_prometheus_rss() -> None:
    text = (
        "# HELP process_resident_memory_bytes x\n# TYPE process_resident_memory_bytes gauge\n"
        'process_resident_memory_bytes{pid="1"} 1.0e+08\nprocess_resident_memory_bytes{pid="2"} 5e7\n'
        "process_resident_memory_bytes_total 9\n"
    )
    assert parse_prometheus_rss(text) == 150_000_000
    assert parse_prometheus_rss("up 1\n") is None


def test_rss_monitor_reads_processes_and_metrics(fake: Fake) -> None:
    limiter = RequestPacer(100)
    metrics = HttpClient(fake.url, limiter=limiter)
    monitor = RssMonitor([fake.pid], metrics, "/metrics")
    total = monitor.sample()
    assert total > 150_000_000  # the metric's 1.5e8 plus the process's own RSS
    mark = monitor.mark()
    assert monitor.growth_since(mark) >= 0
    assert monitor.alive()
    metrics.close()

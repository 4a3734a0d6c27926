"""``schedguard serve --workers 4``: one ``/metrics`` for all the workers (issue 15).

The guard runs as deployed (a capped child process, uvicorn's workers on one port) in front of
the fake upstream. Requests on fresh connections land on whichever worker accepts them; every
scrape, whichever worker answers it, reads the sum over the workers: over 20 rounds the request
counter never goes back and reaches the number of requests sent (before, it read 3, 7, 2, 8, 6,
... for 5, 10, 15, 20, 25 requests). A worker killed mid-run keeps its counts in the sum (uvicorn
starts another), and its live gauges leave it.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.mmap_dict import MmapedDict

from tests._guard_harness import fake_upstream
from tests._guard_process import guard_spec, start

WORKERS = 4
ROUNDS = 20
PER_ROUND = 5
COUNTER = re.compile(
    r'^schedguard_guard_requests_total\{route="/v1/models",status="200"\} (\S+)$', re.M
)


async def _read(url: str) -> tuple[float, str]:
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(url + "/metrics")).text
    match = COUNTER.search(text)
    return (float(match.group(1)) if match else 0.0), text


def _served_by(directory: Path) -> dict[int, float]:
    """Requests to /v1/models each worker counted, from its own counter file."""
    out: dict[int, float] = {}
    for path in directory.glob("counter_*.db"):
        pid = int(path.stem.split("_")[1])
        for key, value, _ts, _pos in MmapedDict.read_all_values_from_file(str(path)):
            if '"/v1/models"' in key and '"200"' in key:
                out[pid] = value
    return out


@pytest.mark.timeout(240)
async def test_every_scrape_counts_every_workers_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    (metrics_dir / "counter_1.db").write_bytes(b"stale")  # a previous run's: wiped at start
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(metrics_dir))
    policy = tmp_path / "policy.yaml"
    policy.write_text("rate: {requests_per_minute: null, tokens_per_minute: null}\n")
    reads: list[tuple[int, float]] = []
    async with fake_upstream() as fake:
        guard = start(guard_spec("guard", fake.url, policy, workers=WORKERS))
        try:
            await asyncio.to_thread(guard.wait_ready, 120)
            assert not (metrics_dir / "counter_1.db").exists()
            workers = psutil.Process(guard.proc.pid).children(recursive=True)
            sent = 0
            for round_ in range(ROUNDS):
                for _ in range(PER_ROUND):
                    # A fresh connection each: any worker may accept it.
                    async with httpx.AsyncClient(timeout=10) as client:
                        assert (await client.get(guard.url + "/v1/models")).status_code == 200
                    sent += 1
                # The answering worker's numbers are current, the others' at most a second
                # old: read until the sum is reached (a generous bound, not a timing).
                async with asyncio.timeout(30):
                    while True:
                        value, text = await _read(guard.url)
                        reads.append((sent, value))
                        if value >= sent:
                            break
                        await asyncio.sleep(0.2)
                if round_ == ROUNDS // 2:
                    victim = max(_served_by(metrics_dir).items(), key=lambda kv: kv[1])[0]
                    assert victim in {w.pid for w in workers}
                    os.kill(victim, signal.SIGKILL)
            served = _served_by(metrics_dir)
            # The live gauges of the killed worker are gone; its counts stayed in the sum.
            assert victim in served and not list(metrics_dir.glob(f"gauge_live*_{victim}.db"))
        finally:
            await asyncio.to_thread(guard.stop)
    values = [v for _, v in reads]
    assert values == sorted(values), reads  # never goes back, whichever worker answers
    assert all(v <= s for s, v in reads), reads
    assert reads[-1] == (ROUNDS * PER_ROUND, ROUNDS * PER_ROUND)
    assert sum(served.values()) == ROUNDS * PER_ROUND
    assert len([n for n in served.values() if n]) >= 2, served  # several workers served
    assert "# TYPE schedguard_guard_request_duration_seconds histogram" in text
    assert "process_resident_memory_bytes" in text

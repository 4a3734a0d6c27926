"""One ``/metrics`` for several worker processes: prometheus_client's multiprocess mode.

With ``--workers N`` one port is served by N processes and each scrape is answered by whichever
takes the connection, so per-process series would read 2, 8, 2, 8 across scrapes (counter
resets to Prometheus). As vLLM does for its API servers, every worker writes its series into
files in a directory all share (``PROMETHEUS_MULTIPROC_DIR``, in prometheus_client's mmap
format: ``counter_<pid>.db``, ``histogram_<pid>.db``, ``gauge_<mode>_<pid>.db``) and the worker
answering a scrape merges them with prometheus_client's :class:`MultiProcessCollector`.

The request path is unchanged: the guard still adds to plain numbers (see
:mod:`guard.telemetry._metrics`); :class:`FileExport` copies this process's series into its
files, from the same collectors that render a single process's ``/metrics``, every
:data:`SYNC_INTERVAL_S`, before this process answers a scrape, and when it stops. So a scrape
shows the answering worker's numbers as they are and the others' as of at most a second ago.

How the workers' series combine: counters and histograms are summed, and a worker that has
exited keeps its last numbers in the sum (its files stay), so counters never go back. Gauges are
summed over the live workers (``livesum``: requests in flight, resident memory, open files), or
the least (``livemin``: the start time) or the most (``livemax``: the file limit); a worker's
gauge files are removed when it stops (``mark_process_dead``), or, if it died, at the next
scrape.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Iterator

from prometheus_client.core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import mark_process_dead
from prometheus_client.registry import Collector

__all__ = [
    "METRICS_DIR_ENV",
    "SYNC_INTERVAL_S",
    "FileExport",
    "forget_dead_workers",
    "wipe_metrics_dir",
]

# The directory the workers share, as prometheus_client names it.
METRICS_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
SYNC_INTERVAL_S = 1.0

# How each gauge combines across workers (prometheus_client's multiprocess modes); a gauge not
# named here is summed over the live workers.
_GAUGE_MODES = {
    "process_start_time_seconds": "livemin",
    "process_max_fds": "livemax",
}
_LIVE_FILE = re.compile(r"^gauge_live[a-z]+_(\d+)\.db$")


class FileExport:
    """This process's series, written into its files in ``directory`` by :meth:`sync`."""

    def __init__(self, collectors: Iterable[Collector], directory: str, pid: int | None = None):
        self._collectors = list(collectors)
        self._dir = directory
        self.pid = os.getpid() if pid is None else pid
        self._files: dict[str, MmapedDict] = {}
        self._keys: dict[tuple[str, str, tuple[tuple[str, str], ...]], str] = {}

    def sync(self) -> None:
        """Write every sample of this process's collectors into its files."""
        for collector in self._collectors:
            for family in collector.collect():
                self._write(family)

    def close(self) -> None:
        """A last sync, then this process's live gauges are taken out of the merge."""
        try:
            self.sync()
        finally:
            for file in self._files.values():
                file.close()  # type: ignore[no-untyped-call]
            self._files.clear()
            mark_process_dead(self.pid, self._dir)  # type: ignore[no-untyped-call]

    def _file(self, kind: str) -> MmapedDict:
        file = self._files.get(kind)
        if file is None:
            path = os.path.join(self._dir, f"{kind}_{self.pid}.db")
            file = self._files[kind] = MmapedDict(path)  # type: ignore[no-untyped-call]
        return file

    def _key(self, family: Metric, sample: str, labels: dict[str, str]) -> str:
        cache_key = (family.name, sample, tuple(sorted(labels.items())))
        key = self._keys.get(cache_key)
        if key is None:
            key = self._keys[cache_key] = mmap_key(
                family.name, sample, list(labels), list(labels.values()), family.documentation
            )
        return key

    def _write(self, family: Metric) -> None:
        if family.type == "gauge":
            kind = "gauge_" + _GAUGE_MODES.get(family.name, "livesum")
        elif family.type in ("counter", "histogram"):
            kind = family.type
        else:
            return  # the guard exports no other type
        file = self._file(kind)
        samples = _per_bucket(family) if family.type == "histogram" else _plain(family)
        for name, labels, value in samples:
            file.write_value(self._key(family, name, labels), value, 0.0)  # type: ignore[no-untyped-call]


def _plain(family: Metric) -> Iterator[tuple[str, dict[str, str], float]]:
    for s in family.samples:
        if not s.name.endswith("_created"):
            yield s.name, s.labels, s.value


def _per_bucket(family: Metric) -> Iterator[tuple[str, dict[str, str], float]]:
    """A histogram as the files hold it: each bucket's own count (the merge makes them
    cumulative again and derives ``_count``), and ``_sum``."""
    below: dict[tuple[tuple[str, str], ...], float] = {}
    for s in family.samples:
        if s.name.endswith("_bucket"):
            series = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            yield s.name, s.labels, s.value - below.get(series, 0.0)
            below[series] = s.value
        elif s.name.endswith("_sum"):
            yield s.name, s.labels, s.value


def forget_dead_workers(directory: str) -> None:
    """Take the live gauges of workers that died without stopping (killed, crashed) out of the
    merge; their counters and histograms stay in the sums."""
    for path in glob.glob(os.path.join(directory, "gauge_live*_*.db")):
        match = _LIVE_FILE.match(os.path.basename(path))
        if match is None:
            continue
        pid = int(match.group(1))
        if not _alive(pid):
            mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def wipe_metrics_dir(directory: str) -> int:
    """Remove the series files a previous run left in ``directory`` (prometheus_client's advice:
    wipe the directory before the workers start); returns how many."""
    removed = 0
    for path in glob.glob(os.path.join(directory, "*.db")):
        try:
            os.remove(path)
        except FileNotFoundError:
            continue
        removed += 1
    return removed

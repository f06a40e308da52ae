"""What an exporting process says of itself: ``process_*``, ``python_*`` and ``lnk_build_info``.

Prometheus users expect every exporter to show the process behind it
(``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
``process_open_fds``, ``process_max_fds``, ``process_start_time_seconds``,
...) and the release it runs.  This is where ``prometheus_client`` honestly
serves: its ``ProcessCollector`` reads them from ``/proc/self`` (Linux;
elsewhere it yields nothing), ``PlatformCollector`` gives ``python_info``
and ``GCCollector`` the garbage collector's ``python_gc_*`` counters,
exactly as any Python process exporting with it shows them.  They are
registered in a private ``CollectorRegistry``, never the library's global
one, and what they yield is turned into this package's families, so that
one ``render`` writes the whole text (``exposition`` says why not
``generate_latest``).

Imported by the exporters only (the bridge and the scheduler, through
``http.export``), never by a driver: a driver imports the registry and, when
an exporter asks, ``snapshots``, which need nothing but the standard
library.  So these metrics describe the exporting process alone; its
drivers come and go, and their counts reach it in snapshots.

``lnk_build_info{version, program, store_format, reads_from} 1`` names the
release and the program exporting: the package's version, the program's
name (``lnk-store-bridge``, ``lnk-cloud-scheduler``: a bridge and a
scheduler in one pod share their pod's labels, and a dashboard tells them
apart by it), the store format it writes and the least it reads.  The
formats are the gate's (``cloudstore.gate.store_format``), which sits above
this layer, so the program passes them in, with its name.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.metrics_core import Metric

from ..._version import __version__
from . import AnyFamily, Family

BUILD_INFO = "lnk_build_info"
BUILD_HELP = ("The release and program exporting: the package's version, the program's name, the store format "
              "it writes and the least it reads (always 1).")

#: How the kinds the collectors yield are written in the text format 0.0.4 (which has no info type).
_KINDS = {"counter": "counter", "gauge": "gauge", "info": "gauge"}


class ProcessMetrics:
    """The exporting process's own families, made again at each call (each scrape)."""

    def __init__(self, program: str, store_format: int, reads_from: int) -> None:
        self._registry = CollectorRegistry(auto_describe=False)
        for make in (ProcessCollector, PlatformCollector, GCCollector):
            make(registry=self._registry)
        labels = (("version", __version__), ("program", program), ("store_format", str(store_format)),
                  ("reads_from", str(reads_from)))
        self._build = Family(BUILD_INFO, BUILD_HELP, {labels: 1.0}, kind="gauge")

    def __call__(self) -> dict[str, AnyFamily]:
        out: dict[str, AnyFamily] = {BUILD_INFO: self._build}
        for metric in self._registry.collect():
            for family in _families(metric):
                out[family.name] = family
        return out


def _families(metric: Metric) -> Iterator[Family]:
    """One of ``prometheus_client``'s metrics as families, one per sample name (a counter's ``_total``)."""
    kind = _KINDS.get(metric.type)
    if kind is None:  # a histogram or a summary: none of the collectors above yields one
        return
    made: dict[str, Family] = {}
    for sample in metric.samples:
        if sample.name.endswith("_created"):  # a counter's creation time: not in the text format 0.0.4
            continue
        family = made.get(sample.name)
        if family is None:
            family = made[sample.name] = Family(sample.name, metric.documentation, kind=kind)
        family.add(tuple(sample.labels.items()), float(sample.value))
    yield from made.values()

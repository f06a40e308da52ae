"""The names of ``cloudstore.runtime.metrics`` and of its modules, in one namespace for the tests.

The metrics were one module until issue 42 split them by concern (the
registry, ``snapshots``, ``exposition``, ``http``); the tests written
against the one module import this instead (``import metrics_modules as
metrics``), so their bodies read as before.  The package's own code imports
each name from the module that holds it.
"""

from __future__ import annotations

from cloudstore.runtime.metrics import (
    CAS_LOST,
    OUTCOME_UNKNOWN,
    REGISTRY,
    REPLIES,
    REQUESTS,
    RETRIES,
    THROTTLED,
    Counter,
    Family,
    Labels,
    Registry,
    Samples,
    counter,
    current_op,
    op_scope,
)
from cloudstore.runtime.metrics.exposition import CONTENT_TYPE, parse, render, total
from cloudstore.runtime.metrics.http import MAX_CONNECTIONS, READ_TIMEOUT, Exporter, export, parse_listen
from cloudstore.runtime.metrics.snapshots import (
    ARCHIVE,
    METRICS_DIR,
    Collector,
    SnapshotWriter,
    merge,
    snapshot_json,
    snapshot_writer,
    write_atomically,
)

__all__ = [
    "ARCHIVE", "CAS_LOST", "CONTENT_TYPE", "Collector", "Counter", "Exporter", "Family", "Labels",
    "MAX_CONNECTIONS", "METRICS_DIR", "OUTCOME_UNKNOWN", "READ_TIMEOUT", "REGISTRY", "REPLIES", "REQUESTS",
    "RETRIES", "Registry", "Samples", "SnapshotWriter", "THROTTLED", "counter", "current_op", "export", "merge",
    "op_scope", "parse", "parse_listen", "render", "snapshot_json", "snapshot_writer", "total",
    "write_atomically",
]

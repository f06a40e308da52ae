"""The Prometheus text exposition format (version 0.0.4): families to text, and text back to samples.

``render`` writes what ``GET /metrics`` serves and ``--metrics-file``
holds; ``parse`` and ``total`` read it back, for the tests and for tools
reading a file.  The standard library only: a driver imports this module
with ``snapshots`` (``Collector.render``), and the format is a few lines
to write.

Why not ``prometheus_client``'s ``generate_latest``: it would take over
these 20 lines and change what every scraper and file reader sees today: a
counter's ``# TYPE`` line would name it without ``_total`` and every integer
count would be written as a float (``3.0``).  Both are valid Prometheus
text, but the change buys nothing, and the families merged from many
processes are this package's own (``Family``) either way.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from . import AnyFamily, HistogramFamily, Labels

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus's clients write ``le`` (Go's float format): ``0.005``, ``1.0``, ``+Inf``."""
    return "+Inf" if math.isinf(bound) else repr(float(bound))


def _sample(name: str, labels: Labels, value: float) -> str:
    shown = ",".join(f'{k}="{_escape_value(v)}"' for k, v in labels)
    return f"{name}{{{shown}}} {_number(value)}" if labels else f"{name} {_number(value)}"


def render(families: Mapping[str, AnyFamily]) -> str:
    """Every family as ``# HELP`` / ``# TYPE`` lines and one line a sample, sorted (stable for diffs and tests).

    A histogram's series are written as Prometheus writes them: one
    ``_bucket`` sample per bound, cumulative, ``le`` last and ``+Inf`` at
    the end, then ``_sum`` and ``_count``.
    """
    lines: list[str] = []
    for name in sorted(families):
        fam = families[name]
        lines.append(f"# HELP {name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {name} {fam.kind}")
        if isinstance(fam, HistogramFamily):
            for labels in sorted(fam.series):
                seen, below = fam.series[labels], 0
                for bound, n in zip((*fam.bounds, math.inf), seen.counts, strict=True):
                    below += n
                    lines.append(_sample(f"{name}_bucket", (*labels, ("le", _le(bound))), below))
                lines.append(_sample(f"{name}_sum", labels, seen.sum))
                lines.append(_sample(f"{name}_count", labels, below))
            continue
        for labels in sorted(fam.samples):
            lines.append(_sample(name, labels, fam.samples[labels]))
    return "\n".join(lines) + "\n" if lines else ""


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[tuple[str, Labels], float]:
    """Samples of an exposition text, keyed by (name, sorted labels): for tests and for tools reading a file."""
    out: dict[tuple[str, Labels], float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if match is None:
            raise ValueError(f"not a sample line: {line!r}")
        name, inner, value = match.groups()
        labels = tuple(sorted(
            (k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\"))
            for k, v in _LABEL.findall(inner or "")
        ))
        out[(name, labels)] = float(value)
    return out


def total(samples: Mapping[tuple[str, Labels], float], name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))

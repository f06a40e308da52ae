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

import re
from collections.abc import Mapping

from . import Family, Labels

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _escape_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def render(families: Mapping[str, Family]) -> str:
    """Every family as ``# HELP`` / ``# TYPE`` lines and one line a sample, sorted (stable for diffs and tests)."""
    lines: list[str] = []
    for name in sorted(families):
        fam = families[name]
        lines.append(f"# HELP {name} {_escape_help(fam.help)}")
        lines.append(f"# TYPE {name} {fam.kind}")
        for labels in sorted(fam.samples):
            shown = ",".join(f'{k}="{_escape_value(v)}"' for k, v in labels)
            lines.append(f"{name}{{{shown}}} {_number(fam.samples[labels])}" if labels
                         else f"{name} {_number(fam.samples[labels])}")
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

"""What a long-running program's probes ask: is it alive, and can it do its work now?

A bridge or a scheduler whose store cannot be reached used to answer
``GET /metrics`` 200 while every call failed, and that was all its probes
asked (issue 46, item 1).  ``Health`` keeps the two answers Kubernetes and
systemd want, as state the program itself updates, so that answering a
probe never waits on the store:

* **live** (``GET /healthz``, systemd's watchdog): the program's loop is
  turning: its heartbeat (``beat``) is younger than ``live_within``, or, for
  a program whose loop is a thread it cannot beat from, the ``alive_by``
  check says so.  A dead loop is worth a restart; a store outage is not.
* **ready** (``GET /readyz``): every source the program depends on
  (``expect``: its driver, each bridge) last answered it usably (``note``:
  a reply, the store's format record read and accepted, since a driver
  reads it before answering its first op), and did so within ``fresh_for``
  seconds; and the program is not stopping.  The program keeps it fresh
  with its own work and, where that may pause, a periodic check of its own.

Each answer is ``(ok, body)``: the body a short JSON object saying why, as
``exporter`` serves it with 200 or 503.  Standard library only.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: A reason is cut to this many characters in a probe's answer (the full one is in the program's log).
WHY_MOST = 200
#: The paths the exporter serves a ``Health`` on, and which answer each is.
LIVE_PATH, READY_PATH = "/healthz", "/readyz"

#: An error reply no retry changes starts so: the driver's own setting (``LNK_BUCKET_URL`` /
#: ``LNK_GCS_URL`` missing or malformed, a folder or bucket that does not exist, no credentials:
#: ``settings.SettingError``), or the store's refusal (``generations.StoreRefused``: credentials not
#: accepted, a bucket that does not exist, a format record this release may not use).
SETTING_PREFIX = "LNK_"
REFUSED_PREFIX = "the store refused the request"


def permanent_error(error: str) -> str | None:
    """What to fix for a driver's error reply no waiting changes (a setting, the store's refusal), else None.

    The scheduler and the bridge judge their start-up request by it: such a
    reply stops them (exit 2), anything else (a timeout, a store failing for
    now) is retried while they run, and only their readiness says it.
    """
    if error.startswith(SETTING_PREFIX):
        return "fix the setting"
    if error.startswith(REFUSED_PREFIX):
        return "check the credentials and the bucket"
    return None


def _cut(why: str) -> str:
    return why if len(why) <= WHY_MOST else why[:WHY_MOST - 3] + "..."


@dataclass
class _Source:
    ok: bool = False
    at: float | None = None  # clock() of the last note
    why: str = "not reached yet"


class Health:
    """A program's liveness and readiness, noted by its own threads, read by the probes' thread."""

    def __init__(self, program: str, fresh_for: float, live_within: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.program = program
        self.fresh_for = fresh_for
        self.live_within = live_within
        self._clock = clock
        self._lock = threading.Lock()
        self._beat: float | None = None
        self._alive_by: Callable[[], str | None] | None = None
        self._sources: dict[str, _Source] = {}
        self._stopping = False

    # -- what the program notes -------------------------------------------------

    def beat(self) -> None:
        """The program's loop turned (its liveness, when judged by heartbeat)."""
        now = self._clock()
        with self._lock:
            self._beat = now

    def alive_by(self, check: Callable[[], str | None]) -> None:
        """Judge liveness by ``check`` instead of a heartbeat: None when alive, else why not."""
        with self._lock:
            self._alive_by = check

    def expect(self, source: str) -> None:
        """``source`` must have answered usably for the program to be ready (not yet, until noted)."""
        with self._lock:
            self._sources.setdefault(source, _Source())

    def note(self, source: str, ok: bool, why: str = "") -> None:
        """``source`` answered usably (``ok``), or failed (``why``: what it said; it is cut to ``WHY_MOST``)."""
        now = self._clock()
        with self._lock:
            self._sources[source] = _Source(ok, now, "" if ok else _cut(why or "failed"))

    def last_ok(self, source: str) -> float | None:
        """When ``source`` last answered usably (the clock's time), if its last note was a success."""
        with self._lock:
            found = self._sources.get(source)
            return found.at if found is not None and found.ok else None

    def stopping(self) -> None:
        """The program is stopping: not ready any more (the probes take it out of service), still alive."""
        with self._lock:
            self._stopping = True

    # -- what the probes ask ----------------------------------------------------

    def live(self) -> tuple[bool, bytes]:
        """Whether the program's loop is turning, and a JSON body saying why."""
        with self._lock:
            check, beat = self._alive_by, self._beat
        now = self._clock()
        if check is not None:
            why = check()
        elif beat is None:
            why = "starting: the loop has not turned yet"
        elif self.live_within is not None and now - beat > self.live_within:
            why = f"the loop has not turned for {now - beat:.0f} s (more than {self.live_within:g} s)"
        else:
            why = None
        return why is None, self._body(why is None, "alive" if why is None else why)

    def ready(self) -> tuple[bool, bytes]:
        """Whether every source answered usably within ``fresh_for`` s (and not stopping); a JSON body."""
        now = self._clock()
        with self._lock:
            stopping = self._stopping
            sources = {name: _Source(s.ok, s.at, s.why) for name, s in self._sources.items()}
        checks: dict[str, dict[str, object]] = {}
        problems = []
        for name, source in sorted(sources.items()):
            age = None if source.at is None else round(now - source.at, 1)
            fresh = source.ok and age is not None and age <= self.fresh_for
            check: dict[str, object] = {"ok": fresh, "age_s": age}
            if not fresh:
                why = source.why if not source.ok else f"not reached for {age:g} s (more than {self.fresh_for:g} s)"
                check["why"] = why
                problems.append(f"{name}: {why}")
            checks[name] = check
        if stopping:
            problems.insert(0, "stopping")
        elif not sources:
            problems.append("starting: no store checked yet")
        ok = not problems
        return ok, self._body(ok, "ready" if ok else "; ".join(problems), checks)

    def answer(self, path: str) -> tuple[bool, bytes] | None:
        """The answer to a probe of ``path`` (``LIVE_PATH`` or ``READY_PATH``); None for any other path."""
        if path == LIVE_PATH:
            return self.live()
        if path == READY_PATH:
            return self.ready()
        return None

    def _body(self, ok: bool, why: str, checks: dict[str, dict[str, object]] | None = None) -> bytes:
        body: dict[str, object] = {"ok": ok, "program": self.program, "why": _cut(why)}
        if checks:
            body["checks"] = checks
        return (json.dumps(body, separators=(",", ":")) + "\n").encode("utf-8")

"""What a simulated machine is made of, and what the seed decides besides the scheduler.

A machine is ``Service(Space(RetryingStore(FaultyBackend(shared inner
backend, name, plan, limbo), POLICY), prefix, pool=SerialPool()))``, reached
through the driver's own ``Answerer`` so that a reply (error replies
included) is exactly what the wire would carry.

While a history runs, the seed also decides what the drivers would otherwise
take from the OS or the clock (``seeded``): ``generations.entropy`` (nonces;
job marks too, where ``jobs`` draws them from ``random``) is a seeded RNG, the
CAS loops' backoff sleeps are skipped (only the scheduler orders machines),
a pool a module makes of its own runs in the machine's thread,
and ``packing.PACK_MIN`` / ``PACK_MAX`` are made small so that blocks are packed
within a history; and every clock the drivers read is the history's
(``simtime``: the real one, moved on by long pauses and stalls).  Everything is
restored afterwards.
"""

from __future__ import annotations

import json
import random
import sys
import types
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from faults.backend import FaultyBackend

import cloudstore.generations as generations
import cloudstore.store.conversations as conversations
import cloudstore.store.jobs as jobs
import cloudstore.store.packing as packing
import cloudstore.store.space as space_module
from cloudstore.clock import StoreClock
from cloudstore.generations import Backend, Listed, RetryingStore, RetryPolicy
from cloudstore.protocol.answerer import BUCKET_SETTING as BUCKET
from cloudstore.protocol.answerer import Answerer, encode_reply
from cloudstore.protocol.service import Service
from cloudstore.store.space import Space

from .simtime import SimTime, patch_clocks

#: Retries that never sleep: the scheduler orders everything.
POLICY = RetryPolicy(attempts=6, first_delay=0.0, max_delay=0.0, deadline=60.0, throttle_delay=0.0)
#: packing.PACK_MIN, PACK_MAX, and both of conversations' hint intervals (HINT_EVERY, PREFETCH_HINT_EVERY)
PACKINGS = ((2, 2, 2), (2, 4, 4), (2, 8, 6), (4, 8, 8))


class SerialPool:
    """An executor for ``Space`` that runs everything in the calling thread: one thread per machine."""

    def map(self, fn: Callable[..., Any], *iterables: Any) -> Iterator[Any]:
        return iter([fn(*args) for args in zip(*iterables, strict=False)])

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        done: Future = Future()
        try:
            done.set_result(fn(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - handed to whoever waits on it, as an executor does
            done.set_exception(exc)
        return done

    def shutdown(self, wait: bool = True) -> None:
        pass


class OwnSerialPool(SerialPool):
    """A pool a module makes for itself (``files``' ledger maker: ``with ContextPool(...) as pool``), run in the
    calling thread too: every request of a machine must stop at its gate from the machine's one thread."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __enter__(self) -> OwnSerialPool:
        return self

    def __exit__(self, *exc: object) -> None:
        pass


class Deferred(Future):
    """A task run only when its result is asked for: ``Space.together``'s side request sent second."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        super().__init__()
        self._fn: Callable[[], Any] | None = fn

    def result(self, timeout: float | None = None) -> Any:
        if self._fn is not None:
            fn, self._fn = self._fn, None
            try:
                self.set_result(fn())
            except Exception as exc:  # noqa: BLE001 - raised below, as a future raises its task's error
                self.set_exception(exc)
        return super().result(timeout)


class SeededSidePool(SerialPool):
    """``Space.beside`` for one machine: the two requests of ``together`` go in the order a seeded RNG picks.

    A real process sends both at once and the store serves them in either
    order, with other machines' requests between them; in the simulation each
    is a gated request of this machine's thread, sent first or second as the
    seed says, so both orders (and others' writes between) occur and replay.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        if self.rng.random() < 0.5:
            return super().submit(fn, *args, **kwargs)
        return Deferred(lambda: fn(*args, **kwargs))


@contextmanager
def seeded(seed: int, sim: SimTime | None = None) -> Iterator[dict]:
    """The drivers' randomness, sleeps and packing sizes as the seed says, and their clocks ``sim``'s, for one
    history."""
    rng = random.Random(f"entropy:{seed}")
    knobs = {"packing": random.Random(f"knobs:{seed}").choice(PACKINGS)}
    saved: list[tuple[Any, str, Any]] = []

    def patch(module: Any, name: str, value: Any) -> None:
        saved.append((module, name, getattr(module, name)))
        setattr(module, name, value)

    def everywhere(name: str, value: Any) -> None:
        """Wherever a cloudstore module holds the seam's ``name`` (imported by name or not)."""
        original = getattr(generations, name, None)
        for module in [m for n, m in sorted(sys.modules.items()) if n.startswith("cloudstore")]:
            if original is not None and getattr(module, name, None) is original:
                patch(module, name, value)

    everywhere("entropy", rng.randbytes)
    everywhere("backoff_sleep", lambda *args, **kwargs: None)
    for module in [m for n, m in sorted(sys.modules.items()) if n.startswith("cloudstore")]:
        if getattr(module, "ContextPool", None) is space_module.ContextPool and module is not space_module:
            patch(module, "ContextPool", OwnSerialPool)  # a pool of a module's own, as files' ledger maker's
    if isinstance(getattr(jobs, "random", None), types.ModuleType):  # marks drawn from random.SystemRandom
        patch(jobs, "random", types.SimpleNamespace(SystemRandom=lambda: rng, Random=lambda *a: rng))
    pack_min, pack_max, hint_every = knobs["packing"]
    patch(packing, "PACK_MIN", pack_min)
    patch(packing, "PACK_MAX", pack_max)
    patch(conversations, "HINT_EVERY", hint_every)
    patch(conversations, "PREFETCH_HINT_EVERY", hint_every)
    if sim is not None:
        patch_clocks(sim, patch)
    try:
        yield knobs
    finally:
        for module, name, value in reversed(saved):
            setattr(module, name, value)


def answerer_on(store: RetryingStore, prefix: str, order: random.Random | None = None,
                scheduler_ops: bool = False) -> Callable[[dict], dict]:
    """The driver's request handler on ``store``: a request dict in, the reply as the wire carries it out.

    ``order`` picks which of two requests sent together goes first (SeededSidePool); without it, the side one.
    With ``scheduler_ops`` it also answers the runner's own ops (``job_due``, ``job_claims``, ``job_claim``).
    """
    answerer = Answerer(BUCKET)
    beside = SerialPool() if order is None else SeededSidePool(order)
    space = Space(store, prefix, pool=SerialPool(), beside=beside)  # type: ignore[arg-type]
    answerer.service = Service(space, scheduler_ops=scheduler_ops)
    answerer.service.space.deferred = []  # as the driver does: packing after the reply

    def answer(request: dict) -> dict:
        reply = json.loads(encode_reply(answerer.answer(json.dumps(request).encode("utf-8"))))
        answerer.after_reply()
        return reply

    return answer


class OwnClock(FaultyBackend):
    """A machine's faulty view with a store clock of its own, as every process has (``clock.py``).

    The machines of a history share one real backend, and so would share its
    clock; a clock fault is one machine's (its front-end, its proxy), so each
    machine's ``RetryingStore`` judges time by this one, which observes only
    the Dates the scheduler hands it (``Scheduler._date``).  Its first
    evidence is an honest reply, as a driver's first request is on a store
    whose clock agrees with the machine's (the store here runs on this machine).

    Times are the history's (``sim``): each write is stamped when it is
    applied (now, or when a held write lands), and listings give ``modified``
    in the history's time (``simtime``).
    """

    def __init__(self, *args: Any, sim: SimTime | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sim = sim or SimTime()
        self.own_clock = StoreClock()
        now = self.sim.time()
        self.own_clock.observe(now, now, float(int(now)), 1.0)

    @property
    def clock(self) -> StoreClock:
        return self.own_clock

    def _call(self, op: str, key: str, run: Callable[[], Any], stripped: Callable[[], Any] | None = None,
              **extra: Any) -> Any:
        if op in ("put", "delete"):
            run, stripped = self._stamped(key, run), None if stripped is None else self._stamped(key, stripped)
        return super()._call(op, key, run, stripped, **extra)

    def _stamped(self, key: str, write: Callable[[], Any]) -> Callable[[], Any]:
        def applied() -> Any:
            self.sim.stamp(key)
            return write()

        return applied

    def list(self, prefix: str, start_after: str | None, limit: int | None) -> Iterator[Listed]:
        return iter([replace(item, modified=self.sim.modified(item.key, item.modified))
                     for item in super().list(prefix, start_after, limit)])


class ConditionalDeletes:
    """fake-gcs-server ignores ``ifGenerationMatch`` on delete (docs/design.md, known limits); real GCS honours it.

    This wrapper does what GCS does: a delete at a version first checks the
    version.  The check and the delete are one step of the scheduler (no other
    request runs between them), so it is as atomic as the real thing.
    """

    def __init__(self, inner: Backend) -> None:
        self.inner = inner

    def delete(self, key: str, version: str | None) -> None:
        if version is not None:
            current = self.inner.get(key)
            if current is None:
                raise generations.NotFound(key)
            if current[1] != version:
                raise generations.PreconditionFailed(key)
        self.inner.delete(key, version)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

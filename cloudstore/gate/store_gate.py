"""What a process checks before it uses a store: the format record, and that the server honours preconditions.

Every way into a store passes here: the drivers (and so the scheduler, the
bridge and the conformance suite, which run them), the Python API and the
admin tool (``settings.open_store`` and ``api`` attach a gate to the store).
The seam asks ``require_write`` before every write (``RetryingStore``), the
service asks ``begin`` as an op starts and ``require_read`` before it answers.

Cost, once per process (``serve`` and the API pay it once for their life):
the record's read and the server probe's two writes go out together, in ONE
round trip, begun as the first op begins, so that the op's own first requests
travel beside it; the op's first write waits for it.  A store without a record
gets one before that first write (one request more, once per store), as does a
store whose record asks less than this release writes (``store_format.needed``).
The record is read again, beside an op, once ``RECORD_TTL`` has passed: a
release that raises it must wait that long before writing its new layout
(docs/admin.md), so every process that could misread it has stopped writing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from ..generations import AlreadyExists, Backend, Create, PreconditionFailed, RetryingStore, StoreRefused, Update
from ..runtime.pools import ContextPool  # the probe's requests counted under the op being answered
from . import store_format
from .server_check import Probe, ServerIgnoresPreconditions
from .store_format import MalformedRecord, Record

#: Seconds a record read stays trusted in a long-lived process.
RECORD_TTL = 300.0


class FormatRefused(StoreRefused):
    """The store's format record refuses this release (or cannot be read as one): nothing was changed."""


class StoreGate:
    """One store's checks for one process: the record read and judged, the server probed, once."""

    def __init__(self, backend: Backend, root: str, check_server: bool, eager_probe: bool = True) -> None:
        # Requests of its own, on a store of its own: they are no op's writes (an op that fails after
        # them changed nothing of any agent), and a crash test's request numbering stays the ops'.
        self.store = RetryingStore(backend)
        self.root = root
        self.key = root + store_format.KEY
        self._lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._round: Future[None] | None = None
        self._read_at: float | None = None  # time.monotonic() of the last record read that answered
        self._record: tuple[Record | None, str | None] | None = None  # (record, version), once read
        self._malformed: str | None = None
        self._probe: Probe | None = Probe(self.store, root, self.store.label) if check_server else None
        self._probe_pending = False  # the first round's create was accepted: the second round is owed
        #: Probe in the first round, beside the record's read (a driver: its first op is soon a write), or
        #: only before the first write (the admin tool: ``inspect`` or a ``gc`` dry run writes nothing).
        self._eager_probe = eager_probe
        self._written = False  # this process wrote, or found, the record its writes need
        #: A server seen ignoring a precondition stays refused for the process's life: what it did once
        #: it may do to any write, and probing it again would only write the probe again.
        self._ignores: ServerIgnoresPreconditions | None = None

    # -- what the service and the seam ask

    def begin(self) -> None:
        """Start the round (record read, and the probe if owed) unless one is done and fresh or under way."""
        with self._lock:
            if self._ignores is not None or (self._round is not None and not self._round.done()):
                return
            fresh = self._read_at is not None and time.monotonic() - self._read_at < RECORD_TTL
            if self._round is not None and self._round.exception() is None and fresh:
                return
            if self._pool is None:
                self._pool = ContextPool(max_workers=4, thread_name_prefix="cloudstore-gate")
            self._round = self._pool.submit(self._one_round)

    def require_read(self) -> None:
        """Wait for the round; raise when this release must not read the store."""
        self.begin()
        with self._lock:
            pending = self._round
        assert pending is not None
        try:
            pending.result()  # the store's failure to answer, as the op's
        except ServerIgnoresPreconditions as exc:
            self._ignores = exc
        if self._ignores is not None:
            raise self._ignores
        self._judge(write=False)

    def _judge(self, write: bool) -> None:
        """Raise ``FormatRefused`` when the record as read refuses this release reading (or ``write``-ing)."""
        if self._malformed is not None:
            raise FormatRefused(f"the store's format record ({store_format.KEY}) is malformed: {self._malformed}; "
                                "nothing is read or written until an operator fixes it (lnk-store-admin format)")
        record = self.record
        if record is None:
            return
        why = store_format.read_refusal(record) or (store_format.write_refusal(record) if write else None)
        if why is not None:
            raise FormatRefused(why)

    def require_write(self) -> None:
        """Before a write: readable, writable, the server checked, the record saying what our writes need."""
        if self._written and not self._stale():
            return
        self.require_read()
        self._judge(write=True)
        with self._lock:
            if self._probe is not None:
                try:
                    self._probe_now()
                except ServerIgnoresPreconditions as exc:
                    self._ignores = exc
                    raise
            if not self._written:
                self._ensure_record()
                self._written = True

    def _probe_now(self) -> None:
        """What the probe still owes before a write: its first round (when the record's round had none),
        then the second where the first's create was accepted."""
        assert self._probe is not None
        if not self._probe_pending:
            self._probe_first()()
        if self._probe is not None and self._probe_pending:
            self._probe.second()
            self._probe, self._probe_pending = None, False  # checked: the create again was refused

    def _probe_first(self) -> Callable[[], None]:
        """The probe's first round sent (its create and its stale update, together); what waits for it.

        Waiting raises ``ServerIgnoresPreconditions`` where the update was
        accepted, and leaves the second round owed where the create was
        (``_probe_pending``), or the probe done where both were refused.
        """
        assert self._probe is not None and self._pool is not None
        created = self._pool.submit(self._probe.create)
        stale = self._pool.submit(self._probe.stale_update)

        def finish() -> None:
            stale.result()
            self._probe_pending = created.result()
            if not self._probe_pending:
                self._probe = None  # checked: both writes refused as they must be

        return finish

    @property
    def record(self) -> Record | None:
        """The record as last read (None: the store has none, or it was not read yet)."""
        return None if self._record is None else self._record[0]

    # -- the round

    def _stale(self) -> bool:
        return self._read_at is None or time.monotonic() - self._read_at >= RECORD_TTL

    def _one_round(self) -> None:
        """The record's read and, where owed, the probe's first two writes, together."""
        eager = self._probe is not None and self._eager_probe and not self._probe_pending
        finish = self._probe_first() if eager else None
        try:
            self._read_record()
        finally:
            if finish is not None:
                finish()

    def _read_record(self) -> None:
        obj = self.store.get(self.key)
        self._read_at = time.monotonic()
        if obj is None:
            self._record, self._malformed = (None, None), None
            return
        try:
            self._record, self._malformed = (store_format.parse(obj.data), obj.version), None
        except MalformedRecord as exc:
            self._record, self._malformed = None, str(exc)

    def raise_to(self, floor: Record) -> None:
        """Make the store's record ask at least what ``floor`` asks (a migration's source's record)."""
        self.require_write()
        with self._lock:
            self._ensure_record(floor)

    def _ensure_record(self, floor: Record | None = None) -> None:
        """Write the record this release's writes need (and ``floor``), where the store's says less or has none.

        Create if absent; a raised record is an update at the version read.  Losing either race means
        another process wrote a record meanwhile: read it again and judge that one.
        """
        for _ in range(8):
            assert self._record is not None
            record, version = self._record
            wanted = store_format.needed(record, floor)
            if wanted is None:
                return
            try:
                mode = Create() if record is None or version is None else Update(version)
                written = self.store.put(self.key, wanted.body(), mode)
            except (AlreadyExists, PreconditionFailed):
                self._read_record()
                self._judge(write=True)
                continue
            self._record = (wanted, written.version)
            return
        raise FormatRefused("the store's format record kept changing while this driver wrote its own")


def guard(store: RetryingStore, root: str, eager_probe: bool = True) -> RetryingStore:
    """``store`` with a gate for ``root`` (the server probed unless it is a folder); returns it."""
    store.gate = StoreGate(store.backend, root, check_server=store.label != "file", eager_probe=eager_probe)
    return store

"""One request in, one reply out: the table of ops (``OPS``), each validated before it acts.

Every op is declared once, in ``OPS`` at the foot of this module: its name,
its family (conversations, leases, jobs, files, tools), whether only the
scheduler's own driver answers it, and its handler, a ``Service`` method.
``Service.ops`` (the dispatch), the bridge's metric labels and
tests/test_op_table.py (the API's methods, the conformance families,
docs/protocol.md) all read that one table, so a grep for an op's quoted name
lands on its declaration.

Every handler first reads all of its arguments through ``validate`` (which
raises ``RequestError`` on any broken rule) and only then touches the store,
so a refused request changes nothing.

``answer`` turns every failure into an error reply that says whether the
operation may have changed anything.  That is a property of the whole
operation, not of the request that failed last: an op whose first write
landed and whose second request then failed says ``outcome unknown``, even
if the failing request was a read.  ``answered`` gives the same reply with
its kind (``Answered``: refused, failed or unknown), known here by the
exception's type, so the Python API raises its error class without reading
the reply's words.
"""

from __future__ import annotations

import logging
import re
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

from ..errors import ErrorKind
from ..gate.store_gate import StoreGate
from ..generations import StoreUnavailable
from ..runtime import metrics
from ..store.conversations import Conversations
from ..store.files import Files
from ..store.jobs import Jobs
from ..store.leases import Leases
from ..store.space import Contention, Space
from ..store.tools import Tools
from . import validate as v

Reply = dict[str, Any]

RENEW_MAX = 256  # leases one lease_renew renews at most
DUE_LIMIT, DUE_LIMIT_MAX = 100, 1000  # job_due entries per reply: default, and one listing page at most
UNKNOWN_WORDS = "outcome unknown: the change may or may not have been made"
UNCHANGED_WORDS = "nothing was changed"

log = logging.getLogger("cloudstore")


def _held_ms(at: list[float]) -> int:
    """Milliseconds since the lease write that won was decided (its ``renewed`` taken), by this process's
    clock: the scheduler dates its claim's confirmation from its reply, not from its request, so a claim of
    several round trips does not start old.  0 when no write was decided."""
    return max(0, int((time.monotonic() - at[-1]) * 1000)) if at else 0


def error(why: str) -> Reply:
    return {"reply": "error", "error": why}


@dataclass(frozen=True)
class Answered:
    """A reply, and for an error reply its kind: what the service knew of the failure when it answered.

    ``kind`` is None for every reply but an error; for an error ``refused``
    (the request broke a rule: nothing ran), ``failed`` (the store failed or
    refused, and certainly nothing was changed) or ``unknown`` (a write of the
    op may have landed: the reply says ``outcome unknown``).  The driver writes
    the reply alone, so the wire carries the words only; the Python API maps
    the kind to its exception class (``errors.error_of``).
    """

    reply: Reply
    kind: ErrorKind | None = None

    def but(self, reply: Reply) -> Answered:
        """The same answer with its reply reworded (the kind stays)."""
        return Answered(reply, self.kind)


def _outcome(unknown: bool) -> str:
    """What an error says of the op's effect: whether any write of it landed or may have."""
    return UNKNOWN_WORDS if unknown else UNCHANGED_WORDS


def _kind(unknown: bool) -> ErrorKind:
    """A store failure's kind: ``unknown`` when a write of the op landed or may have, else ``failed``."""
    return "unknown" if unknown else "failed"


_HOST_PATH = re.compile(r"""(['"])/[^'"]*\1""")


def _described(exc: BaseException, backend: str) -> str:
    """An unexpected failure as an agent may read it: its kind and cause, never a host path.

    An ``OSError`` of the folder store names the file it failed on, the
    store's folder on the host; an agent reading the reply (through a bridge,
    another tenant's machine) learns the kind of failure and the setting, and
    the full message goes to the log (stderr) only."""
    if isinstance(exc, OSError):
        where = "in the store's folder (LNK_BUCKET_URL)" if backend == "file" else f"on the {backend} store"
        return f"{type(exc).__name__}: {exc.strerror or 'failed'} {where}"
    return f"{type(exc).__name__}: {_HOST_PATH.sub('<a host path>', str(exc))}"


def _after(req: dict) -> str | None:
    """The ``after`` of a paged index listing (``job_due``, ``job_claims``): null or a key."""
    after = req.get("after")
    if after is not None and not (isinstance(after, str) and len(after) <= 1024
                                  and after.isascii() and after.isprintable()):
        raise v.RequestError("'after' must be null or a key (printable ASCII, at most 1,024 characters)")
    return after


class Service:
    """Answers the requests of every agent in one store (bucket and prefix)."""

    def __init__(self, space: Space, scheduler_ops: bool = False) -> None:
        self.space = space
        self.conversations = Conversations(space)
        self.leases_ = Leases(space)
        self.jobs = Jobs(space)
        self.files = Files(space)
        self.tools = Tools(space)
        # The scheduler's ops name other agents' jobs and lease holders: only its own driver answers them.
        self.ops: dict[str, Callable[[dict, v.Agent], Reply]] = {
            name: partial(op.handler, self) for name, op in OPS.items() if scheduler_ops or not op.scheduler_only
        }

    def answer(self, request: dict) -> Reply:
        """The reply to ``request`` (``answered``'s, without its kind)."""
        return self.answered(request).reply

    def answered(self, request: dict) -> Answered:
        """The reply to ``request`` and its kind; every failure becomes an error reply, never an exception.

        An error names what went wrong and, unless the request was refused
        before it acted, whether anything may have changed: any write that
        landed or may have landed since the op began makes it ``outcome unknown``.

        Counted in ``metrics``: the reply by kind, and an error saying
        ``outcome unknown``, both under the op's name when it is one of the
        table's (else ""), as is every store request made while answering.
        """
        op = request.get("op")
        name = op if isinstance(op, str) and op in self.ops else ""
        backend = self.space.store.label
        with metrics.op_scope(name, backend):  # timed under the backend its reply is counted under
            answered = self._answer(request)
        metrics.REPLIES.inc(backend, name, str(answered.reply.get("reply")))
        if answered.kind == "unknown":
            metrics.OUTCOME_UNKNOWN.inc(backend, name)
        return answered

    def _answer(self, request: dict) -> Answered:
        """``answered``'s reply and kind, by the type of what failed: a ``RequestError`` is a refusal;
        any other failure says ``outcome unknown`` when a write of the op may have landed, else that
        nothing was changed."""
        store = self.space.store
        before = store.writes
        gate = store.gate if isinstance(store.gate, StoreGate) else None
        try:
            with store.op_window():  # the op's requests share one retry deadline, inside the bridge's call limit
                if gate is not None:
                    gate.begin()  # the format record's read (and the server probe) travel beside the op's requests
                try:
                    reply = self.handle(request)
                except Exception:
                    if gate is not None:  # a store of a newer format may fail a read in any way: say why
                        gate.require_read()
                    raise
                if gate is not None:
                    gate.require_read()  # a store this release must not read answers no read
                return Answered(reply)
        except v.RequestError as exc:
            return Answered(error(str(exc)), "refused")
        except (StoreUnavailable, Contention) as exc:
            if getattr(exc, "outcome_unknown", False):
                return Answered(error(str(exc)), "unknown")  # a write's fate unknown: its message already says so
            unknown = store.writes > before
            return Answered(error(f"{exc}; {_outcome(unknown)}"), _kind(unknown))
        except Exception as exc:  # noqa: BLE001 - any failure is this request's error reply
            log.error("request failed:\n%s", traceback.format_exc())
            unknown = store.writes > before
            return Answered(error(f"internal error ({_described(exc, store.label)}); {_outcome(unknown)}"),
                            _kind(unknown))

    def handle(self, request: dict) -> Reply:
        op = request.get("op")
        if not isinstance(op, str):
            raise v.RequestError("'op' must be a string naming the operation")
        handler = self.ops.get(op)
        if handler is None:
            raise v.RequestError(f"unknown op {v.shown(op)}")
        return handler(request, v.agent(request))

    # -- conversations

    def op_append(self, req: dict, agent: v.Agent) -> Reply:
        thread = v.string(req, "thread")
        event, seq = v.event(req)
        return self.conversations.append(agent, thread, event, seq)

    def op_read(self, req: dict, agent: v.Agent) -> Reply:
        thread = v.string(req, "thread")
        first = v.integer(req, "first", minimum=1, default=1)
        events = self.conversations.read(agent, thread, first)
        return {"reply": "events", "events": events}

    def op_last(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "last", "last": self.conversations.last(agent, v.string(req, "thread"))}

    def op_threads(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "threads", "threads": self.conversations.threads(agent)}

    def op_remove(self, req: dict, agent: v.Agent) -> Reply:
        thread = v.string(req, "thread")
        self.conversations.remove(agent, thread)
        return {"reply": "done"}

    # -- leases

    def op_take(self, req: dict, agent: v.Agent) -> Reply:
        thread, holder = v.string(req, "thread"), v.string(req, "holder")
        lapse_ms = v.integer(req, "lapse_ms", minimum=0)
        return {"reply": "took", "took": self.leases_.take(agent, thread, holder, lapse_ms)}

    def op_lease_take(self, req: dict, agent: v.Agent) -> Reply:
        """Not in the wire protocol: ``take``, naming the holder when ``held`` (null otherwise) and the
        lease's fence when it is ``holder``'s (null otherwise; leases.py)."""
        thread, holder = v.string(req, "thread"), v.string(req, "holder")
        lapse_ms = v.integer(req, "lapse_ms", minimum=0)
        at: list[float] = []
        took, held_by, fence = self.leases_.take_fenced(agent, thread, holder, lapse_ms, at=at)
        return {"reply": "took", "took": took, "holder": held_by, "fence": fence, "held_ms": _held_ms(at)}

    def op_lease_renew(self, req: dict, agent: v.Agent) -> Reply:
        """Not in the wire protocol: ``renew`` for ``holder`` of each of ``leases`` (1 to 256 objects
        ``{"agent", "thread"}``, any agents'), all at once: ``{"reply": "renewed", "renewed": [bool, ...]}``
        in their order (false: ``lost``)."""
        holder = v.string(req, "holder")
        leases = v.field(req, "leases")
        if not isinstance(leases, list) or not 1 <= len(leases) <= RENEW_MAX:
            raise v.RequestError(f"'leases' must be a list of 1 to {RENEW_MAX} leases")
        named = []
        for lease in leases:
            if not isinstance(lease, dict) or set(lease) != {"agent", "thread"}:
                raise v.RequestError("each of 'leases' must be {\"agent\", \"thread\"}")
            named.append((v.agent(lease), v.string(lease, "thread")))
        renewed, earliest = self.leases_.renew_all(named, holder)
        return {"reply": "renewed", "renewed": renewed, "held_ms": _held_ms([earliest])}

    def op_renew(self, req: dict, agent: v.Agent) -> Reply:
        thread, holder = v.string(req, "thread"), v.string(req, "holder")
        return {"reply": "done"} if self.leases_.renew(agent, thread, holder) else {"reply": "lost"}

    def op_end(self, req: dict, agent: v.Agent) -> Reply:
        thread, holder = v.string(req, "thread"), v.string(req, "holder")
        self.leases_.end(agent, thread, holder)
        return {"reply": "done"}

    def op_leases(self, req: dict, agent: v.Agent) -> Reply:
        lapse_ms = v.integer(req, "lapse_ms", minimum=0)
        return {"reply": "leases", "leases": self.leases_.leases(agent, lapse_ms)}

    # -- jobs

    def op_job_put(self, req: dict, agent: v.Agent) -> Reply:
        place, job = v.place(req), v.job(req)
        if place == "waiting":
            v.waiting_due(job)
        self.jobs.put(agent, place, job)
        return {"reply": "done"}

    def op_job_get(self, req: dict, agent: v.Agent) -> Reply:
        place, job_id = v.place(req), v.job_id(v.field(req, "id"))
        return {"reply": "job", "job": self.jobs.get(agent, place, job_id)}

    def op_job_remove(self, req: dict, agent: v.Agent) -> Reply:
        place, job_id = v.place(req), v.job_id(v.field(req, "id"))
        return {"reply": "found", "found": self.jobs.remove(agent, place, job_id)}

    def op_job_list(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "jobs", "jobs": self.jobs.listing(agent, v.place(req))}

    def op_job_count(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "count", "count": self.jobs.count(agent, v.place(req))}

    def op_job_shift(self, req: dict, agent: v.Agent) -> Reply:
        job_id = v.job_id(v.field(req, "id"))
        source, target = v.place(req, "from"), v.place(req, "to")
        return {"reply": "found", "found": self.jobs.shift(agent, job_id, source, target)}

    def op_job_next(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "next", "next": self.jobs.next()}

    def op_job_due(self, req: dict, agent: v.Agent) -> Reply:
        """Not in the wire protocol: the scheduler's view of the due index (every agent's due jobs by name).

        ``limit`` (1-1000, default 100) entries after the key ``after``; ``more``
        says the listing was full.  Answered only by a driver started with
        ``LNK_SCHEDULER_OPS=1``, the runner's own: an agent must never learn
        another agent's job ids.
        """
        limit = v.integer(req, "limit", minimum=1, maximum=DUE_LIMIT_MAX, default=DUE_LIMIT)
        after = _after(req)
        entries, more = self.jobs.due(limit, after)
        return {"reply": "due", "due": [entry.wire() for entry in entries], "more": more}

    def op_job_claims(self, req: dict, agent: v.Agent) -> Reply:
        """Not in the wire protocol: the scheduler's view of the claim index (every agent's jobs in
        firing by name, with how long ago each entered firing: ``age_ms``), paged as ``job_due``.
        Answered only by the runner's own driver, for the same reason (claim_index.py)."""
        limit = v.integer(req, "limit", minimum=1, maximum=DUE_LIMIT_MAX, default=DUE_LIMIT)
        after = _after(req)
        entries, more = self.jobs.claims(limit, after)
        return {"reply": "claims", "claims": [entry.wire() for entry in entries], "more": more}

    def op_job_claim(self, req: dict, agent: v.Agent) -> Reply:
        """Not in the wire protocol: ``job_shift`` waiting -> firing answering the job it moved
        (null when none was waiting), so the runner fires what it shifted without reading it back.

        With ``thread``, ``holder`` and ``lapse_ms`` (the claim lease) and
        ``not_after`` (a due this late is not claimed), the lease is taken in
        the same op and the reply also says ``took``, ``holder`` (when
        ``held``), ``recovered`` and ``fence`` (the lease's, with a job to
        fire) (``Jobs.claim``): three round trips in all.  With ``recover``
        true, only a job left in firing is claimed (its record written anew
        under the new lease first), never one from waiting.
        """
        job_id = v.job_id(v.field(req, "id"))
        if "holder" not in req:
            return {"reply": "claimed", "job": self.jobs.move(agent, job_id, "waiting", "firing")}
        thread, holder = v.string(req, "thread"), v.string(req, "holder")
        lapse_ms = v.integer(req, "lapse_ms", minimum=0)
        not_after = v.number(req, "not_after")
        recover = v.boolean(req, "recover", default=False)
        at: list[float] = []
        claimed = self.jobs.claim(
            agent, job_id,
            take=lambda wanted: self.leases_.take_fenced(agent, thread, holder, lapse_ms, guess=not recover,
                                                         wanted=wanted, refence=recover, at=at),
            release=lambda: self.leases_.end(agent, thread, holder),
            not_after=not_after, recover=recover)
        return {**claimed.wire(), "held_ms": _held_ms(at)}

    def op_job_finish(self, req: dict, agent: v.Agent) -> Reply:
        """Not in the wire protocol: the finish of a fire that ended, only under its claim.

        (``id``, ``thread``, ``holder``, ``fence``, ``keep_ending``): the job
        leaves firing (into ending when ``keep_ending``, else removed) only while
        the lease on ``thread`` is ``holder``'s with that ``fence`` (lapsed but
        not taken over counts), and then the lease is ended: ``finished``
        (whether the job left firing now), ``ours`` true.  Otherwise nothing
        changes: ``ours`` false and ``holder``, who holds it (null: nobody)
        (``Jobs.finish``).
        """
        job_id = v.job_id(v.field(req, "id"))
        thread, holder = v.string(req, "thread"), v.string(req, "holder")
        fence = v.integer(req, "fence", minimum=0)
        keep_ending = v.boolean(req, "keep_ending", default=False)

        def ours() -> str | None:
            held_by, held_fence = self.leases_.holder_of(agent, thread)
            return None if held_by == holder and held_fence == fence else held_by or ""

        return self.jobs.finish(agent, job_id, ours, lambda: self.leases_.end(agent, thread, holder, fence),
                                keep_ending).wire()

    def op_job_day(self, req: dict, agent: v.Agent) -> Reply:
        day, sent = self.jobs.day(agent)
        return {"reply": "day", "day": day, "sent": sent}

    def op_job_set_day(self, req: dict, agent: v.Agent) -> Reply:
        day, sent = v.integer(req, "day"), v.integer(req, "sent")
        self.jobs.set_day(agent, day, sent)
        return {"reply": "done"}

    def op_job_mark(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "mark", "mark": self.jobs.mark(agent)}

    # -- files

    def op_file_read(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "file", "file": self.files.read(agent, v.file_path(v.field(req, "path")))}

    def op_file_list(self, req: dict, agent: v.Agent) -> Reply:
        folder = v.file_path(v.field(req, "folder"), "folder", folder=True)
        return {"reply": "files", "files": self.files.listing(agent, folder)}

    def op_file_write(self, req: dict, agent: v.Agent) -> Reply:
        path, data = v.file_path(v.field(req, "path")), v.data(req)
        version = v.integer(req, "version", maximum=v.VERSION_MAX)
        return self.files.write(agent, path, data, version)

    def op_file_remove(self, req: dict, agent: v.Agent) -> Reply:
        path = v.file_path(v.field(req, "path"))
        version = v.integer(req, "version", maximum=v.VERSION_MAX)
        return {"reply": "found", "found": self.files.remove(agent, path, version)}

    def op_file_append(self, req: dict, agent: v.Agent) -> Reply:
        path, data = v.file_path(v.field(req, "path")), v.data(req)
        return {"reply": "wrote", "version": self.files.append(agent, path, data)}

    # -- tools

    def op_tools_read(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "tools", "tools": self.tools.read(agent, v.string(req, "thread"))}

    def op_tools_list(self, req: dict, agent: v.Agent) -> Reply:
        return {"reply": "narrowed", "narrowed": self.tools.listing(agent)}

    def op_tools_narrow(self, req: dict, agent: v.Agent) -> Reply:
        thread, tools = v.string(req, "thread"), v.tools(req)
        return {"reply": "tools", "tools": self.tools.narrow(agent, thread, tools)}


# -- the table: every op, declared once

#: What an op is about; each family has its conformance family (tests/test_op_table.py) and its part
#: of docs/protocol.md.
Family = Literal["conversations", "leases", "jobs", "files", "tools"]
Handler = Callable[[Service, dict, v.Agent], Reply]


@dataclass(frozen=True)
class Op:
    """One op: its handler (a ``Service`` method), its family, and who may call it.

    ``scheduler_only``: not in the wire protocol; answered only by a driver
    started with ``LNK_SCHEDULER_OPS=1`` (the scheduler's runner's own), any
    other answering it as an unknown op (docs/protocol.md, "Extensions").
    ``read_only``: run to its end, the op leaves the store as its readers see
    it, so a reply of it the bridge did not pass on may say "nothing was
    changed" (a call stopped midway still says outcome unknown: a read's
    first op may probe the server or pack).  Declared here, beside the op,
    so a new op is a write until someone says otherwise.
    """

    handler: Handler
    family: Family
    scheduler_only: bool = False
    read_only: bool = False


#: Every op a driver of this project answers, by its name on the wire.
OPS: dict[str, Op] = {
    "append": Op(Service.op_append, "conversations"),
    "read": Op(Service.op_read, "conversations", read_only=True),
    "last": Op(Service.op_last, "conversations", read_only=True),
    "threads": Op(Service.op_threads, "conversations", read_only=True),
    "remove": Op(Service.op_remove, "conversations"),

    "take": Op(Service.op_take, "leases"),
    "renew": Op(Service.op_renew, "leases"),
    "end": Op(Service.op_end, "leases"),
    "leases": Op(Service.op_leases, "leases", read_only=True),
    "lease_take": Op(Service.op_lease_take, "leases", scheduler_only=True),
    "lease_renew": Op(Service.op_lease_renew, "leases", scheduler_only=True),

    "job_put": Op(Service.op_job_put, "jobs"),
    "job_get": Op(Service.op_job_get, "jobs", read_only=True),
    "job_remove": Op(Service.op_job_remove, "jobs"),
    "job_list": Op(Service.op_job_list, "jobs", read_only=True),
    "job_count": Op(Service.op_job_count, "jobs", read_only=True),
    "job_shift": Op(Service.op_job_shift, "jobs"),
    "job_next": Op(Service.op_job_next, "jobs"),
    "job_day": Op(Service.op_job_day, "jobs"),
    "job_set_day": Op(Service.op_job_set_day, "jobs"),
    "job_mark": Op(Service.op_job_mark, "jobs"),
    "job_due": Op(Service.op_job_due, "jobs", scheduler_only=True),
    "job_claims": Op(Service.op_job_claims, "jobs", scheduler_only=True),
    "job_claim": Op(Service.op_job_claim, "jobs", scheduler_only=True),
    "job_finish": Op(Service.op_job_finish, "jobs", scheduler_only=True),

    "file_read": Op(Service.op_file_read, "files", read_only=True),
    "file_list": Op(Service.op_file_list, "files", read_only=True),
    "file_write": Op(Service.op_file_write, "files"),
    "file_remove": Op(Service.op_file_remove, "files"),
    "file_append": Op(Service.op_file_append, "files"),

    "tools_read": Op(Service.op_tools_read, "tools", read_only=True),
    "tools_list": Op(Service.op_tools_list, "tools", read_only=True),
    "tools_narrow": Op(Service.op_tools_narrow, "tools"),
}

"""Where everything lives: the one place names become object keys.

The mapping is injective and never escapes an agent's key space:

* A name (owner, agent id, thread, holder-free things, job id) becomes one
  key part ``_`` + percent-encoding of its UTF-8 (only ``A-Za-z0-9_.-~``
  left as they are), so ``/``, ``..``, ``%``, NUL or unicode can never form a
  separator, a ``..`` part or another name's encoding.  A part that would be
  longer than ``INLINE_MAX`` becomes ``~`` + SHA-256 of the name: ``~`` never
  starts an inline part, so the two forms cannot meet, and keys stay far
  inside the 1,024-byte limit of S3 and GCS whatever the names.
* The agent's owner is ``-`` when null and a name part otherwise, so owner
  null, owner ``""`` (``_``) and owner ``"x"`` (``_x``) are three agents.
* File paths keep their folders (for listing a folder by prefix); each part
  is percent-encoded as above without the ``_``, and the last one ends with
  ``%``, which percent-encoding never leaves last (it leaves ``%`` only as
  ``%XX``; the folder store keeps ``%``, not ``=``).  So a file's key is never a
  folder of another file's key: ``skills/a`` is ``f/skills/a%`` and
  ``skills/a/inner.md`` is ``f/skills/a/inner.md%``.  Path-based servers
  (MinIO, SeaweedFS: keys are filer paths) refuse an object ``K`` beside
  objects ``K/...``; this layout never asks for one.  A path whose encoding is
  longer than ``PATH_INLINE_MAX``, or with a part whose key part would be
  longer than ``PART_MAX`` (255 bytes, what those servers keep), becomes
  ``~/`` + SHA-256: a path always starts with ``instructions/`` or
  ``skills/`` (validate.py), so no inline path has a first part ``~``; its
  name is in its header.

The rules every key keeps, whatever the names (tests/test_key_layout.py):
no key is a proper path prefix of another, no part is longer than
``PART_MAX`` bytes, no part is empty, ``.`` or ``..``, no key starts or ends
with ``/``.  Nothing relies on a listing's order across a folder boundary
(SeaweedFS walks folders: ``_x/1`` comes before ``_x%20y/1``): every
limit-1 listing runs over parts of one length (epochs, numbers, dues), and
file_list sorts what it answers.

0.4's layout (eafe802 and before) kept a file at ``f/<path>`` without the
``%`` last and inline up to 400 bytes a part (``old_path_part``).  Drivers still
read such a file where its key of this layout has no object (one GET more,
only then), and write it at its new key; ``lnk-store-admin migrate
--in-place`` moves them all (admin/relayout.py), after which no old key is left.

Layout below the store's prefix::

    a/<owner>/<id>/c/<thread>/d<~epoch>/<~seq>     one event, written only if absent
    a/<owner>/<id>/c/<thread>/p<epoch>/<end>.<size>  events end-size+1..end packed (packing.py)
    a/<owner>/<id>/l/<thread>                      the head: epoch and lease (heads.py)
    a/<owner>/<id>/t/<thread>                      the tools narrowing
    a/<owner>/<id>/j/<job id>                      a job id's entries in every place
    a/<owner>/<id>/m/<k>, a/<owner>/<id>/day       job_mark's shards (and the older one mark), job_day
    a/<owner>/<id>/f/<path>%                       a file (and its tombstone: no other object per path)
    a/<owner>/<id>/f/~/<sha-256 of the path>       a file whose path's encoding is long
    a/<owner>/<id>/ledger                          the file objects there were before sizes said states (files.py)
    a/<owner>/<id>/n/<hashed part>                 the name behind a hashed part
    _due/<sortable due>/<owner>/<id>/<job>/<nonce> the shared job_next index (due_index.py)
    _claim/<owner>/<id>/<job>                      the shared index of jobs in firing (claim_index.py)

``~n`` is a number inverted (``10**digits - 1 - n``, zero-padded), so a
listing, which runs in ascending byte order, meets the newest epoch first and
in it the newest event: one listing of ``c/<thread>/`` limited to one key
answers what the last event is, however long the conversation, and it can
be sent beside the head's read instead of after it (conversations.py).

0.3.0 kept events oldest first, ``c/<thread>/e<epoch>/ev/<seq>`` and
``.../e<epoch>/seg/<end>.<size>`` (``event_v03`` below): the last one could
only be listed from where the head said to start, a round trip after it.
Conversations begun by 0.3.0 keep that layout (every ``e`` key sorts after
every ``d`` key, so the same listing tells which one a conversation has);
new ones start in this one.

No ``fv/`` (0.1.0's per-file version floor): since 0.2.0 a file's version
lives in its one object, and a removed file is a tombstone at its own key.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass
from urllib.parse import quote, unquote

INLINE_MAX = 160
PATH_INLINE_MAX = 400
#: The longest key part path-based S3 servers keep (MinIO, SeaweedFS: a key part is a file name).
PART_MAX = 255
#: What ends a file key's last part: never in a percent-encoded part, so no file key is another's folder.
FILE_END = "%"
SEQ_DIGITS = 20
EPOCH_DIGITS = 10


def _pct(name: str) -> str:
    return quote(name.encode("utf-8"), safe="")


def _hashed(name: str) -> str:
    return "~" + hashlib.sha256(name.encode("utf-8")).hexdigest()


def name_part(name: str) -> str:
    """One key part for an arbitrary string (see the module docstring).

    Short names are encoded once per process (``_short_part``): an append
    names its agent and thread three times, and encoding them each time was
    a tenth of the driver's own CPU per append (issue 26, case 7).  Longer
    names are encoded each time: so what the cache holds has a bound in
    bytes (``PARTS_KEPT`` names of at most ``SHORT_NAME_MAX`` characters)."""
    return _short_part(name) if len(name) <= SHORT_NAME_MAX else _part(name)


def _part(name: str) -> str:
    inline = "_" + _pct(name)
    return inline if len(inline) <= INLINE_MAX else _hashed(name)


#: Names the encoding cache keeps (least recently used out), each of at most ``SHORT_NAME_MAX`` characters:
#: a uuid, ``agent-`` or ``job:`` and a uuid.  At most about 490 bytes an entry (the name of 48 characters
#: outside the BMP, its part, the cache's link), 1.9 MiB in all: part of ``cache.BOOKKEEPING_BUDGET``
#: (tests/test_memory_bounds.py measures it).
PARTS_KEPT = 4096
SHORT_NAME_MAX = 48


@functools.lru_cache(maxsize=PARTS_KEPT)
def _short_part(name: str) -> str:
    return _part(name)


def is_hashed(part: str) -> bool:
    """Whether a key part hides its name (look it up in the name records)."""
    return part.startswith("~")


def decode_part(part: str) -> str:
    """The name of an inline part (hashed parts: see ``is_hashed``)."""
    assert part.startswith("_"), part
    return unquote(part[1:], errors="strict")


def path_part(path: str) -> str:
    """The key of a file path below the agent's ``f/`` folder (see the module docstring)."""
    parts = [_pct(p) for p in path.split("/")]
    inline = "/".join(parts)
    if len(inline) <= PATH_INLINE_MAX and all(len(p) + len(FILE_END) <= PART_MAX for p in parts):
        return inline + FILE_END
    return "~/" + _hashed(path)[1:]


def old_path_part(path: str) -> str:
    """The key 0.4's layout (eafe802) gave a file path below ``f/``: no terminator, parts up to 400 bytes."""
    inline = "/".join(_pct(p) for p in path.split("/"))
    return inline if len(inline) <= PATH_INLINE_MAX else "~/" + _hashed(path)[1:]


def folder_part(folder: str) -> str:
    """The listing prefix of a file folder (``skills`` or ``skills/``)."""
    return "/".join(_pct(p) for p in folder.rstrip("/").split("/")) + "/"


def decode_path(part: str) -> str:
    """The path of an inline file key, of either layout (not ``~/`` hashed ones)."""
    if part.endswith(FILE_END):
        part = part[: -len(FILE_END)]
    return "/".join(unquote(p, errors="strict") for p in part.split("/"))


def is_old_file_part(part: str) -> bool:
    """Whether a key part below ``f/`` is an inline file key of 0.4's layout (not ending in ``%``, not hashed)."""
    return not part.endswith(FILE_END) and not part.startswith("~/")


def seq_part(seq: int) -> str:
    """A zero-padded number: lexicographic order is numeric order."""
    return str(seq).zfill(SEQ_DIGITS)


def inverted(n: int, digits: int) -> str:
    """A zero-padded number counted down from the largest: lexicographic order is newest first."""
    return str(10**digits - 1 - n).zfill(digits)


@dataclass(frozen=True)
class ConversationKey:
    """What a key below ``c/<thread>/`` is: an event (``seq``) or a packed block (``end``, ``size``)."""

    kind: str  # "event" or "segment"
    epoch: int
    seq: int  # an event's number; a block's last event's
    size: int = 1
    newest_first: bool = True  # False: 0.3.0's layout


def conversation_key(rest: str) -> ConversationKey | None:
    """Parse a key's part below ``c/<thread>/`` (either layout); None for a key no driver writes there."""
    parts = rest.split("/")
    try:
        if len(parts) == 2 and parts[0][:1] == "d" and len(parts[1]) == SEQ_DIGITS:
            return ConversationKey("event", 10**EPOCH_DIGITS - 1 - int(parts[0][1:]),
                                   10**SEQ_DIGITS - 1 - int(parts[1]))
        if len(parts) == 2 and parts[0][:1] == "p":
            end, size = parts[1].split(".")
            return ConversationKey("segment", int(parts[0][1:]), int(end), int(size))
        if len(parts) == 3 and parts[0][:1] == "e" and parts[1] == "ev":
            return ConversationKey("event", int(parts[0][1:]), int(parts[2]), newest_first=False)
        if len(parts) == 3 and parts[0][:1] == "e" and parts[1] == "seg":
            end, size = parts[2].split(".")
            return ConversationKey("segment", int(parts[0][1:]), int(end), int(size), newest_first=False)
    except ValueError:
        return None
    return None


@dataclass(frozen=True)
class AgentKeys:
    """Every key of one agent's things, below ``root`` (the store's prefix)."""

    root: str
    owner: str | None
    id: str

    @property
    def base(self) -> str:
        return _agent_base(self.root, self.due_token())

    # conversations
    def conversations(self) -> str:
        return self.base + "c/"

    def thread(self, thread: str) -> str:
        return f"{self.base}c/{name_part(thread)}/"

    def events(self, thread: str, epoch: int, newest_first: bool = True) -> str:
        """The prefix of an epoch's single events (listing it never meets a packed block)."""
        if newest_first:
            return f"{self.thread(thread)}d{inverted(epoch, EPOCH_DIGITS)}/"
        return f"{self._epoch_v03(thread, epoch)}ev/"

    def event(self, thread: str, epoch: int, seq: int, newest_first: bool = True) -> str:
        if newest_first:
            return f"{self.events(thread, epoch)}{inverted(seq, SEQ_DIGITS)}"
        return f"{self.events(thread, epoch, False)}{seq_part(seq)}"

    def segments(self, thread: str, epoch: int, newest_first: bool = True) -> str:
        """The prefix of an epoch's packed blocks."""
        if newest_first:
            return f"{self.thread(thread)}p{str(epoch).zfill(EPOCH_DIGITS)}/"
        return f"{self._epoch_v03(thread, epoch)}seg/"

    def segment(self, thread: str, epoch: int, end: int, size: int, newest_first: bool = True) -> str:
        return f"{self.segments(thread, epoch, newest_first)}{seq_part(end)}.{size}"

    def _epoch_v03(self, thread: str, epoch: int) -> str:
        return f"{self.thread(thread)}e{str(epoch).zfill(EPOCH_DIGITS)}/"

    # leases and tools
    def leases(self) -> str:
        return self.base + "l/"

    def lease(self, thread: str) -> str:
        return self.leases() + name_part(thread)

    def tools_all(self) -> str:
        return self.base + "t/"

    def tools(self, thread: str) -> str:
        return self.tools_all() + name_part(thread)

    # jobs
    def jobs(self) -> str:
        return self.base + _JOBS

    def job(self, job_id: str) -> str:
        return self.jobs() + name_part(job_id)

    def mark(self) -> str:
        """The mark one object held before it was sharded (still read: an old driver writes it)."""
        return self.base + "mark"

    def mark_shards(self) -> str:
        """The prefix ``job_mark`` lists: the shards and the old ``mark`` beside them (``m`` is no object)."""
        return self.base + "m"

    def mark_shard(self, shard: int) -> str:
        """One of the mark's shards, each change of waiting writes one (jobs.py)."""
        return f"{self.base}m/{shard}"

    def day(self) -> str:
        return self.base + "day"

    # files
    def files(self) -> str:
        return self.base + "f/"

    def file(self, path: str) -> str:
        return self.files() + path_part(path)

    def old_file(self, path: str) -> str | None:
        """The key 0.4's layout gave ``path``, where it is not ``file(path)`` (read where that has none)."""
        old = self.files() + old_path_part(path)
        return None if old == self.file(path) else old

    def folder(self, folder: str) -> str:
        """The listing prefix of the inline file keys under ``folder`` (hashed ones: ``hashed_files``)."""
        return self.files() + folder_part(folder)

    def path_of(self, key: str) -> str:
        """The path of one of this agent's inline file keys (not ``~/`` hashed ones)."""
        return decode_path(key[len(self.files()):])

    def hashed_files(self) -> str:
        return self.files() + "~/"

    def file_ledger(self) -> str:
        """The agent's ledger of file objects older than the layout whose sizes say their states (files.py)."""
        return self.base + "ledger"

    # names behind hashed parts
    def name_record(self, part: str) -> str:
        return f"{self.base}n/{part.replace('/', '')}"

    # the due index
    def due_token(self) -> str:
        """This agent's owner/id as they stand in due-index keys."""
        owner = "-" if self.owner is None else name_part(self.owner)
        return f"{owner}/{name_part(self.id)}"


@dataclass(frozen=True)
class EpochKeys:
    """The keys of one epoch of one conversation, in the conversation's layout."""

    agent: AgentKeys
    thread: str
    epoch: int
    newest_first: bool = True  # False: 0.3.0's layout

    def events(self) -> str:
        return self.agent.events(self.thread, self.epoch, self.newest_first)

    def event(self, seq: int) -> str:
        return self.agent.event(self.thread, self.epoch, seq, self.newest_first)

    def segments(self) -> str:
        return self.agent.segments(self.thread, self.epoch, self.newest_first)

    def segment(self, end: int, size: int) -> str:
        return self.agent.segment(self.thread, self.epoch, end, size, self.newest_first)

    def tail(self, after: int) -> str:
        """The tail after the packed block ending at ``after`` (packing.py, "Tails").

        Named as a block of size 0 ending at ``after``: a name every release
        since 0.4.0 parses as a segment of the epoch, so older drivers and
        tools beside this one purge, collect and copy it with the epoch's
        blocks, and none of them ever reads it (no cover names a size 0).
        """
        return self.segment(after, 0)

    def seq_of(self, key: str) -> int:
        """The number of one of this epoch's event keys."""
        found = conversation_key(key[len(self.agent.thread(self.thread)):])
        if found is None or found.kind != "event":
            raise ValueError(f"not an event key: {key}")
        return found.seq


def due_root(root: str) -> str:
    """The shared job_next index: one prefix for every agent in the store."""
    return root + "_due/"


def due_entry(root: str, sortable_due: str, agent: AgentKeys, job_id: str, nonce: str) -> str:
    """One entry of the due index (``sortable_due``: due_index.py's ``sortable``), unique by its nonce."""
    return f"{due_root(root)}{sortable_due}/{agent.due_token()}/{name_part(job_id)}/{nonce}"


def due_record(root: str, entry: str) -> str:
    """The key of the job record a due entry (a whole key, as ``due_entry`` makes it) belongs to."""
    owner, agent_id, job = entry[len(due_root(root)):].split("/")[1:4]
    return _agent_base(root, f"{owner}/{agent_id}") + _JOBS + job


def is_due_entry_of(root: str, agent: AgentKeys, job_id: str, entry: object) -> bool:
    """Whether ``entry`` is a due-index key of THIS agent's THIS job, as ``due_entry`` makes them.

    A job record names its entry by its whole key, and the driver deletes
    that key when the job leaves waiting: a record that named anything else
    (another agent's file, another job's entry) would make it delete that.
    So the entry is checked part by part against the key the record's own
    agent and job id give: the index root, 16 hex digits of a due, this
    agent's owner/id, this job's id part, and a nonce of 32 hex digits.
    """
    return is_due_entry_of_part(root, agent.due_token(), name_part(job_id), entry)


def is_due_entry_of_part(root: str, token: str, job_part: str, entry: object) -> bool:
    """``is_due_entry_of`` from key parts (the agent's ``due_token`` and the job's id part), for tools
    that walk a store by its keys and cannot always name the agent or the job (hashed parts)."""
    prefix = due_root(root)
    if not isinstance(entry, str) or not entry.startswith(prefix):
        return False
    parts = entry[len(prefix):].split("/")
    if len(parts) != 5:
        return False
    due, owner, agent_id, job, nonce = parts
    return (len(due) == 16 and all(c in _HEX for c in due) and f"{owner}/{agent_id}" == token
            and job == job_part and len(nonce) == 32 and all(c in _HEX for c in nonce))


_HEX = frozenset("0123456789abcdef")
_JOBS = "j/"


def claim_root(root: str) -> str:
    """The shared index of jobs in firing: one prefix for every agent in the store."""
    return root + "_claim/"


def claim_entry(root: str, agent: AgentKeys, job_id: str) -> str:
    """The claim-index entry of one agent's one job (claim_index.py): the job's own key, no nonce."""
    return f"{claim_root(root)}{agent.due_token()}/{name_part(job_id)}"


def claim_record(root: str, token: str, job_part: str) -> str:
    """The job record a claim entry (its agent's ``due_token`` and job part) belongs to."""
    return _agent_base(root, token) + _JOBS + job_part


def is_name_part(part: str) -> bool:
    """Whether ``part`` is one ``name_part`` makes: inline and canonical, or ``~`` and a SHA-256."""
    if part.startswith("~"):
        return len(part) == 65 and all(c in _HEX for c in part[1:])
    if not part.startswith("_") or len(part) > INLINE_MAX:
        return False
    try:
        return name_part(decode_part(part)) == part
    except UnicodeDecodeError:
        return False


def _agent_base(root: str, token: str) -> str:
    """The folder of one agent's things, its owner/id parts given as ``due_token`` spells them."""
    return f"{root}a/{token}/"

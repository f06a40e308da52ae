"""Issue 41, finding 3: 0.3.0 (06d9b75) beside the new release on one conversation.

0.3.0 keeps events oldest first (``c/<thread>/e<epoch>/ev/<seq>``) and lists
only there; a conversation HEAD (or 0.4.0 on) began is newest first
(``d<~epoch>/<~seq>``), so 0.3.0 answers ``last 0`` and ``read []`` on it,
and its append of seq 1 is a second ``done`` (two winners of one number).

What is asked is an error from 0.3.0 instead, where that is cheap.  It is
not, for these three ops (docs/design.md, "Older releases"): 0.3.0 reads a
conversation through its head and a listing of ``e<epoch>/ev/`` only, and
every object there is also what 0.5.0's removal reads to tell an epoch's
layout (``_epoch_layout``), so any object put there to fail 0.3.0 would make
0.5.0 fence a HEAD conversation in the old layout, and acknowledge appends
into a removed epoch; heads are read by 0.5.0 as strictly as by HEAD, and
any field it accepts 0.3.0 reads without failing.  So
``test_03_answers_errors_on_a_new_conversation`` is a strict xfail: it
states the promise the matrix cannot keep for 0.3.0, and fails the run the
day it passes (then drop the mark).

What HEAD does keep: its own reads stay exact beside 0.3.0's stray writes,
and (fixed here) an epoch where 0.3.0 wrote a stray event is still fenced in
the layout its first event has when it is removed, so no append is answered
``done`` into a removed epoch.  The test of that fails with 0.5.0 in HEAD's
place (``CLOUDSTORE_AS_HEAD=0.5.0``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from releases import Driver, as_head, previous

OLDEST = "0.3.0"


def _events(n: int) -> list[dict[str, int]]:
    return [{"seq": s} for s in range(1, n + 1)]


@pytest.mark.xfail(strict=True, reason="no cheap poison for 0.3.0's last/read/append that 0.5.0 tolerates: "
                   "see this module's docstring and docs/design.md, 'Older releases'")
def test_03_answers_errors_on_a_new_conversation(fleet: Callable[[str], Driver]) -> None:
    head, old = fleet(as_head()), fleet(OLDEST)
    for seq in (1, 2, 3):
        assert head("append", thread="t", event={"seq": seq}) == {"reply": "done"}
    assert old("last", thread="t")["reply"] == "error"
    assert old("read", thread="t")["reply"] == "error"
    assert old("append", thread="t", event={"seq": 2})["reply"] == "error"


def test_head_and_previous_read_exactly_beside_03(fleet: Callable[[str], Driver]) -> None:
    """Whatever 0.3.0 answers and writes on a conversation HEAD began, HEAD and 0.5.0 read HEAD's events."""
    head, prev, old = fleet(as_head()), fleet(previous()), fleet(OLDEST)
    for seq in (1, 2, 3):
        assert head("append", thread="t", event={"seq": seq}) == {"reply": "done"}
    old("last", thread="t")
    old("read", thread="t")
    old("append", thread="t", event={"seq": 1, "by": OLDEST})  # on c81d270: a second "done" for seq 1
    old("append", thread="t", event={"seq": 2, "by": OLDEST})
    for d in (head, prev):
        assert d("last", thread="t") == {"reply": "last", "last": 3}
        assert d("read", thread="t") == {"reply": "events", "events": _events(3)}
        assert d("append", thread="t", event={"seq": 3}) == {"reply": "taken", "last": 3}


def test_remove_fences_the_layout_of_the_epochs_first_event(fleet: Callable[[str], Driver]) -> None:
    """A stray 0.3.0 event in HEAD's epoch must not make a removal fence the wrong layout.

    ``writer`` appends from memory (one create, no head read, as a serve
    process does within its trust window); after ``remover``'s remove
    answered, that writer's next append must not be ``done`` into the dead
    epoch: it is ``taken`` (last 0), or ``done`` in the new epoch, readable.
    """
    writer, remover, old = fleet(as_head()), fleet(as_head()), fleet(OLDEST)
    for seq in (1, 2, 3):
        assert writer("append", thread="t", event={"seq": seq}) == {"reply": "done"}
    assert old("append", thread="t", event={"seq": 1, "by": OLDEST}) == {"reply": "done"}  # the stray event
    assert remover("remove", thread="t") == {"reply": "done"}
    reply = writer("append", thread="t", event={"seq": 4})
    assert reply in ({"reply": "taken", "last": 0}, {"reply": "done"}), reply
    for d in (writer, remover):
        want = _events(4)[3:] if reply == {"reply": "done"} else []
        assert d("read", thread="t") == {"reply": "events", "events": want}, (
            f"{writer.release} was told {reply} for seq 4 after the remove")

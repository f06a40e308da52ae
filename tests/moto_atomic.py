"""moto's S3 server with its conditional writes atomic, as S3's are: ``python -m moto_atomic -H HOST -p PORT``.

moto checks ``If-None-Match: *`` and ``If-Match`` and then stores, with
nothing between the two held (``S3Response.put_object``,
``delete_object``, ``_key_response_post``), on a threaded server: two
conditional creates of one key that arrive together can both pass the
check and both be answered 200.  Quiet, it never shows (8 racers, 20 of 20
trials one winner: the design notes); on a loaded 2-core machine two
appenders were once both told ``done`` for one number
(``test_append_cost.py::test_two_processes_appending_at_once...[moto]``, in
a rehearsal with two suites running).  S3 itself settles conditional writes
atomically, and the drivers' promises rest on that; a rig that does not
would fail them at random.  So every such write here runs under one lock,
which is all S3 promises and no more: requests still overlap everywhere
else (reads, listings, the wait for a body).

For the rig's own test (tests/test_moto_atomic.py) two settings make the
race certain rather than rare: ``MOTO_RACE_WINDOW`` (seconds) holds every
store of an object that long after its check, and ``MOTO_ATOMIC=0`` leaves
the lock off, as plain moto runs.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from moto.s3.models import S3Backend
from moto.s3.responses import S3Response
from moto.server import main

#: The S3 handlers that check a precondition and then write (moto 5.x): PutObject, DeleteObject, and
#: CompleteMultipartUpload (``If-None-Match`` on a POST to a key).
CONDITIONAL_WRITES = ("put_object", "delete_object", "_key_response_post")
_WRITING = threading.Lock()


def _atomic(handler: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(handler)
    def held(self: S3Response, *args: Any, **kwargs: Any) -> Any:
        with _WRITING:
            return handler(self, *args, **kwargs)

    return held


def make_atomic() -> None:
    """Wrap each of ``CONDITIONAL_WRITES`` in the lock; a name moto no longer has fails loudly here."""
    for name in CONDITIONAL_WRITES:
        setattr(S3Response, name, _atomic(getattr(S3Response, name)))


def widen(seconds: float) -> None:
    """Hold every store of an object ``seconds`` after its precondition was checked (the rig's test only)."""
    store = S3Backend.put_object

    @functools.wraps(store)
    def slow(self: S3Backend, *args: Any, **kwargs: Any) -> Any:
        time.sleep(seconds)
        return store(self, *args, **kwargs)

    S3Backend.put_object = slow  # type: ignore[method-assign]


if __name__ == "__main__":
    if os.environ.get("MOTO_RACE_WINDOW"):
        widen(float(os.environ["MOTO_RACE_WINDOW"]))
    if os.environ.get("MOTO_ATOMIC") != "0":
        make_atomic()
    main(sys.argv[1:])

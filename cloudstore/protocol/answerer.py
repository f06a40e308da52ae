"""A driver's answering of request lines, apart from its command line: a line in, a reply dict out.

``Answerer`` is what ``lnk-gcs`` and ``lnk-bucket-store`` do with each request
line (parse it, open the store on the first one, ``Service.answer`` it, name
the setting in a missing bucket's error, log it at DEBUG), and the Python API
(``cloudstore.api.Engine``) sends every call through the very same object, so
that a request the API lets through is answered exactly as a driver answers
its line.  It lives here, in the library, and not in ``cloudstore/driver.py``:
that module is a program's main (``--help``, ``contract``, ``call``/``serve``,
stdout discipline, logging setup), and no library module imports a main.

Kept light at module level: ``driver.py`` imports this module before it
answers ``contract``, which must cost a bare Python start (no SDK, no store);
what opening a store needs is imported on the first request.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..http_status import BUCKET_GONE

if TYPE_CHECKING:
    from .service import Answered, Service

log = logging.getLogger("cloudstore")

#: "1" lets this process answer the scheduler's ops (``job_due``...; service.py): the runner sets it for its
#: own driver.
SCHEDULER_OPS_SETTING = "LNK_SCHEDULER_OPS"


@dataclass(frozen=True)
class StoreSetting:
    """The setting that names a driver's store, and the URL schemes it takes.

    Replies name the setting (``LNK_BUCKET_URL``), never its value (a bucket,
    a folder).  The Python API has no setting, and answers with the words of
    the driver of its URL's kind (``setting_of``).
    """

    name: str
    schemes: tuple[str, ...]


GCS_SETTING = StoreSetting("LNK_GCS_URL", ("gs",))
BUCKET_SETTING = StoreSetting("LNK_BUCKET_URL", ("s3", "file"))


def setting_of(scheme: str) -> StoreSetting:
    """The setting of the driver that keeps a store of ``scheme`` (``gs``: lnk-gcs; else lnk-bucket-store)."""
    return GCS_SETTING if scheme in GCS_SETTING.schemes else BUCKET_SETTING


def error(why: str) -> dict[str, Any]:
    return {"reply": "error", "error": why}


def encode_reply(reply: dict[str, Any]) -> str:
    """One reply line, exactly as docs/protocol.md writes it (``{"reply": "done"}``).

    A reply that cannot be written as JSON (a value no request should have
    let in) becomes an error line: a reply never crashes the driver.
    """
    try:
        return json.dumps(reply, ensure_ascii=True, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        log.error("a reply could not be encoded: %s", exc)
        return json.dumps(error(f"internal error: the reply could not be written as JSON ({type(exc).__name__})"))


def open_failure(setting: str, exc: BaseException) -> str:
    """Why the store could not be opened, as a reply: what to fix, never a folder or an endpoint.

    Google's client finds no credentials at open (``DefaultCredentialsError``):
    that names the credentials, not the URL, which is fine.
    """
    if type(exc).__name__ == "DefaultCredentialsError":
        return (f"{setting} names a store that cannot be opened: no Google credentials found: set "
                "GOOGLE_APPLICATION_CREDENTIALS to a service account's key file, or run with an attached one")
    why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
    return f"{setting} names a store that cannot be opened: {why}"


class Answerer:
    """Turns request lines into reply dicts, on the store ``setting`` names or on a ``Service`` given.

    A driver makes it with the setting alone: the store is opened on the first
    request that needs it (a missing or malformed setting is then every
    request's error reply, never an exit).  The Python API makes it around a
    ``Service`` of its own, on the backend its pool shares.
    """

    def __init__(self, setting: StoreSetting, service: Service | None = None) -> None:
        self.setting = setting
        self.service: Service | None = service
        self.last_op = ""  # the op of the last request answered: deferred work is counted under it

    def _service(self) -> Service:
        if self.service is None:
            from ..errors import SettingError
            from ..settings import open_store, parse_location
            from ..store.space import Space
            from .service import Service

            setting = self.setting.name
            location = parse_location(setting, os.environ.get(setting), self.setting.schemes)
            try:
                store = open_store(location, create=False, setting=setting)  # a typo makes no new store
            except SettingError as exc:  # no credentials, no such folder: the message says what to set
                log.error("cannot open the store: %s", exc)
                raise
            except Exception as exc:  # a folder that cannot be read, an SDK that finds no credentials
                # The detail names folders and endpoints: the operator's log has it, the reply only its kind.
                log.error("cannot open the store: %s", exc, exc_info=log.isEnabledFor(logging.DEBUG))
                raise SettingError(open_failure(setting, exc)) from exc
            service = Service(Space(store, location.prefix),
                              scheduler_ops=os.environ.get(SCHEDULER_OPS_SETTING) == "1")
            service.space.deferred = []  # packing and index drops wait until the reply is out
            self.service = service
        return self.service

    def named(self, reply: dict[str, Any]) -> dict[str, Any]:
        """An error reply saying the bucket does not exist, with the setting that names it."""
        why, setting = reply.get("error"), self.setting.name
        if reply.get("reply") == "error" and isinstance(why, str) and BUCKET_GONE in why and setting not in why:
            return {**reply, "error": f"{why} (the bucket {setting} names: check the setting)"}
        return reply

    @property
    def pending(self) -> bool:
        """Whether the last reply left work for after it (``after_reply`` does it)."""
        return self.service is not None and bool(self.service.space.deferred)

    def after_reply(self) -> None:
        """The work a reply left for after it was sent (packing), so no reply waits on it.

        Its store requests are counted in ``metrics`` under the op that left it.
        """
        if self.service is not None and self.service.space.deferred:
            from ..runtime.metrics import op_scope

            with op_scope(self.last_op):
                self.service.space.run_deferred()

    def answer(self, line: bytes) -> dict[str, Any]:
        """The reply to request ``line``, as a driver writes it (``answered``'s, without its kind)."""
        return self.answered(line).reply

    def answered(self, line: bytes) -> Answered:
        """The reply to request ``line`` and, for an error, its kind (``service.Answered``).

        The driver writes the reply alone; the Python API raises the kind's
        class.  A line that is no request and a setting that opens no store
        are refusals (as the API has always raised them): nothing was asked
        of a store.
        """
        from ..errors import SettingError
        from .service import Answered
        from .validate import SHOWN_MAX, RequestError, parse_request, shown

        try:
            request = parse_request(line)
            service = self._service()
        except (RequestError, SettingError) as exc:
            from ..runtime.metrics import REPLIES

            REPLIES.inc("", "", "error")  # no store to name: a line that is no request, or a bad setting
            return Answered(error(str(exc)), "refused")  # each message already says what went wrong
        op = request.get("op")
        self.last_op = op if isinstance(op, str) and op in service.ops else ""
        before, start = service.space.store.requests, time.perf_counter()
        answered = service.answered(request)
        answered = answered.but(self.named(answered.reply))
        if not log.isEnabledFor(logging.DEBUG):
            return answered
        reply = answered.reply
        shown_op = op if isinstance(op, str) and len(op) <= SHOWN_MAX else shown(op)
        requests, ms = service.space.store.requests - before, round((time.perf_counter() - start) * 1000, 2)
        log.debug(
            "op=%s reply=%s requests=%d ms=%.2f", shown_op, reply.get("reply"), requests, ms,
            extra={"op": shown_op, "reply": reply.get("reply"), "requests": requests, "ms": ms},
        )
        return answered

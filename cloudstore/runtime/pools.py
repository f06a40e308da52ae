"""A thread pool whose tasks keep their submitter's context, so their requests count for its op.

Requests sent on a pool thread (a collection's parallel reads, the store gate's probe beside an op)
must be counted in ``metrics`` for the wire op the submitting thread is answering (``op_scope``
keeps that op in a ``contextvars`` variable), as if they had been sent in line. Plumbing any layer
may use: the storage (``store.space``) and the gate below it both do.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class ContextPool(ThreadPoolExecutor):
    """A thread pool whose tasks run in a copy of the submitter's context (``contextvars``).

    So a request made on a pool thread is counted for the wire op its
    submitter is answering (``metrics.op_scope``), as if made in line.
    """

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return super().submit(contextvars.copy_context().run, fn, *args, **kwargs)

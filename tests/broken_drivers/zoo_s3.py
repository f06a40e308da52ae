#!/usr/bin/env python3
"""This project's lnk-bucket-store with one defect a cloud's faults expose, for ``lnk-store-check --faults``.

The toy driver (``toy_driver.py``) breaks promises on a folder; these break
them on a real HTTP store (moto), where only the faults of ``--faults`` make
the defect show.  ``ZOO_BREAK=<name>`` monkeypatches one seam of cloudstore
before the driver's own main runs (nothing of the package is changed), and
each must be caught by the check named for it:

  sdk_retries    botocore's own retries left on (3 attempts): the first try's reply lost, the
                 SDK retries out of the driver's sight, so the driver never learns its write
                 may have landed and takes the retry's refusal for another's win (`taken`)
                                                                 -> faults.lost_reply
  still_current  a write whose reply was lost counts as ours only while it is still the
                 current object (not by its lineage): replaced meanwhile, it is `stale`
                                                                 -> faults.own_write_replaced
  late_delete    file_remove deletes the object unconditionally: a delete that lands late,
                 after the file was made again, takes the new file with it
                                                                 -> faults.late_landing
  stale_last     `last` answered from what this process last knew of the conversation: each
                 reply is one the conversation once had, none is wrong alone, but a `last`
                 older than an append that ended before it was asked fits no order
                                                                 -> faults.racers_linearizable
  local_clock    leases judged and written by this machine's clock, not the store's
                                                                 -> faults.store_time
  shift_in_two   job_shift as a put into the target, then a removal from the source: a
                 process killed between the two leaves the job in two places
                                                                 -> crash.job_shift (``--crash``; on a folder too)
  due_before_record
                 a shift out of waiting deletes the job's due-index entry before it writes
                 the record: a process killed between the two leaves a waiting job that
                 job_next no longer counts                       -> crash.job_shift (``--crash``)
  packing_rewrites
                 an appender told `taken` still packs the block its event would have ended,
                 from what it sent: the block rewrites the event another appender stored
                                                                 -> check.taken_at_a_block_end
  trusts_server  the server never probed (``server_check.Probe`` answers as an honest server
                 would, sending nothing): on a server that ignores preconditions every write
                 is told its success, two appenders of one seq both `done`
                                                                 -> faults.server_ignores_preconditions
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

BREAK = os.environ.get("ZOO_BREAK", "")
BREAKS = ("sdk_retries", "stale_last", "still_current", "late_delete", "local_clock", "shift_in_two",
          "due_before_record", "packing_rewrites", "trusts_server")


def sdk_retries() -> None:
    from cloudstore import s3

    plain = s3.config_options

    def config_options(timeout: float = 10.0) -> dict[str, Any]:
        return {**plain(timeout), "retries": {"total_max_attempts": 3, "mode": "standard"}}

    s3.config_options = config_options


def stale_last() -> None:
    from cloudstore.store import conversations

    plain = conversations.Conversations.last

    def last(self: Any, agent: Any, thread: str) -> int:
        mem = self.memory.get(self.space.keys(agent).thread(thread))
        return mem.last if mem is not None else plain(self, agent, thread)  # however old the memory

    conversations.Conversations.last = last


def still_current() -> None:
    from cloudstore import generations

    def own_write_fate(nonce: str, mode: Any, current: bytes | None) -> bool | None:
        if current is None:
            return None
        return generations.unframe(current)[0] == nonce

    generations.own_write_fate = own_write_fate


def late_delete() -> None:
    from cloudstore.store import files

    def remove(self: Any, agent: Any, path: str, version: int) -> bool:
        now = self.read(agent, path)
        if now is None or now["version"] != version:
            return False
        self.store.delete(self.space.keys(agent).file(path))  # no version: lands whenever it lands
        return True

    files.Files.remove = remove


def local_clock() -> None:
    from cloudstore import clock

    clock.StoreClock.offset = property(lambda self: 0.0)  # type: ignore[method-assign,assignment]
    clock.StoreClock.earliest = lambda self: time.time()  # type: ignore[method-assign]


def shift_in_two() -> None:
    from cloudstore.store import jobs

    def shift(self: Any, agent: Any, job_id: str, source: str, target: str) -> bool:
        job = self.get(agent, source, job_id)
        if job is None:
            return False
        self.put(agent, target, job)
        return bool(self.remove(agent, source, job_id))

    jobs.Jobs.shift = shift


def due_before_record() -> None:
    from cloudstore.store import jobs

    plain = jobs.Jobs.move

    def move(self: Any, agent: Any, job_id: str, source: str, target: str) -> Any:
        if source == jobs.WAITING and target != jobs.WAITING:
            keys = self.space.keys(agent)
            held = jobs._places(self._read(keys, keys.job(job_id))).get(source)
            if held is not None:
                self._drop(keys, job_id, held)  # the entry first: the record's write may never come
        return plain(self, agent, job_id, source, target)

    jobs.Jobs.move = move


def packing_rewrites() -> None:
    from cloudstore.store import conversations

    plain = conversations.Conversations.append

    def append(self: Any, agent: Any, thread: str, event: dict[str, Any], seq: int) -> Any:
        reply = plain(self, agent, thread, event, seq)
        keys = self.space.keys(agent)
        mem = self.memory.get(keys.thread(thread))
        if reply == {"reply": "taken", "last": seq} and conversations.packed_at(seq) and mem is not None:
            at = conversations.EpochKeys(keys, thread, mem.epoch, mem.newest_first)
            self._pack(at, seq, {**mem.recent, seq: conversations.compact(event)})  # what it sent, not what won
        return reply

    conversations.Conversations.append = append


def trusts_server() -> None:
    from cloudstore.gate import server_check

    # Each of the probe's writes "refused", as on an honest server whose probe key exists: nothing sent.
    server_check.Probe.create = lambda self: False  # type: ignore[method-assign]
    server_check.Probe.stale_update = lambda self: None  # type: ignore[method-assign]
    server_check.Probe.second = lambda self: None  # type: ignore[method-assign]


def main() -> None:
    if BREAK:
        if BREAK not in BREAKS:
            print(f"zoo_s3: ZOO_BREAK must be one of {', '.join(BREAKS)}, not {BREAK!r}", file=sys.stderr)
            sys.exit(2)
        globals()[BREAK]()
    from cloudstore.driver import main_bucket

    main_bucket()


if __name__ == "__main__":
    main()

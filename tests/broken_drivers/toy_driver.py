#!/usr/bin/env python3
"""A small, correct store driver that speaks the whole of wire.md, to test the conformance suite.

It proves the suite is not too strict (it passes every check) and, with one
defect switched on, that the suite catches that defect by the right check.

State: JSON files under ``$TOY_STORE_DIR``: one folder per agent (named by a
hash of ``[owner, id]``, so names never collide), holding ``conv.json``
(events, leases, tools), ``jobs.json``, ``meta.json`` (the next file version)
and ``files/<hash of path>.json``. Every op runs under one exclusive
``flock`` on ``$TOY_STORE_DIR/lock``, so concurrent processes are correct.

``TOY_KEEPS`` (comma list of conversations, jobs, files, tools; all by
default) says what it keeps; the contract follows it, unless ``TOY_CONTRACT``
(a JSON line) is printed instead, to test a contract that lies.
``TOY_BREAK=<name>`` injects exactly one defect:

  double_append    two appenders of one seq can both win (check, then a gap, then write)
  version_reuse    a file made again after removal restarts at version 1
  widen_narrowing  tools_narrow replaces the list instead of intersecting
  double_shift     two shifters of one job can both find it
  stdout_log       a log line on stdout: before a call's reply, and when serve ends
  lease_seconds    lapse judged in whole seconds
  lost_event_value integers past 2**53 in events stored as floats
  partial_error    append with a non-integer number seq writes the event, then answers an error
"""

from __future__ import annotations

import base64
import binascii
import fcntl
import hashlib
import json
import math
import os
import re
import sys
import time
import unicodedata
from collections.abc import Callable
from typing import Any

Json = Any
BREAK = os.environ.get("TOY_BREAK", "")
KEEPS = set(filter(None, os.environ.get("TOY_KEEPS", "conversations,jobs,files,tools").split(",")))
PLACES = ("waiting", "firing", "ending")
FILE_MAX = 4 * 1024 * 1024
FILES_MAX = 4096
SPEC_MAX = 1024 * 1024
TOOLS_MAX = 256
B64 = re.compile(r"(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?")
USAGE = """usage: toy_driver.py (--version | --help | contract | call | serve)

A toy store driver for testing lnk-store-check. Settings:
  TOY_STORE_DIR  folder it keeps everything in (required for requests)
  TOY_KEEPS      what it keeps: conversations,jobs,files,tools (default all)
  TOY_CONTRACT   a JSON line printed by `contract` instead of the true one
  TOY_BREAK      one defect to inject (see the module's docstring)
"""


class Refused(Exception):
    """A request that breaks a rule: answered with an error reply."""


def _no_constant(name: str) -> Json:
    raise ValueError(f"{name} is not JSON")


def _utf8_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


# -- validation


def is_int(value: Json) -> bool:
    return type(value) is int


def want_str(req: dict, key: str) -> str:
    value = req.get(key)
    if not isinstance(value, str):
        raise Refused(f"{key} must be a string")
    return value


def want_int(req: dict, key: str, least: int, default: Json = None) -> int:
    value = req.get(key, default)
    if not is_int(value) or value < least:
        raise Refused(f"{key} must be an integer >= {least}")
    return value


def want_place(req: dict, key: str = "place") -> str:
    value = req.get(key)
    if value not in PLACES or not isinstance(value, str):
        raise Refused(f"{key} must be one of {', '.join(PLACES)}")
    return value


def want_id(value: Json) -> str:
    if not isinstance(value, str) or not 1 <= len(_utf8_key(value)) <= 256:
        raise Refused("a job id is 1 to 256 bytes")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise Refused("a job id has no control character")
    return value


def want_job(value: Json) -> dict:
    if not isinstance(value, dict) or not {"id", "spec", "due"} <= set(value):
        raise Refused("a job is {id, spec, due}")
    want_id(value["id"])
    if type(value["due"]) not in (int, float):
        raise Refused("due must be a number")
    size = len(json.dumps(value["spec"], separators=(",", ":"), ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > SPEC_MAX:
        raise Refused("spec past 1 MiB")
    return {"id": value["id"], "spec": value["spec"], "due": value["due"]}


def want_path(value: Json, folder: bool = False) -> str:
    if not isinstance(value, str):
        raise Refused("a path is a string")
    if "\x00" in value or len(_utf8_key(value)) > 1024:
        raise Refused("a path has no NUL and at most 1,024 bytes")
    bare = value[:-1] if folder and value.endswith("/") else value
    parts = bare.split("/")
    if parts[0] not in ("instructions", "skills") or any(p in ("", ".", "..") for p in parts):
        raise Refused("a path is instructions/... or skills/..., no part empty, . or ..")
    return bare


def want_data(req: dict) -> bytes:
    value = req.get("data")
    if not isinstance(value, str) or not B64.fullmatch(value):
        raise Refused("data must be standard padded base64")
    try:
        data = base64.b64decode(value, validate=True)
    except binascii.Error as exc:
        raise Refused(f"data: {exc}") from exc
    if len(data) > FILE_MAX:
        raise Refused("data past 4 MiB")
    return data


def want_agent(req: dict) -> list:
    agent = req.get("agent")
    if not isinstance(agent, dict) or not isinstance(agent.get("id"), str) or not agent["id"]:
        raise Refused("agent.id must be a non-empty string")
    owner = agent.get("owner")
    if owner is not None and not isinstance(owner, str):
        raise Refused("agent.owner must be a string or null")
    return [owner, agent["id"]]


# -- the store


class Store:
    """Everything under one folder, one exclusive lock around each op."""

    def __init__(self, root: str) -> None:
        self.root = root
        os.makedirs(os.path.join(root, "agents"), exist_ok=True)
        self.fd = os.open(os.path.join(root, "lock"), os.O_RDWR | os.O_CREAT, 0o600)

    def __enter__(self) -> Store:
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

    def pause(self) -> None:
        """Let the lock go for a moment (only a defect does this)."""
        fcntl.flock(self.fd, fcntl.LOCK_UN)
        time.sleep(0.05)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def folder(self, agent: list) -> str:
        name = hashlib.sha256(json.dumps(agent).encode()).hexdigest()
        return os.path.join(self.root, "agents", name)

    def load(self, agent: list, name: str, default: Json) -> Json:
        try:
            with open(os.path.join(self.folder(agent), name), encoding="utf-8") as f:
                return json.load(f)
        except FileNotFoundError:
            return default

    def save(self, agent: list, name: str, value: Json) -> None:
        path = os.path.join(self.folder(agent), name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(value, f)
        os.replace(path + ".tmp", path)

    def drop(self, agent: list, name: str) -> None:
        try:
            os.remove(os.path.join(self.folder(agent), name))
        except FileNotFoundError:
            pass


def conv_of(st: Store, agent: list) -> dict:
    return st.load(agent, "conv.json", {"threads": {}, "leases": {}, "tools": {}})


def jobs_of(st: Store, agent: list) -> dict:
    return st.load(agent, "jobs.json", {"places": {p: {} for p in PLACES}, "mark": 0, "day": [0, 0]})


def file_name(path: str) -> str:
    return "files/" + hashlib.sha256(_utf8_key(path)).hexdigest() + ".json"


# -- conversations


def lossy(value: Json) -> Json:
    """The lost_event_value defect: big integers through a double."""
    if is_int(value) and abs(value) > 2**53:
        return float(value)
    if isinstance(value, list):
        return [lossy(v) for v in value]
    if isinstance(value, dict):
        return {k: lossy(v) for k, v in value.items()}
    return value


def last_of(evs: list) -> int:
    return evs[-1]["seq"] if evs else 0


def op_append(st: Store, agent: list, req: dict) -> Json:
    thread = want_str(req, "thread")
    event = req.get("event")
    if not isinstance(event, dict):
        raise Refused("event must be an object")
    seq = event.get("seq")
    if not is_int(seq) or seq < 1:
        if BREAK == "partial_error" and isinstance(seq, (int, float)):
            conv = conv_of(st, agent)
            conv["threads"].setdefault(thread, []).append({**event, "seq": int(seq)})
            st.save(agent, "conv.json", conv)
        raise Refused("event.seq must be an integer >= 1")
    conv = conv_of(st, agent)
    last = last_of(conv["threads"].get(thread, []))
    if seq != last + 1:
        return {"reply": "taken", "last": last}
    if BREAK == "double_append":
        st.pause()
        conv = conv_of(st, agent)
    conv["threads"].setdefault(thread, []).append(lossy(event) if BREAK == "lost_event_value" else event)
    st.save(agent, "conv.json", conv)
    return {"reply": "done"}


def op_read(st: Store, agent: list, req: dict) -> Json:
    thread = want_str(req, "thread")
    first = want_int(req, "first", 1, default=1)
    evs = conv_of(st, agent)["threads"].get(thread, [])
    return {"reply": "events", "events": [e for e in evs if e["seq"] >= first]}


def op_last(st: Store, agent: list, req: dict) -> Json:
    thread = want_str(req, "thread")
    return {"reply": "last", "last": last_of(conv_of(st, agent)["threads"].get(thread, []))}


def op_threads(st: Store, agent: list, req: dict) -> Json:
    threads = conv_of(st, agent)["threads"]
    names = sorted((t for t, evs in threads.items() if evs), key=_utf8_key)
    return {"reply": "threads", "threads": [{"thread": t, "last": last_of(threads[t])} for t in names]}


def op_remove(st: Store, agent: list, req: dict) -> Json:
    thread = want_str(req, "thread")
    conv = conv_of(st, agent)
    conv["threads"].pop(thread, None)
    conv["leases"].pop(thread, None)
    st.save(agent, "conv.json", conv)
    return {"reply": "done"}


def lapsed(lease: dict, now: float, lapse_ms: int) -> bool:
    elapsed_ms = (now - lease["renewed"]) * 1000
    if BREAK == "lease_seconds":
        elapsed_ms = math.floor(now - lease["renewed"]) * 1000
    return elapsed_ms >= lapse_ms


def op_take(st: Store, agent: list, req: dict) -> Json:
    thread, holder = want_str(req, "thread"), want_str(req, "holder")
    lapse_ms = want_int(req, "lapse_ms", 0)
    conv, now = conv_of(st, agent), time.time()
    lease = conv["leases"].get(thread)
    if lease is None:
        how = "took"
    elif lease["holder"] == holder:
        lease["renewed"] = now
        st.save(agent, "conv.json", conv)
        return {"reply": "took", "took": "took"}
    elif lapsed(lease, now, lapse_ms):
        how = "lapsed"
    else:
        return {"reply": "took", "took": "held"}
    conv["leases"][thread] = {"holder": holder, "started": now, "renewed": now}
    st.save(agent, "conv.json", conv)
    return {"reply": "took", "took": how}


def op_renew(st: Store, agent: list, req: dict) -> Json:
    thread, holder = want_str(req, "thread"), want_str(req, "holder")
    conv = conv_of(st, agent)
    lease = conv["leases"].get(thread)
    if lease is None or lease["holder"] != holder:
        return {"reply": "lost"}
    lease["renewed"] = time.time()
    st.save(agent, "conv.json", conv)
    return {"reply": "done"}


def op_end(st: Store, agent: list, req: dict) -> Json:
    thread, holder = want_str(req, "thread"), want_str(req, "holder")
    conv = conv_of(st, agent)
    if conv["leases"].get(thread, {}).get("holder") == holder:
        del conv["leases"][thread]
        st.save(agent, "conv.json", conv)
    return {"reply": "done"}


def op_leases(st: Store, agent: list, req: dict) -> Json:
    lapse_ms = want_int(req, "lapse_ms", 0)
    now = time.time()
    rows = [
        {"thread": t, "holder": held["holder"], "started": round(held["started"], 3),
         "renewed": round(held["renewed"], 3), "lapsed": lapsed(held, now, lapse_ms)}
        for t, held in conv_of(st, agent)["leases"].items()
    ]
    return {"reply": "leases", "leases": rows}


# -- tools


def op_tools_read(st: Store, agent: list, req: dict) -> Json:
    thread = want_str(req, "thread")
    return {"reply": "tools", "tools": conv_of(st, agent)["tools"].get(thread)}


def op_tools_list(st: Store, agent: list, req: dict) -> Json:
    return {"reply": "narrowed", "narrowed": conv_of(st, agent)["tools"]}


def op_tools_narrow(st: Store, agent: list, req: dict) -> Json:
    thread = want_str(req, "thread")
    names = req.get("tools")
    if not isinstance(names, list) or len(names) > TOOLS_MAX or not all(isinstance(n, str) and n for n in names):
        raise Refused("tools must be a list of at most 256 non-empty strings")
    given = list(dict.fromkeys(names))
    conv = conv_of(st, agent)
    now = conv["tools"].get(thread)
    conv["tools"][thread] = given if now is None or BREAK == "widen_narrowing" else [n for n in given if n in now]
    st.save(agent, "conv.json", conv)
    return {"reply": "tools", "tools": conv["tools"][thread]}


# -- jobs


def op_job_put(st: Store, agent: list, req: dict) -> Json:
    place, job = want_place(req), want_job(req.get("job"))
    jobs = jobs_of(st, agent)
    jobs["places"][place][job["id"]] = job
    jobs["mark"] += place == "waiting"
    st.save(agent, "jobs.json", jobs)
    return {"reply": "done"}


def op_job_get(st: Store, agent: list, req: dict) -> Json:
    place, id = want_place(req), want_id(req.get("id"))
    return {"reply": "job", "job": jobs_of(st, agent)["places"][place].get(id)}


def op_job_remove(st: Store, agent: list, req: dict) -> Json:
    place, id = want_place(req), want_id(req.get("id"))
    jobs = jobs_of(st, agent)
    found = jobs["places"][place].pop(id, None) is not None
    jobs["mark"] += found and place == "waiting"
    st.save(agent, "jobs.json", jobs)
    return {"reply": "found", "found": found}


def op_job_list(st: Store, agent: list, req: dict) -> Json:
    return {"reply": "jobs", "jobs": list(jobs_of(st, agent)["places"][want_place(req)].values())}


def op_job_count(st: Store, agent: list, req: dict) -> Json:
    return {"reply": "count", "count": len(jobs_of(st, agent)["places"][want_place(req)])}


def op_job_shift(st: Store, agent: list, req: dict) -> Json:
    id, src, dst = want_id(req.get("id")), want_place(req, "from"), want_place(req, "to")
    jobs = jobs_of(st, agent)
    job = jobs["places"][src].get(id)
    if job is None:
        return {"reply": "found", "found": False}
    if BREAK == "double_shift":
        st.pause()
        jobs = jobs_of(st, agent)
    jobs["places"][src].pop(id, None)
    jobs["places"][dst][id] = job
    jobs["mark"] += "waiting" in (src, dst)
    st.save(agent, "jobs.json", jobs)
    return {"reply": "found", "found": True}


def op_job_next(st: Store, agent: list, req: dict) -> Json:
    dues = []
    for name in os.listdir(os.path.join(st.root, "agents")):
        try:
            with open(os.path.join(st.root, "agents", name, "jobs.json"), encoding="utf-8") as f:
                dues += [j["due"] for j in json.load(f)["places"]["waiting"].values()]
        except FileNotFoundError:
            pass
    return {"reply": "next", "next": min(dues) if dues else None}


def op_job_day(st: Store, agent: list, req: dict) -> Json:
    day, sent = jobs_of(st, agent)["day"]
    return {"reply": "day", "day": day, "sent": sent}


def op_job_set_day(st: Store, agent: list, req: dict) -> Json:
    day, sent = want_int(req, "day", 0), want_int(req, "sent", 0)
    jobs = jobs_of(st, agent)
    jobs["day"] = [day, sent]
    st.save(agent, "jobs.json", jobs)
    return {"reply": "done"}


def op_job_mark(st: Store, agent: list, req: dict) -> Json:
    return {"reply": "mark", "mark": jobs_of(st, agent)["mark"]}


# -- files


def new_version(st: Store, agent: list, old: int) -> int:
    if BREAK == "version_reuse":
        return old + 1
    meta = st.load(agent, "meta.json", {"next_version": 1})
    version = meta["next_version"]
    meta["next_version"] += 1
    st.save(agent, "meta.json", meta)
    return version


def op_file_read(st: Store, agent: list, req: dict) -> Json:
    path = want_path(req.get("path"))
    held = st.load(agent, file_name(path), None)
    return {"reply": "file", "file": None if held is None else {"data": held["data"], "version": held["version"]}}


def op_file_write(st: Store, agent: list, req: dict) -> Json:
    path, data, version = want_path(req.get("path")), want_data(req), want_int(req, "version", 0)
    held = st.load(agent, file_name(path), None)
    now = held["version"] if held else 0
    if version != now:
        return {"reply": "stale", "version": now}
    new = new_version(st, agent, now)
    st.save(agent, file_name(path), {"path": path, "data": base64.b64encode(data).decode(), "version": new})
    return {"reply": "wrote", "version": new}


def op_file_append(st: Store, agent: list, req: dict) -> Json:
    path, data = want_path(req.get("path")), want_data(req)
    held = st.load(agent, file_name(path), None)
    old = base64.b64decode(held["data"]) if held else b""
    if len(old) + len(data) > FILE_MAX:
        raise Refused("the file would pass 4 MiB")
    new = new_version(st, agent, held["version"] if held else 0)
    st.save(agent, file_name(path), {"path": path, "data": base64.b64encode(old + data).decode(), "version": new})
    return {"reply": "wrote", "version": new}


def op_file_remove(st: Store, agent: list, req: dict) -> Json:
    path, version = want_path(req.get("path")), want_int(req, "version", 0)
    held = st.load(agent, file_name(path), None)
    if held is None or held["version"] != version:
        return {"reply": "found", "found": False}
    st.drop(agent, file_name(path))
    return {"reply": "found", "found": True}


def op_file_list(st: Store, agent: list, req: dict) -> Json:
    prefix = want_path(req.get("folder"), folder=True) + "/"
    folder = os.path.join(st.folder(agent), "files")
    paths = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.endswith(".json"):
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                path = json.load(f)["path"]
            if path.startswith(prefix):
                paths.append(path)
    if len(paths) > FILES_MAX:
        raise Refused(f"more than {FILES_MAX} files under {prefix}")
    return {"reply": "files", "files": sorted(paths, key=_utf8_key)}


OPS: dict[str, tuple[str, Callable[[Store, list, dict], Json]]] = {
    name[3:]: (kind, fn)
    for kind, names in {
        "conversations": ("append", "read", "last", "threads", "remove", "take", "renew", "end", "leases"),
        "tools": ("tools_read", "tools_list", "tools_narrow"),
        "jobs": ("job_put", "job_get", "job_remove", "job_list", "job_count", "job_shift", "job_next", "job_day",
                 "job_set_day", "job_mark"),
        "files": ("file_read", "file_write", "file_append", "file_remove", "file_list"),
    }.items()
    for name in (f"op_{n}" for n in names)
    for fn in [globals()[name]]
}


def answer(raw: bytes) -> Json:
    """The reply to one request line; every failure is an error reply."""
    try:
        try:
            req = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
        except (UnicodeDecodeError, ValueError) as exc:
            raise Refused(f"not a JSON request: {exc}") from exc
        if not isinstance(req, dict):
            raise Refused("a request is a JSON object")
        op = req.get("op")
        if not isinstance(op, str) or op not in OPS:
            raise Refused(f"unknown op {op!r}")
        agent = want_agent(req)
        kind, fn = OPS[op]
        if kind not in KEEPS:
            raise Refused(f"this driver does not keep {kind}")
        root = os.environ.get("TOY_STORE_DIR")
        if not root:
            raise Refused("TOY_STORE_DIR is not set")
        with Store(root) as st:
            return fn(st, agent, req)
    except Refused as exc:
        return {"reply": "error", "error": str(exc)}


def emit(reply: Json) -> None:
    sys.stdout.write(json.dumps(reply, separators=(",", ":")) + "\n")
    sys.stdout.flush()


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write(USAGE)
        return 2
    command = argv[0]
    if command == "--version":
        print("toy-driver 1")
    elif command == "--help":
        print(USAGE, end="")
    elif command == "contract":
        lie = os.environ.get("TOY_CONTRACT")
        emit(
            json.loads(lie)
            if lie
            else {"version": 1, "serve": True, **{k: True for k in ("jobs", "files") if k in KEEPS}}
        )
    elif command == "call":
        if BREAK == "stdout_log":
            print("toy: answering one call")
        emit(answer(sys.stdin.buffer.read()))
    elif command == "serve":
        served = 0
        for line in sys.stdin.buffer:
            emit(answer(line.rstrip(b"\n")))
            served += 1
        if BREAK == "stdout_log":
            print(f"toy: served {served} requests")
    else:
        sys.stderr.write(USAGE)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

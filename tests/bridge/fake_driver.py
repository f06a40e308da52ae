#!/usr/bin/env python3
"""A stand-in store driver whose behaviour a test picks, to drive the bridge
through what real drivers rarely do: hang, die, answer junk, block on a gate.

Environment:
  FAKE_CONTRACT  the contract JSON it prints (default {"version": 1, "serve": true})
  FAKE_RECORD    a file to which every request received is appended as a JSON line
                 (pid, mode, op, agent, thread, store_dir): proof that a driver ran, or not
  FAKE_GATE      a path; a request for thread "gate" waits until this file exists,
                 one for "gate-x" until FAKE_GATE + "-x" exists

The request's "thread" picks the behaviour: "hang" never answers, "junk"
answers a line that is not JSON, "die" exits without answering, "error"
answers the driver's own error, "gate" waits for FAKE_GATE; anything else
answers {"reply": "done", "pid", "store_dir", "n"}.
"""

import json
import os
import sys
import time

COUNT = 0


def record(mode: str, request: object) -> None:
    path = os.environ.get("FAKE_RECORD")
    if not path:
        return
    req = request if isinstance(request, dict) else {}
    entry = {
        "pid": os.getpid(),
        "mode": mode,
        "op": req.get("op"),
        "agent": req.get("agent"),
        "thread": req.get("thread"),
        "store_dir": os.environ.get("LNK_STORE_DIR"),
    }
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
    finally:
        os.close(fd)


def answer(mode: str, line: bytes) -> None:
    global COUNT
    COUNT += 1
    try:
        request = json.loads(line)
    except ValueError:
        print(json.dumps({"reply": "error", "error": "not JSON"}), flush=True)
        return
    record(mode, request)
    thread = request.get("thread") if isinstance(request, dict) else None
    if thread == "hang":
        time.sleep(3600)
    elif thread == "die":
        os._exit(3)
    elif thread == "junk":
        print("this is not JSON", flush=True)
        return
    elif isinstance(thread, str) and thread.startswith("big-"):
        pad = "x" * int(thread[4:])  # "big-N": a reply line of N bytes and a little more
        print(json.dumps({"reply": "events", "events": [], "pad": pad}), flush=True)
        return
    elif thread == "error":
        print(json.dumps({"reply": "error", "error": "fake driver error"}), flush=True)
        return
    elif isinstance(thread, str) and thread.startswith("gate"):
        gate = os.environ["FAKE_GATE"] + thread[4:]  # "gate-x" waits for its own gate
        while not os.path.exists(gate):
            time.sleep(0.01)
    reply = {"reply": "done", "pid": os.getpid(), "store_dir": os.environ.get("LNK_STORE_DIR"), "n": COUNT}
    print(json.dumps(reply), flush=True)


def main() -> int:
    args = sys.argv[1:]
    if args == ["contract"]:
        print(os.environ.get("FAKE_CONTRACT", '{"version": 1, "serve": true}'))
        return 0
    if args == ["call"]:
        answer("call", sys.stdin.buffer.read())
        return 0
    if args == ["serve"]:
        for line in iter(sys.stdin.buffer.readline, b""):
            answer("serve", line)
        return 0
    print(f"usage: fake_driver.py contract|call|serve (not {args})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())

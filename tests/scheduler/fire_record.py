"""The tests' fire command: record when a firing starts and ends, in one shared file.

Usage: ``fire_record.py RECORD``.  Appends one JSON line at start and one at
end (the brief's ``<agent> <job id> <time>``, as JSON so that any owner or id
survives), each with ONE write on an O_APPEND descriptor so lines of several
fires at once never interleave.  ``ppid`` is the runner that fired it.  A spec
``{"sleep": S}`` makes the firing last S seconds (to kill a runner mid-fire,
or to outlast a lease's lapse); ``"sleep_recovered": S2`` makes a recovered
firing (``LNK_JOB_RECOVERED=1``) last S2 instead.  ``fence`` is the fire's
``LNK_JOB_FENCE`` (an integer; None when not set).
"""

import json
import os
import sys
import time


def record(path: str, event: str, **fields: object) -> None:
    line = json.dumps({"ev": event, "t": time.time(), **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def main() -> None:
    path = sys.argv[1]
    spec = json.loads(sys.stdin.read() or "null")
    who = {
        "owner": os.environ.get("LNK_OWNER"),  # None: not set, as for an agent without owner
        "agent": os.environ["LNK_AGENT_ID"],
        "job": os.environ["LNK_JOB_ID"],
        "due": json.loads(os.environ["LNK_JOB_DUE"]),
        "recovered": os.environ.get("LNK_JOB_RECOVERED") == "1",
        "fence": int(os.environ["LNK_JOB_FENCE"]) if "LNK_JOB_FENCE" in os.environ else None,
        "ppid": os.getppid(),
        "spec": spec,
    }
    record(path, "start", **who)
    if isinstance(spec, dict):
        sleep = spec.get("sleep_recovered") if who["recovered"] and "sleep_recovered" in spec else spec.get("sleep")
        if sleep:
            time.sleep(float(sleep))
    record(path, "end", **who)


if __name__ == "__main__":
    main()

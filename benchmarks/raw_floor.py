#!/usr/bin/env python3
"""The raw SDK replaying requests a driver made, round by round: the floor under a driver's read.

    python benchmarks/raw_floor.py moto|gcs serve      (run by cloud_round_trips.py; lines in, lines out)

``cloud_round_trips.py`` records, at its proxy, the requests one driver read
made (method and target) and the rounds they went in (``faults.rounds``:
a request is of round k+1 when it was sent after a request of round k was
answered).  This process, a fresh python like the driver's ``serve``
process, makes the raw SDK's client (boto3 / google-cloud-storage, with the
settings that change what is sent: no retries, no checksums, a pool of 32
connections), and then answers lines on stdin, one JSON object each:

    {"rounds": [[[method, target], ...], ...], "warm": false}

by sending each round's requests at once on a pool of 16 threads (the
driver's pool), waiting for all of them, then the next round; it writes one
line, ``{"requests": n, "bytes": b, "cpu_ms": c}`` (``bytes``: of the objects
read; ``cpu_ms``: this
process's CPU time over the rounds, every thread).  The first line it gets
replays the driver's warm-up (``"warm": true``), so its client and its
connections are as warm as the driver's: a request of the warm-up that is
no read (the server probe's writes) is sent as a one-key listing of the
bucket instead (the same connection opened, nothing written).  A read that
finds no object (404) is an answer, as it is to the driver.

Only reads are replayed: an object's GET (S3 path-style ``/bucket/key``,
GCS ``/download/storage/v1/b/B/o/NAME?alt=media``) and a listing page (S3
``list-type=2``, GCS ``/storage/v1/b/B/o?...``), each as one SDK call that
sends exactly that one request with the same parameters.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: The driver's pool for parallel reads (``store.space.Space.pool``).
POOL_THREADS = 16


def _query(target: str) -> tuple[str, dict[str, str]]:
    """(path, one value per query parameter) of a recorded target."""
    parts = urlsplit(target)
    return parts.path, {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}


def _listed(page: Iterable[Any]) -> int:
    """A listing page's items taken (as the driver takes them: every one made into an object); 0 bytes read."""
    list(page)
    return 0


class S3Replay:
    """Requests of moto's path-style S3 as boto3 calls, with the client the drivers' settings make."""

    def __init__(self) -> None:
        import boto3
        from botocore.config import Config

        options: dict[str, Any] = {"retries": {"total_max_attempts": 1, "mode": "standard"},
                                   "connect_timeout": 5, "read_timeout": 10, "max_pool_connections": 32}
        if "request_checksum_calculation" in Config.OPTION_DEFAULTS:
            options["request_checksum_calculation"] = "when_required"
        self.client = boto3.session.Session().client("s3", config=Config(**options))

    def call(self, method: str, target: str) -> Callable[[], int]:
        """One request as a call that sends it and answers the object bytes it got (0 for a listing)."""
        path, query = _query(target)
        bucket, _, key = path.lstrip("/").partition("/")
        if method == "GET" and query.get("list-type") == "2" and not key:
            args = {"Bucket": bucket, "Prefix": query.get("prefix", "")}
            for name, arg in (("max-keys", "MaxKeys"), ("start-after", "StartAfter"),
                              ("continuation-token", "ContinuationToken"), ("delimiter", "Delimiter")):
                if name in query:
                    args[arg] = int(query[name]) if arg == "MaxKeys" else query[name]
            return lambda: _listed(self.client.list_objects_v2(**args).get("Contents", []))
        if method == "GET" and key and not query:
            return lambda: len(self.client.get_object(Bucket=bucket, Key=unquote(key))["Body"].read())
        raise ValueError(f"not a read this replay knows: {method} {target}")

    def stand_in(self, method: str, target: str) -> Callable[[], int]:
        """A read in place of a warm-up's write: a one-key listing of its bucket."""
        bucket = _query(target)[0].lstrip("/").split("/", 1)[0]
        return lambda: _listed(self.client.list_objects_v2(Bucket=bucket, MaxKeys=1).get("Contents", []))

    def missing(self, exc: Exception) -> bool:
        return getattr(exc, "response", {}).get("Error", {}).get("Code") in ("NoSuchKey", "404")


class GCSReplay:
    """Requests of GCS's JSON API as google-cloud-storage calls, with the client the driver makes."""

    def __init__(self) -> None:
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage
        from requests.adapters import HTTPAdapter

        self.client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT", "test"),
                                     credentials=AnonymousCredentials())
        adapter = HTTPAdapter(pool_connections=4, pool_maxsize=32, max_retries=0)
        self.client._http.mount("http://", adapter)
        self.client._http.mount("https://", adapter)
        if getattr(self.client, "_bucket_metadata_cache", None) is not None:
            self.client._bucket_metadata_cache = None  # as the driver: no bucket-metadata read in the background

    def call(self, method: str, target: str) -> Callable[[], int]:
        """One request as a call that sends it and answers the object bytes it got (0 for a listing)."""
        path, query = _query(target)
        download = "/download/storage/v1/b/"
        if method == "GET" and path.startswith(download) and query.get("alt") == "media":
            bucket, _, name = path[len(download):].partition("/o/")
            blob = self.client.bucket(unquote(bucket)).blob(unquote(name))
            return lambda: len(blob.download_as_bytes(retry=None, checksum=None))
        if method == "GET" and path.startswith("/storage/v1/b/") and path.endswith("/o"):
            bucket = unquote(path[len("/storage/v1/b/"):-len("/o")])
            args: dict[str, Any] = {"prefix": query.get("prefix"), "retry": None, "fields": query.get("fields")}
            for name, arg in (("maxResults", "max_results"), ("startOffset", "start_offset"),
                              ("delimiter", "delimiter"), ("pageToken", "page_token")):
                if name in query:
                    args[arg] = int(query[name]) if arg == "max_results" else query[name]

            return lambda: _listed(next(iter(self.client.list_blobs(bucket, **args).pages)))
        raise ValueError(f"not a read this replay knows: {method} {target}")

    def stand_in(self, method: str, target: str) -> Callable[[], int]:
        """A read in place of a warm-up's write: a one-key listing of its bucket."""
        path, query = _query(target)
        bucket = unquote(path.split("/b/", 1)[1].split("/", 1)[0]) if "/b/" in path else query.get("bucket", "")
        return lambda: _listed(next(iter(self.client.list_blobs(bucket, max_results=1, retry=None).pages)))

    def missing(self, exc: Exception) -> bool:
        return getattr(exc, "code", None) == 404


def _calls(replay: S3Replay | GCSReplay, round_: list[list[str]], warm: bool) -> list[Callable[[], int]]:
    """A round's requests as calls; in a warm-up, a write stands in as a listing."""
    calls = []
    for method, target in round_:
        if warm and method not in ("GET", "HEAD"):
            calls.append(replay.stand_in(method, target))
        else:
            calls.append(_absent_is_an_answer(replay, replay.call(method, target)))
    return calls


def _absent_is_an_answer(replay: S3Replay | GCSReplay, call: Callable[[], int]) -> Callable[[], int]:
    """A read that finds no object (404) answered 0 bytes, as the driver takes it: a block not packed
    yet is asked for, found absent, and read as its halves in the next round."""
    def run() -> int:
        try:
            return call()
        except Exception as exc:  # noqa: BLE001 - only a 404 is an answer; anything else is raised
            if replay.missing(exc):
                return 0
            raise
    return run


def replay_rounds(replay: S3Replay | GCSReplay, pool: ThreadPoolExecutor, rounds: list[list[list[str]]],
                  warm: bool) -> dict[str, Any]:
    """Every round's requests at once on ``pool``, round after round; what came back, and the CPU it took.

    The calls are built before the clock starts (parsing a recorded target is
    the benchmark's work, not the SDK's); building each SDK request is not.
    """
    planned = [_calls(replay, r, warm) for r in rounds]
    cpu = time.process_time()
    got = 0
    for calls in planned:
        got += sum(_at_once(pool, calls))
    return {"requests": sum(len(r) for r in rounds), "bytes": got,
            "cpu_ms": round((time.process_time() - cpu) * 1000, 2)}


def _at_once(pool: ThreadPoolExecutor, calls: list[Callable[[], int]]) -> list[int]:
    """All of ``calls`` at once: all but the last on ``pool``, the last here (as the driver's ``at_once``)."""
    futures = [pool.submit(call) for call in calls[:-1]]
    last = calls[-1]() if calls else None
    return [f.result() for f in futures] + ([] if last is None else [last])


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("moto", "gcs") or argv[1] != "serve":
        print("usage: raw_floor.py moto|gcs serve", file=sys.stderr)
        return 2
    replay: S3Replay | GCSReplay = S3Replay() if argv[0] == "moto" else GCSReplay()
    with ThreadPoolExecutor(max_workers=POOL_THREADS) as pool:
        for line in sys.stdin:
            plan = json.loads(line)
            try:
                reply = replay_rounds(replay, pool, plan["rounds"], bool(plan.get("warm")))
            except Exception as exc:  # noqa: BLE001 - the benchmark reports it
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            sys.stdout.write(json.dumps(reply) + "\n")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

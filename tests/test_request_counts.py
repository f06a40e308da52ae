"""Issue 45: every headline cost guarded by a deterministic test, on every backend.

Requests and sequential rounds, counted at a proxy in front of each emulator
(moto, fake-gcs-server, SeaweedFS where installed), never timed; on a local
folder, which has no wire, by the driver's own counts (tests/request_counts.py
says how each figure is counted).  ``BOUNDS`` is the one table of them; a
change that makes a figure worse fails here, and each guard is shown to fail
with a deliberately worse driver or runner (tests/worse/sitecustomize.py, the
meta-tests at the end, on moto).  Timings stay in benchmarks/.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from emulators import Emulator
from faults.http_proxy import FaultProxy
from request_counts import (
    CONVERSATIONS,
    ENDPOINT,
    FILES_AGENT,
    FIRST_DUE,
    FOLDER,
    KIND,
    READ_HOLD,
    STEADY,
    WRITER,
    Cost,
    Place,
    appends,
    files_of,
    fresh,
    scheduler,
    start_fill,
    store_of,
)
from support import SEAWEEDFS, make_store

# --------------------------------------------------------------------------
# The headline costs.  Each bound is documented in docs/design.md ("Headline request counts"); raising one
# needs a line there saying why.  (most requests, most rounds) per figure and kind of store ("*": every
# kind); a mean may be fractional; rounds None: not a figure of rounds (or, on the folder, not counted).

ANY = "*"
APPEND_ONE = "append, one (the process trusts its memory)"
APPEND_MEAN = "append, mean of 2,048 by one serve process, packing included"
LAST = "last of 1,000 events, fresh process"
READ_ALL_FIRST = "read 1..1,000, the first fresh process after the appends"
READ_ALL_LATER = "read 1..1,000, a later fresh process"
READ_ALL_WAITING = "read 1..1,000, a later fresh process, its listing slow: requests that wait for the listing"
READ_TAIL_FIRST = "read 991..1,000 (the last 10), the first fresh process after the appends"
READ_TAIL_LATER = "read 991..1,000 (the last 10), a later fresh process"
JOB_NEXT = "job_next with 10,000 jobs waiting (fake-gcs-server: 1,000), fresh process"
FILE_LIST = "file_list of 4,096 files and 4,096 removed (fake-gcs-server: 512 and 512), fresh process"
IDLE_POLL = "scheduler idle, per poll"
FIRED_JOB = "scheduler, one job fired (/bin/true), claim to finish"

BOUNDS: dict[tuple[str, str], tuple[float, float | None]] = {
    # figure                   store      requests  rounds
    (APPEND_ONE,               ANY):      (1,       1),
    (APPEND_MEAN,              ANY):      (1.1,     None),
    (LAST,                     ANY):      (2,       1),
    (READ_ALL_FIRST,           ANY):      (17,      3),
    (READ_ALL_LATER,           ANY):      (8,       2),
    (READ_ALL_WAITING,         ANY):      (5,       None),
    (READ_TAIL_FIRST,          ANY):      (13,      3),
    (READ_TAIL_LATER,          ANY):      (4,       2),
    (JOB_NEXT,                 ANY):      (2,       2),
    (FILE_LIST,                "s3"):     (11,      9),
    (FILE_LIST,                "gcs"):    (3,       1),
    (FILE_LIST,                "file"):   (3,       None),
    (IDLE_POLL,                ANY):      (1,       1),
    (FIRED_JOB,                ANY):      (10,      8),
}  # fmt: skip


def bound(figure: str, kind: str) -> tuple[float, float | None]:
    """The bound of ``figure`` on a store of ``kind``: its own row, else the row for every kind."""
    return BOUNDS.get((figure, kind)) or BOUNDS[(figure, ANY)]


def violations(figure: str, kind: str, cost: Cost) -> list[str]:
    """What of ``cost`` is past ``figure``'s bound on ``kind``: one line each, none when within."""
    most_requests, most_rounds = bound(figure, kind)
    found = []
    if cost.requests > most_requests:
        found.append(f"{figure} on {kind}: {cost.requests:g} requests, at most {most_requests:g}")
    if most_rounds is not None and cost.rounds is not None and cost.rounds > most_rounds:
        found.append(f"{figure} on {kind}: {cost.rounds:g} rounds, at most {most_rounds:g}")
    return found


def guard(figure: str, place: Place, cost: Cost) -> None:
    """Fail naming every bound ``cost`` is past; rounds are counted wherever there is a wire."""
    assert place.proxy is None or bound(figure, place.kind)[1] is None or cost.rounds is not None, (
        f"{figure}: rounds were not counted")
    found = violations(figure, place.kind, cost)
    assert not found, "; ".join(found) + " (raising a bound needs a line in docs/design.md saying why)"


# --------------------------------------------------------------------------
# One place per backend, filled once: its big index and folder fill in processes of their own, all backends
# at once, from the first test on (tests/request_counts.py).

#: In the order their fills end (all start at once): the folder's and fake-gcs-server's (a tenth) are quick,
#: moto's (one Python process serving all 18,000 writes) the slowest.
COUNTED = ("file", "gcs", SEAWEEDFS, "moto")


@pytest.fixture(scope="module")
def places(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Place]]:
    """Every backend this run measures (the module's selected tests say which), each fill started at once."""
    wanted = {item.callspec.params["place"] for item in request.session.items
              if item.module is request.module and "place" in getattr(getattr(item, "callspec", None), "params", {})}
    opened: dict[str, Place] = {}
    try:
        for backend in (b for b in COUNTED if b in wanted):
            opened[backend] = open_place(backend, request, tmp_path_factory)
            opened[backend].filling = start_fill(opened[backend])
        yield opened
    finally:
        for place in opened.values():
            if place.filling is not None and place.filling.poll() is None:
                place.filling.kill()
                place.filling.wait()
            if place.proxy is not None:
                place.proxy.stop()


def open_place(backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Place:
    """Three stores of their own (buckets of their own on an emulator), and a proxy in front of the emulator."""
    proxy = None
    if backend != "file":
        fixture = {"gcs": "gcs_server", "moto": "moto_server", SEAWEEDFS: "seaweed_server"}[backend]
        emulator: Emulator = request.getfixturevalue(fixture)
        proxy = FaultProxy(emulator.env[ENDPOINT[backend]], flavor="gcs" if backend == "gcs" else "s3").start()
    stores = [store_of(make_store(backend, request, tmp_path_factory, own_bucket=True), proxy) for _ in range(3)]
    return Place(backend, *stores, proxy=proxy, scratch=tmp_path_factory.mktemp(f"counts-{backend}"))


@pytest.fixture(scope="module", params=COUNTED)
def place(request: pytest.FixtureRequest, places: dict[str, Place]) -> Place:
    return places[request.param]


@pytest.fixture(scope="module")
def filled(place: Place) -> Place:
    """``place`` once its index and folder are filled."""
    assert place.filling is not None
    code = place.filling.wait(timeout=900)
    assert code == 0, (place.scratch / "fill.log").read_text()[-3000:]
    return place


# --------------------------------------------------------------------------
# The figures, measured once per backend


@pytest.fixture(scope="module")
def appended(place: Place) -> tuple[Cost, Cost]:
    """The 2,048 appends (which write the conversations the reads then read)."""
    return appends(place)


def read(place: Place, thread: str, first: int, worse: str | None = None) -> Cost:
    """A fresh process's read of ``thread`` from ``first``: it answers every event from there."""
    reply, driver = fresh(place, place.conversations, {"op": "read", "agent": WRITER, "thread": thread,
                                                       "first": first}, worse, hold=READ_HOLD)
    assert [e["seq"] for e in reply["events"]] == list(range(first, dict(CONVERSATIONS)[thread] + 1))
    return driver.cost("read")


def waiting(place: Place, worse: str | None = None) -> Cost | None:
    """How many of a fresh read of 1..1,000's requests wait for its listing, the listing slower than the
    rest (as on a big bucket); None on the folder, which has no wire to tell."""
    if place.proxy is None:
        return None
    reply, driver = fresh(place, place.conversations, {"op": "read", "agent": WRITER, "thread": "all", "first": 1},
                          worse, slow_listing=True)
    assert len(reply["events"]) == 1000
    after = driver.after_listing()
    assert after is not None
    return Cost(after, None)


@pytest.fixture(scope="module")
def reads(place: Place, appended: tuple[Cost, Cost]) -> dict[str, Cost | None]:
    """Each read, first the first fresh process after the appends, then a later one (in that order); then
    what of a later one waits for its listing."""
    costs: dict[str, Cost | None] = {
        figure: read(place, thread, first) for figure, thread, first in (
            (READ_ALL_FIRST, "all", 1), (READ_ALL_LATER, "all", 1),
            (READ_TAIL_FIRST, "tail", 991), (READ_TAIL_LATER, "tail", 991))}
    costs[READ_ALL_WAITING] = waiting(place)
    return costs


def last(place: Place, worse: str | None = None) -> Cost:
    reply, driver = fresh(place, place.conversations, {"op": "last", "agent": WRITER, "thread": "all"}, worse)
    assert reply == {"reply": "last", "last": 1000}
    return driver.cost("last")


def job_next(place: Place, worse: str | None = None) -> Cost:
    """The soonest due of the index's jobs (a real job's, put by the driver)."""
    reply, driver = fresh(place, place.index, {"op": "job_next", "agent": WRITER}, worse)
    assert reply == {"reply": "next", "next": FIRST_DUE}
    return driver.cost("job_next")


def file_list(place: Place, worse: str | None = None) -> Cost:
    """Every live file and no tombstone, as test_file_list_cost.py's fill made them."""
    reply, driver = fresh(place, place.files, {"op": "file_list", "agent": FILES_AGENT, "folder": FOLDER}, worse)
    assert reply["files"] == sorted(files_of("live", place.sizes.files), key=lambda p: p.encode())
    return driver.cost("file_list")


@pytest.fixture(scope="module")
def scheduled(place: Place) -> tuple[Cost | None, Cost | None]:
    """An idle runner's polls, then one job it fires."""
    return scheduler(place)


# --------------------------------------------------------------------------
# The guards


def test_an_append_is_one_request_and_2048_cost_at_most_a_tenth_more_each(place: Place,
                                                                          appended: tuple[Cost, Cost]) -> None:
    one, mean = appended
    guard(APPEND_ONE, place, one)
    guard(APPEND_MEAN, place, mean)


def test_reads_of_1000_and_of_the_last_10_from_fresh_processes(place: Place, reads: dict[str, Cost | None]) -> None:
    """Also how many of a long read's requests wait for its listing: the blocks up to the head's hint do
    not (they are asked for as soon as the head is in)."""
    for figure, cost in reads.items():
        if cost is None:  # what waits for a listing: the folder has no wire to tell
            assert place.proxy is None, figure
            continue
        guard(figure, place, cost)


@pytest.mark.usefixtures("reads")  # after the reads: they must be the first fresh processes after the appends
def test_last_is_two_requests_in_one_round(place: Place) -> None:
    guard(LAST, place, last(place))


def test_an_idle_runner_polls_with_one_request_and_a_fired_job_costs_ten(
        place: Place, scheduled: tuple[Cost | None, Cost | None]) -> None:
    idle, fired = scheduled
    assert idle is not None and fired is not None
    guard(IDLE_POLL, place, idle)
    guard(FIRED_JOB, place, fired)


def test_job_next_among_10000_jobs_is_one_listing_and_one_read(filled: Place) -> None:
    guard(JOB_NEXT, filled, job_next(filled))


def test_file_list_of_a_full_folder_costs_its_listing_pages_and_the_ledger(filled: Place) -> None:
    guard(FILE_LIST, filled, file_list(filled))


def design_table() -> dict[str, list[tuple[float, float | None] | None]]:
    """docs/design.md's table of the bounds: per figure, its S3, GCS and folder cells (None: "-")."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "design.md").read_text()
    header = "| figure | S3 (moto, SeaweedFS) | GCS (fake-gcs-server) | folder | why |"
    rows = text[text.index(header):].split("\n\n")[0].splitlines()[2:]
    table: dict[str, list[tuple[float, float | None] | None]] = {}
    for row in rows:
        figure, *cells, _ = [cell.strip() for cell in row.strip("|").split("|")]
        table[figure] = [None if cell == "-" else cell_bound(cell) for cell in cells]
    return table


def cell_bound(cell: str) -> tuple[float, float | None]:
    requests, _, rounds = cell.partition(" / ")
    return float(requests), float(rounds) if rounds else None


def test_no_bound_is_past_what_docs_design_says() -> None:
    """Raising a bound means saying so in docs/design.md: every figure of ``BOUNDS`` is in its table, and no
    bound is past the table's (the folder's cells have no rounds: it does not count them).  Lowering one
    needs the table alone."""
    documented = design_table()
    assert set(documented) == {figure for figure, _ in BOUNDS}
    for figure, cells in documented.items():
        for kind, cell in zip(("s3", "gcs", "file"), cells, strict=True):
            if cell is None:
                continue
            most_requests, most_rounds = bound(figure, kind)
            said_requests, said_rounds = cell
            assert most_requests <= said_requests, (figure, kind, "requests", most_requests, said_requests)
            if kind != "file":
                assert (most_rounds is None) == (said_rounds is None), (figure, kind, "rounds", cell)
                assert most_rounds is None or said_rounds is None or most_rounds <= said_rounds, (
                    figure, kind, "rounds", most_rounds, said_rounds)


# --------------------------------------------------------------------------
# Each guard fails with a worse driver or runner (tests/worse/sitecustomize.py): the guard's own
# measurement with LNK_TEST_WORSE set, and its check reporting the figure.  On moto only: the variants
# are above the seam, the same on every backend (conftest.py's lists keep the other runs out).

GUARDS = frozenset(name for name in globals() if name.startswith("test_"))  # the guards above
GCS_TESTS = SEAWEEDFS_TESTS = FOLDER_TESTS = GUARDS


def caught(figure: str, cost: Cost | None) -> None:
    """The guard's check reports ``figure`` for ``cost`` (a variant's, measured on moto)."""
    assert cost is not None and violations(figure, KIND["moto"], cost), (figure, cost)


def test_packing_from_8_fails_the_append_mean_and_no_memory_the_single_append(place: Place) -> None:
    caught(APPEND_MEAN, appends(place, "pack-from-8", prefix="from-8-")[1])
    caught(APPEND_ONE, appends(place, "no-memory", prefix="no-memory-", conversations=(("all", max(STEADY)),))[0])


@pytest.mark.usefixtures("reads")  # the guards' own reads first: each must be the first after the appends
def test_reads_that_ignore_the_big_blocks_or_every_block_or_the_tail_fail_the_read_figures(place: Place) -> None:
    """After the guards' own reads (the tails are written): the last 10 fetched one by one but for the
    tail; 1..1,000 from blocks of 32 only (one by one would be 1,000 requests: the variant that fails there
    at least cost); 1..1,000 never asking for the tail (the 8 events after block 992 one by one)."""
    for figures, thread, first, worse in (
            ((READ_TAIL_LATER,), "tail", 991, "no-blocks"),
            ((READ_ALL_FIRST, READ_ALL_LATER), "all", 1, "small-blocks-only"),
            ((READ_ALL_LATER,), "all", 1, "no-tail")):
        cost = read(place, thread, first, worse)
        for figure in figures:
            caught(figure, cost)


@pytest.mark.usefixtures("reads")
def test_a_read_that_ignores_the_heads_hint_waits_for_its_listing(place: Place) -> None:
    """No read-ahead: the blocks the head names as packed are asked for only once the listing is in.  (Its
    requests and rounds are those of a read with it: what it costs is the wait for a slow listing.)"""
    caught(READ_ALL_WAITING, waiting(place, "no-prefetch"))  # the tail is written: 6 wait, not 5


@pytest.mark.usefixtures("reads")
def test_a_last_that_lists_the_whole_conversation_fails(place: Place) -> None:
    caught(LAST, last(place, "last-lists-all"))


def test_a_job_next_that_reads_every_listed_record_fails(filled: Place) -> None:
    caught(JOB_NEXT, job_next(filled, "job-next-reads-records"))


def test_a_file_list_reading_its_ledger_after_the_listing_fails(filled: Place) -> None:
    caught(FILE_LIST, file_list(filled, "file-list-ledger-after"))


@pytest.mark.usefixtures("scheduled")  # the guard's own runner first
def test_a_poll_that_asks_the_marks_and_a_claim_that_reads_back_fail(place: Place) -> None:
    caught(IDLE_POLL, scheduler(place, "idle-poll-reads-marks", fired=False)[0])
    caught(FIRED_JOB, scheduler(place, "claim-reads-back", idle=False)[1])

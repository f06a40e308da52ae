"""Family ``check_files``: an agent's files by path, their versions, limits and races.

Data is compared as the exact base64 string: standard base64 with padding
has one spelling per byte string, so a driver answering anything else (no
padding, URL-safe letters, newlines) is caught along with wrong bytes.
"""

from __future__ import annotations

import base64
import os

from .expect import Json, expect, expect_error, expect_that, is_int
from .harness import CheckSet, Ctx
from .race import race, spread
from .rules import Sample, discipline_checks, expect_refused, malformed_cases
from .values import utf8_sorted

checks = CheckSet("check_files")
not_kept = CheckSet("check_files")

FILE_MAX = 4 * 1024 * 1024
FILES_MAX = 4096
VERSION_MAX = 2**53 - 1


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def request(agent: dict[str, Json], op: str, **fields: Json) -> dict[str, Json]:
    return {"op": op, "agent": agent, **fields}


def version_of(reply: Json, kind: str, what: str) -> int:
    """The version in a ``wrote``/``stale`` reply, checking the reply's exact shape."""
    ok = (isinstance(reply, dict) and set(reply) == {"reply", "version"} and reply["reply"] == kind
          and is_int(reply["version"]) and (0 if kind == "stale" else 1) <= reply["version"] <= VERSION_MAX)
    expect_that(ok, what, f'<{{"reply":"{kind}","version":<integer{" >= 1" if kind == "wrote" else ""}>}}>', reply)
    return reply["version"]


def write(ctx: Ctx, a: dict[str, Json], path: str, data: bytes, version: int) -> int:
    """file_write that must succeed; its new version."""
    reply = ctx.ask(a, "file_write", path=path, data=b64(data), version=version)
    return version_of(reply, "wrote", f"file_write {path!r} at version {version}")


def appended(ctx: Ctx, a: dict[str, Json], path: str, data: bytes) -> int:
    reply = ctx.ask(a, "file_append", path=path, data=b64(data))
    return version_of(reply, "wrote", f"file_append to {path!r}")


def stale(version: int) -> dict[str, Json]:
    return {"reply": "stale", "version": version}


def found(yes: bool) -> dict[str, Json]:
    return {"reply": "found", "found": yes}


def holding(data: bytes, version: int) -> dict[str, Json]:
    return {"reply": "file", "file": {"data": b64(data), "version": version}}


NONE = {"reply": "file", "file": None}


def files(paths: list[str]) -> dict[str, Json]:
    return {"reply": "files", "files": paths}


def snapshot(ctx: Ctx, a: dict[str, Json], also: tuple[str, ...] = ()) -> Json:
    """Every file of the agent, listed and read, plus ``also`` (paths a wrong driver might write)."""
    state: dict[str, Json] = {}
    for folder in ("skills/", "instructions/"):
        reply = ctx.ask(a, "file_list", folder=folder)
        state[folder] = reply
        for path in reply.get("files") or []:
            state[path] = ctx.ask(a, "file_read", path=path)
    for path in also:
        state[path] = ctx.ask(a, "file_read", path=path)
    return state


# -- the operations


@checks.check
def write_read(ctx: Ctx) -> None:
    """file_write writes only at the version given (0: none), answering the new version or stale with the one now."""
    a, p = ctx.agent(), "skills/greet/SKILL.md"
    expect(ctx.ask(a, "file_read", path=p), NONE, "file_read of a file never written")
    v1 = write(ctx, a, p, b"# Greet\n", 0)
    expect(ctx.ask(a, "file_read", path=p), holding(b"# Greet\n", v1), "file_read after writing")
    v2 = write(ctx, a, p, b"# Greet v2\n", v1)
    expect_that(v2 != v1, "the version after a second write", f"<not {v1}>", v2)
    expect(ctx.ask(a, "file_write", path=p, data=b64(b"late"), version=v1), stale(v2), "file_write at the old version")
    expect(ctx.ask(a, "file_write", path=p, data=b64(b"late"), version=0), stale(v2), "file_write at 0 onto a file")
    expect(ctx.ask(a, "file_read", path=p), holding(b"# Greet v2\n", v2), "file_read after stale writes")
    q = "skills/greet/missing.md"
    expect(
        ctx.ask(a, "file_write", path=q, data=b64(b"x"), version=v2), stale(0), "file_write at a version onto no file"
    )
    expect(ctx.ask(a, "file_read", path=q), NONE, "file_read after a stale write onto no file")
    v3 = write(ctx, a, p, b"", v2)
    expect(ctx.ask(a, "file_read", path=p), holding(b"", v3), "file_read of a file written empty")
    i = "instructions/instruction.md"
    vi = write(ctx, a, i, b"Be kind.", 0)
    expect(ctx.ask(a, "file_read", path=i), holding(b"Be kind.", vi), "file_read of an instructions file")


@checks.check
def binary_data(ctx: Ctx) -> None:
    """Every byte value, and random bytes, come back exactly, as standard padded base64."""
    a = ctx.agent()
    for n, data in enumerate((bytes(range(256)) * 4, os.urandom(10_001), os.urandom(10_002), b"\x00", b"\xff\xfe")):
        p = f"skills/bin/{n}"
        v = write(ctx, a, p, data, 0)
        expect(ctx.ask(a, "file_read", path=p), holding(data, v), f"file_read of {len(data)} binary bytes")


@checks.check
def remove(ctx: Ctx) -> None:
    """file_remove removes only at the file's version now, answering whether it did."""
    a, p = ctx.agent(), "skills/x/doomed.md"
    v = write(ctx, a, p, b"bye", 0)
    write(ctx, a, "skills/x/kept.md", b"stay", 0)
    for wrong in (0, v + 1):
        expect(ctx.ask(a, "file_remove", path=p, version=wrong), found(False), f"file_remove at version {wrong}")
    expect(ctx.ask(a, "file_read", path=p), holding(b"bye", v), "file_read after removals at wrong versions")
    expect(ctx.ask(a, "file_remove", path=p, version=v), found(True), "file_remove at its version")
    expect(ctx.ask(a, "file_read", path=p), NONE, "file_read after file_remove")
    expect(ctx.ask(a, "file_remove", path=p, version=v), found(False), "file_remove again")
    expect(ctx.ask(a, "file_list", folder="skills/"), files(["skills/x/kept.md"]), "file_list after file_remove")
    expect(
        ctx.ask(a, "file_remove", path="skills/never", version=0), found(False), "file_remove of a file never written"
    )


@checks.check
def versions_never_return(ctx: Ctx) -> None:
    """A file made again after its removal, with the same bytes or not, never gets a version it had before."""
    a, p = ctx.agent(), "skills/again/SKILL.md"
    seen: list[int] = []

    def fresh(v: int, how: str) -> int:
        expect_that(v not in seen, f"the version {how}", f"<none of {seen}>", v)
        seen.append(v)
        return v

    v = fresh(write(ctx, a, p, b"same", 0), "of the first write")
    for cycle in range(3):
        expect(ctx.ask(a, "file_remove", path=p, version=v), found(True), f"cycle {cycle}: file_remove")
        v = fresh(write(ctx, a, p, b"same", 0), f"after removal and re-creation with the same bytes (cycle {cycle})")
        expect(ctx.ask(a, "file_write", path=p, data=b64(b"late"), version=seen[-2]), stale(v),
               f"cycle {cycle}: file_write at the version from before the removal")
        expect(ctx.ask(a, "file_remove", path=p, version=seen[-2]), found(False),
               f"cycle {cycle}: file_remove at the version from before the removal")
    v = fresh(write(ctx, a, p, b"same", v), "after rewriting the same bytes")
    expect(ctx.ask(a, "file_remove", path=p, version=v), found(True), "file_remove")
    v = fresh(appended(ctx, a, p, b"same"), "of a file made again by file_append")
    expect(ctx.ask(a, "file_read", path=p), holding(b"same", v), "file_read at the end")


@checks.check
def append(ctx: Ctx) -> None:
    """file_append makes a missing file and adds at the end, each time with a new version."""
    a, p = ctx.agent(), "instructions/log.md"
    v1 = appended(ctx, a, p, b"one\n")
    expect(ctx.ask(a, "file_read", path=p), holding(b"one\n", v1), "file_read after appending to no file")
    v2 = appended(ctx, a, p, b"two\n")
    expect_that(v2 != v1, "the version after a second append", f"<not {v1}>", v2)
    expect(ctx.ask(a, "file_read", path=p), holding(b"one\ntwo\n", v2), "file_read after two appends")
    v3 = write(ctx, a, p, b"reset", v2)
    v4 = appended(ctx, a, p, bytes(range(256)))
    expect_that(v4 not in (v1, v2, v3), "the version after append", f"<none of {[v1, v2, v3]}>", v4)
    expect(
        ctx.ask(a, "file_read", path=p), holding(b"reset" + bytes(range(256)), v4), "file_read after write and append"
    )


@checks.check
def list_files(ctx: Ctx) -> None:
    """file_list answers every path under a folder at any depth, sorted by UTF-8 bytes, `skills` same as `skills/`."""
    a = ctx.agent()
    skills = ["skills/a/SKILL.md", "skills/a-b", "skills/a.b", "skills/a/b/c/d.md", "skills/Z", "skills/é",
              "skills/\uff5e", "skills/\U0001F600", "skills/bb/x", "skills/b/x", "skills/b/y/z"]
    instructions = ["instructions/instruction.md", "instructions/more/x.md"]
    expect(ctx.ask(a, "file_list", folder="skills/"), files([]), "file_list of an agent without files")
    for p in skills + instructions:
        write(ctx, a, p, p.encode(), 0)
    for folder in ("skills/", "skills"):
        expect(ctx.ask(a, "file_list", folder=folder), files(utf8_sorted(skills)), f"file_list {folder!r}")
    for folder in ("skills/b/", "skills/b"):
        expect(ctx.ask(a, "file_list", folder=folder), files(["skills/b/x", "skills/b/y/z"]),
               f"file_list {folder!r} (not skills/bb/)")
    expect(ctx.ask(a, "file_list", folder="instructions"), files(instructions), "file_list instructions")
    expect(ctx.ask(a, "file_list", folder="skills/none/"), files([]), "file_list of a folder without files")


@checks.check
def paths_within_limits(ctx: Ctx) -> None:
    """Paths up to 1,024 bytes with any parts but empty, . and .. (spaces, %, newline, unicode, deep) are kept
    exactly."""
    a = ctx.agent()
    paths = [
        "skills/" + "a" * 1017, "skills/" + "é" * 508 + "b", "skills/a b/%2F/x", "skills/..a/.b/a..",
        "skills/日本/🎉", "skills/" + "/".join(["d"] * 300), "skills/line\nbreak", "skills/tab\there",
        "skills/back\\slash", "skills/q?x#y&z=1", "skills/.hidden", "skills/x.", "skills/%00", "instructions/+ =",
    ]
    for p in paths:
        v = write(ctx, a, p, p.encode(), 0)
        expect(
            ctx.ask(a, "file_read", path=p), holding(p.encode(), v), f"file_read {p[:40]!r} ({len(p.encode())} bytes)"
        )
    listed = [p for p in paths if p.startswith("skills/")]
    expect(ctx.ask(a, "file_list", folder="skills/"), files(utf8_sorted(listed)), "file_list skills/")


@checks.check
def file_beside_folder(ctx: Ctx) -> None:
    """A file and a folder of one name are two things: each is written, read, listed and removed on its own,
    made in either order, and after the folder's last file was removed.

    Servers whose keys are paths (MinIO, SeaweedFS) keep a folder as a
    directory: an object `K` beside objects under `K/` is refused there (412
    to `If-None-Match: *` while any `K/...` exists or ever did), so a driver
    that puts a file's path straight into its key fails here.
    """
    a = ctx.agent()
    # the folder first, then a file of its name
    inner, outer = "skills/dual/inner.md", "skills/dual"
    vi = write(ctx, a, inner, b"inner", 0)
    vo = write(ctx, a, outer, b"outer", 0)
    expect(ctx.ask(a, "file_read", path=outer), holding(b"outer", vo), "file_read of a file beside a folder")
    expect(ctx.ask(a, "file_read", path=inner), holding(b"inner", vi), "file_read in a folder beside a file")
    # a file first, then a folder of its name, two deep
    solo, deep = "skills/solo", "skills/solo/deeper/x.md"
    vs = write(ctx, a, solo, b"solo", 0)
    vd = write(ctx, a, deep, b"deep", 0)
    vs2 = write(ctx, a, solo, b"solo 2", vs)
    expect(ctx.ask(a, "file_read", path=solo), holding(b"solo 2", vs2), "file_read of a file rewritten beside a folder")
    expect(ctx.ask(a, "file_read", path=deep), holding(b"deep", vd), "file_read in a folder made beside a file")
    expect(ctx.ask(a, "file_list", folder="skills/"), files(utf8_sorted([inner, outer, solo, deep])),
           "file_list of files beside folders of their names")
    for folder, want in (("skills/dual/", [inner]), ("skills/dual", [inner]), ("skills/solo/", [deep])):
        expect(ctx.ask(a, "file_list", folder=folder), files(want), f"file_list {folder!r} (not the file of its name)")
    # the folder's last file removed, then a file of its name, then the folder again
    gone, gone_inner = "skills/gone", "skills/gone/inner.md"
    vg = write(ctx, a, gone_inner, b"inner", 0)
    expect(ctx.ask(a, "file_remove", path=gone_inner, version=vg), found(True), "file_remove of a folder's last file")
    vg2 = write(ctx, a, gone, b"file now", 0)
    expect(ctx.ask(a, "file_read", path=gone), holding(b"file now", vg2), "file_read of a file where a folder emptied")
    vg3 = write(ctx, a, gone_inner, b"again", 0)
    expect(ctx.ask(a, "file_read", path=gone_inner), holding(b"again", vg3), "file_read in a folder made anew")
    # a file removed, then a folder of its name, then the file again
    back, back_inner = "skills/back", "skills/back/inner.md"
    vb = write(ctx, a, back, b"file", 0)
    expect(ctx.ask(a, "file_remove", path=back, version=vb), found(True), "file_remove of a file")
    vbi = write(ctx, a, back_inner, b"inner", 0)
    vb2 = write(ctx, a, back, b"file again", 0)
    # removals beside: the file goes, the folder stays; the folder's file goes, the file stays
    expect(ctx.ask(a, "file_remove", path=outer, version=vo), found(True), "file_remove of a file beside a folder")
    expect(ctx.ask(a, "file_read", path=inner), holding(b"inner", vi), "file_read in a folder after the file beside")
    expect(ctx.ask(a, "file_remove", path=deep, version=vd), found(True), "file_remove in a folder beside a file")
    expect(ctx.ask(a, "file_read", path=solo), holding(b"solo 2", vs2), "file_read of a file after the folder beside")
    expect(ctx.ask(a, "file_read", path=back), holding(b"file again", vb2), "file_read of a file made again")
    expect(ctx.ask(a, "file_list", folder="skills/"), files(utf8_sorted([inner, solo, gone, gone_inner, back,
                                                                           back_inner])),
           "file_list after removals beside folders")
    expect(ctx.ask(a, "file_list", folder="skills/back"), files([back_inner]), "file_list 'skills/back'")
    expect(ctx.ask(a, "file_read", path=back_inner), holding(b"inner", vbi), "file_read in a folder beside a file")


@checks.check
def long_path_parts(ctx: Ctx) -> None:
    """Path parts of 256 to 393 bytes, and a path of 1,024 bytes made of such parts, are written, read back, listed
    and removed.

    A path-keyed server (MinIO, SeaweedFS) refuses a key part over 255 bytes
    (S3 ``KeyTooLongError``): a driver that keeps such a part inline in its
    key fails here, where the 1,017-byte single part of
    ``paths_within_limits`` is long enough to be hashed.
    """
    a = ctx.agent()
    paths = [
        "skills/" + "a" * 256, "skills/" + "b" * 300, "skills/" + "c" * 393, "skills/k/" + "d" * 391,
        "skills/" + "e" * 338 + "/" + "f" * 338 + "/" + "g" * 339, "skills/" + "h" * 256 + "/" + "i" * 300,
        "instructions/" + "j" * 300,
    ]
    versions = {}
    for p in paths:
        versions[p] = write(ctx, a, p, p.encode()[-64:], 0)
        expect(ctx.ask(a, "file_read", path=p), holding(p.encode()[-64:], versions[p]),
               f"file_read of a path of {len(p.encode())} bytes, its longest part "
               f"{max(len(x.encode()) for x in p.split('/'))}")
    skills = [p for p in paths if p.startswith("skills/")]
    expect(ctx.ask(a, "file_list", folder="skills/"), files(utf8_sorted(skills)), "file_list of long parts")
    expect(ctx.ask(a, "file_list", folder="skills/" + "e" * 338), files([skills[4]]),
           "file_list of a folder named by a 338-byte part")
    expect(ctx.ask(a, "file_remove", path=skills[4], version=versions[skills[4]]), found(True),
           "file_remove of a 1,024-byte path")
    expect(ctx.ask(a, "file_read", path=skills[4]), NONE, "file_read of a removed 1,024-byte path")
    expect(ctx.ask(a, "file_list", folder="skills/"), files(utf8_sorted(skills[:4] + skills[5:])),
           "file_list after removing the 1,024-byte path")


@checks.check
def size_limit(ctx: Ctx) -> None:
    """4 MiB is kept; a write or append that would pass it is refused, the file left as it was."""
    a, p, fresh = ctx.agent(), "skills/big/blob", "skills/big/never"
    almost = os.urandom(FILE_MAX - 3)
    v1 = write(ctx, a, p, almost, 0)
    expect_refused(ctx, [("an append past 4 MiB", request(a, "file_append", path=p, data=b64(b"four")))],
                   lambda: ctx.ask(a, "file_read", path=p))
    v2 = appended(ctx, a, p, b"abc")
    expect(ctx.ask(a, "file_read", path=p), holding(almost + b"abc", v2), "file_read of exactly 4 MiB")
    cases = [
        ("an append of one byte to 4 MiB", request(a, "file_append", path=p, data=b64(b"!"))),
        ("a write of 4 MiB + 1", request(a, "file_write", path=p, data=b64(almost + b"abcd"), version=v2)),
        ("a new file of 4 MiB + 1", request(a, "file_write", path=fresh, data=b64(almost + b"abcd"), version=0)),
        ("an append of 4 MiB + 1 to no file", request(a, "file_append", path=fresh, data=b64(almost + b"abcd"))),
    ]
    expect_refused(ctx, cases, lambda: [ctx.ask(a, "file_read", path=p), ctx.ask(a, "file_read", path=fresh),
                                        ctx.ask(a, "file_list", folder="skills/")])
    expect_that(v2 != v1, "the version after the append", f"<not {v1}>", v2)


# -- races


@checks.check
def race_write(ctx: Ctx) -> None:
    """8 writers of one version at once: exactly one `wrote`, 7 `stale` with the version now; the winner's bytes
    kept."""
    a = ctx.agent()
    for round_ in range(ctx.rounds):
        p = f"skills/race-{round_}/SKILL.md"
        base = 0 if round_ == 0 else write(ctx, a, p, b"base", 0)  # round 0 races to create
        reqs = [request(a, "file_write", path=p, data=b64(f"writer {w}".encode()), version=base) for w in range(8)]
        replies = race(ctx, reqs)
        winners = [w for w, r in enumerate(replies) if r.get("reply") == "wrote"]
        expect_that(
            len(winners) == 1, f"round {round_}: replies of 8 writers at version {base}", "<exactly one wrote>", replies
        )
        now = version_of(replies[winners[0]], "wrote", f"round {round_}: the winner's reply")
        for reply in replies:
            if reply.get("reply") != "wrote":
                expect(reply, stale(now), f"round {round_}: a losing writer's reply")
        expect(
            ctx.ask(a, "file_read", path=p), holding(f"writer {winners[0]}".encode(), now), f"round {round_}: file_read"
        )


@checks.check
def race_append(ctx: Ctx) -> None:
    """8 appends at once: every one kept whole, one after another, each with its own version."""
    a = ctx.agent()
    size = 2048
    for round_ in range(ctx.rounds):
        p = f"skills/race-append-{round_}/log"
        if round_ > 0:
            write(ctx, a, p, b"", 0)  # round 0 appends to no file
        chunks = [bytes([65 + w]) * size for w in range(8)]
        replies = race(ctx, [request(a, "file_append", path=p, data=b64(c)) for c in chunks])
        versions = [version_of(r, "wrote", f"round {round_}: an appender's reply") for r in replies]
        expect_that(len(set(versions)) == 8, f"round {round_}: the 8 appenders' versions", "<8 different>", versions)
        reply = ctx.ask(a, "file_read", path=p)
        expect_that(reply.get("reply") == "file" and isinstance(reply.get("file"), dict), f"round {round_}: file_read",
                    '<{"reply":"file","file":{...}}>', reply)
        data = base64.b64decode(reply["file"]["data"])
        runs = [data[i:i + size] for i in range(0, len(data), size)]
        whole = len(data) == 8 * size and sorted(runs) == sorted(chunks)
        expect_that(whole, f"round {round_}: the file after 8 appends of {size} bytes",
                    "<the 8 appends one after another, each whole>", f"<{len(data)} bytes: {data[:64]!r}...>")
        expect_that(reply["file"]["version"] in versions, f"round {round_}: the version read",
                    f"<one of {versions}>", reply["file"]["version"])


# -- agents, limits and refusals


@checks.check
def agents_apart(ctx: Ctx) -> None:
    """Owner null, "" and "x" are three agents: one path's bytes, lists and removals stay each agent's own."""
    base = ctx.agent()["id"]
    agents = [{"id": base, "owner": None}, {"id": base, "owner": ""}, {"id": base, "owner": "x"}, ctx.agent()]
    p = "skills/same/SKILL.md"
    versions = [write(ctx, agent, p, f"agent {i}".encode(), 0) for i, agent in enumerate(agents)]
    write(ctx, agents[3], "skills/only/three", b"3", 0)
    expect(ctx.ask(agents[1], "file_remove", path=p, version=versions[1]), found(True), 'owner "": file_remove')
    for i, agent in enumerate(agents):
        want = NONE if i == 1 else holding(f"agent {i}".encode(), versions[i])
        expect(ctx.ask(agent, "file_read", path=p), want, f"agent {i} ({agent}): file_read")
        listing = [] if i == 1 else sorted([p] + (["skills/only/three"] if i == 3 else []))
        expect(ctx.ask(agent, "file_list", folder="skills"), files(listing), f"agent {i}: file_list")
    expect(ctx.ask({"id": base}, "file_read", path=p), holding(b"agent 0", versions[0]),
           "file_read by the agent with owner left out (= null)")


@checks.check(slow=True)
def list_limit(ctx: Ctx) -> None:
    """file_list answers 4,096 files, and refuses a folder of 4,097 with an error, never a cut list."""
    a = ctx.agent()
    paths = [f"skills/many/{i:05d}" for i in range(FILES_MAX)]
    for path, reply in zip(
        paths, spread(ctx, [request(a, "file_write", path=p, data="eA==", version=0) for p in paths]), strict=False
    ):
        version_of(reply, "wrote", f"file_write {path}")
    expect(ctx.ask(a, "file_list", folder="skills/many/"), files(paths), "file_list of 4,096 files")
    write(ctx, a, "skills/many/04096", b"x", 0)
    for folder in ("skills/many/", "skills/many", "skills"):
        expect_error(ctx.ask(a, "file_list", folder=folder), f"file_list {folder!r} of 4,097 files")
    write(ctx, a, "instructions/alone", b"x", 0)
    expect(ctx.ask(a, "file_list", folder="instructions/"), files(["instructions/alone"]),
           "file_list of another folder of the same agent")


@checks.check
def refuse_malformed(ctx: Ctx) -> None:
    """Invalid JSON, non-objects, unknown ops and bad agents get an error reply and change nothing."""
    a = ctx.agent()
    write(ctx, a, "skills/kept", b"kept", 0)
    mutation = request(a, "file_write", path="skills/new", data=b64(b"new"), version=0)
    expect_refused(ctx, malformed_cases(mutation), lambda: snapshot(ctx, a, ("skills/new",)))


BAD_PATHS: list[tuple[str, Json]] = [
    ("empty", ""), ("absolute", "/skills/x"), ("another first part", "other/x"), ("first part in capitals", "Skills/x"),
    ("the first part alone, with a slash", "skills/"), ("an empty part", "skills//x"), ("a . part", "skills/./x"),
    ("a .. part", "skills/../x"), ("ending in ..", "skills/x/.."), ("starting with ./", "./skills/x"),
    ("ending in /.", "skills/x/."), ("a NUL", "skills/nul\u0000x"), ("1,025 bytes", "skills/" + "a" * 1018),
    ("1,025 bytes in 2-byte characters", "skills/" + "é" * 509), ("a number", 5), ("null", None),
    ("a list", ["skills/x"]),
]
BAD_FOLDERS: list[tuple[str, Json]] = [
    ("empty", ""), ("/", "/"), ("another first part", "other/"), ("two slashes at the end", "skills//"),
    ("a . part", "skills/./"), ("a .. part", "skills/../"), ("absolute", "/skills"), ("an empty part", "skills//a/"),
    ("a NUL", "skills/\u0000/"), ("a number", 5), ("null", None),
]


@checks.check
def refuse_bad_path(ctx: Ctx) -> None:
    """Paths not under instructions/ or skills/, with empty, . or .. parts, NUL, or past 1,024 bytes are refused."""
    a = ctx.agent()
    write(ctx, a, "skills/x", b"kept", 0)
    cases: list[tuple[str, Json]] = []
    for label, bad in BAD_PATHS:
        cases += [
            (f"file_write to a path {label}", request(a, "file_write", path=bad, data=b64(b"x"), version=0)),
            (f"file_append to a path {label}", request(a, "file_append", path=bad, data=b64(b"x"))),
            (f"file_read of a path {label}", request(a, "file_read", path=bad)),
            (f"file_remove of a path {label}", request(a, "file_remove", path=bad, version=1)),
        ]
    cases += [(f"file_list of a folder {label}", request(a, "file_list", folder=bad)) for label, bad in BAD_FOLDERS]
    cases += [(f"{op} without a path", request(a, op, **args)) for op, args in (
        ("file_write", {"data": b64(b"x"), "version": 0}), ("file_append", {"data": b64(b"x")}),
        ("file_read", {}), ("file_remove", {"version": 1}), ("file_list", {}))]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a, ("skills/nul", "other/x", "x")))


BAD_BASE64: list[tuple[str, Json]] = [
    ("without padding", "YWJjZA"), ("cut short", "abc"), ("with a newline", "YWJj\nZGVm"), ("with a space", "YW Jj"),
    ("padding in the middle", "YQ==YWJj"), ("too much padding", "YQ==="), ("a lone padded char", "Y==="),
    ("URL-safe letters", "-_8="), ("a URL-safe letter", "YW_j"), ("padding first", "=YWJ"),
    ("a number", 5), ("null", None), ("a list", ["YQ=="]),
]


@checks.check
def refuse_bad_base64(ctx: Ctx) -> None:
    """Data that is not standard padded base64 (RFC 4648 section 4) is refused by file_write and file_append."""
    a = ctx.agent()
    v = write(ctx, a, "skills/x", b"kept", 0)
    cases: list[tuple[str, Json]] = []
    for label, bad in BAD_BASE64:
        cases += [
            (f"file_write of data {label}", request(a, "file_write", path="skills/x", data=bad, version=v)),
            (
                f"file_write of a new file with data {label}",
                request(a, "file_write", path="skills/y", data=bad, version=0),
            ),
            (f"file_append of data {label}", request(a, "file_append", path="skills/x", data=bad)),
        ]
    cases += [
        ("file_write without data", request(a, "file_write", path="skills/x", version=v)),
        ("file_append without data", request(a, "file_append", path="skills/x")),
    ]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a, ("skills/y",)))


@checks.check
def refuse_bad_version(ctx: Ctx) -> None:
    """A version that is the right number spelled 1.0, true or "1", negative, null or missing is refused."""
    a, p = ctx.agent(), "skills/x"
    v = write(ctx, a, p, b"kept", 0)
    bad_versions: list[tuple[str, Json]] = [
        (f"{v}.0", float(v)), (f'"{v}"', str(v)), ("-1", -1), ("null", None), (f"[{v}]", [v]),
    ] + ([("true", True)] if v == 1 else [])
    cases: list[tuple[str, Json]] = []
    for label, bad in bad_versions:
        cases += [
            (f"file_write at version {label}", request(a, "file_write", path=p, data=b64(b"new"), version=bad)),
            (f"file_remove at version {label}", request(a, "file_remove", path=p, version=bad)),
        ]
    cases += [
        (
            "file_write of a new file at version 0.0",
            request(a, "file_write", path="skills/y", data=b64(b"n"), version=0.0),
        ),
        (
            "file_write of a new file at version false",
            request(a, "file_write", path="skills/y", data=b64(b"n"), version=False),
        ),
        ("file_write without a version", request(a, "file_write", path="skills/y", data=b64(b"n"))),
        ("file_remove without a version", request(a, "file_remove", path=p)),
    ]
    expect_refused(ctx, cases, lambda: snapshot(ctx, a, ("skills/y",)))


def _samples(ctx: Ctx) -> list[Sample]:
    a = ctx.agent()
    return [
        Sample("file_write", request(a, "file_write", path="skills/s", data=b64(b"s"), version=0), False),
        Sample(
            "file_write at version 0 again", request(a, "file_write", path="skills/s", data=b64(b"s"), version=0), False
        ),
        Sample("file_read", request(a, "file_read", path="skills/s"), False),
        Sample("file_list", request(a, "file_list", folder="skills/"), False),
        Sample("file_append", request(a, "file_append", path="instructions/log", data=b64(b"x")), False),
        Sample("file_remove", request(a, "file_remove", path="skills/none", version=0), False),
        Sample("a bad path", request(a, "file_read", path="other/x"), True),
        Sample("bad base64", request(a, "file_append", path="skills/s", data="abc"), True),
        Sample("invalid JSON", b'{"op": "file_read", "path": ', True),
    ]


discipline_checks(checks, _samples)


@not_kept.check
def refused_when_not_kept(ctx: Ctx) -> None:
    """A driver whose contract does not say files answers every file_* op with an error reply."""
    a = ctx.agent()
    for label, req in (
        ("file_read", request(a, "file_read", path="skills/x")),
        ("file_list", request(a, "file_list", folder="skills/")),
        ("file_write", request(a, "file_write", path="skills/x", data=b64(b"x"), version=0)),
        ("file_remove", request(a, "file_remove", path="skills/x", version=1)),
        ("file_append", request(a, "file_append", path="skills/x", data=b64(b"x"))),
    ):
        expect_error(ctx.send(req), f"{label} to a driver whose contract does not say files")

"""The README's and docs/api.md's examples do what they say when run (issue 29, item 13, and its test).

Every ```python block of README.md and docs/api.md runs on a folder store,
TWICE on the same folder, so an example a reader runs again works again (on
eafe802 docs/api.md's sync example stopped at a bare ``AssertionError`` on
its second run), and every line it prints is what its ``# ->`` comment says,
on both runs (on c81d270 the README's ``# FileWrite(wrote=True, version=1)``
was wrong on a second run: a comment on a ``print`` line must be a ``# ->``
one, so that what it says is checked).  The shell blocks that need no cloud run too: the
bridge's metrics demo (its output compared with the README's sample) and the
JSON log line of a driver.  The examples keep their stores under ``$HOME``, a
folder that is the reader's own (issue 43: a folder in ``/tmp`` may have been
made by another user first); the tests run them with ``HOME`` set to their own
folder and the demo's port swapped for a free one, so runs beside each other
never meet.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYTHON_DOCS = ["README.md", "docs/api.md"]
API_DEMO = 'f"file://{Path.home()}/lnk-api-demo"'
SHELL_DEMO = "$HOME/lnk-demo"
STORE_DOCS = ["README.md", "docs/api.md", "docs/admin.md", "docs/design.md", "docs/protocol.md",
              "docs/scheduler.md", "deploy/README.md"]


def home_env(home: Path) -> dict[str, str]:
    """The environment with ``HOME`` moved to a test's folder, so the examples run verbatim."""
    return {**os.environ, "HOME": str(home)}


def blocks(doc: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", (ROOT / doc).read_text(), re.S | re.M)


def following_block(doc: str, block: str) -> str:
    """The plain ``` block right after ``block`` (its sample output)."""
    text = (ROOT / doc).read_text()
    after = text[text.index(block) + len(block):]
    m = re.match(r"```\s*\n```\n(.*?)^```", after, re.S | re.M)
    assert m, "no output block follows"
    return m.group(1)


#: A ``print`` line's claim of what it prints: ``# -> OUTPUT``, an explanation after two spaces.
CLAIM = re.compile(r"\s#\s->\s(.*)$")
#: Any other comment after a ``print(...)``: a claim nobody checks.
UNCHECKED = re.compile(r"\)\s+#\s(?!->)")
#: The reader's home as the docs show it in a claim (``<Store file:///home/me/...>``).
DOCS_HOME = "/home/me"


def print_claims(block: str) -> list[str | None]:
    """For each ``print`` line of ``block``, in order, the line it says it prints (None: it says nothing).

    Each ``print`` of an example runs once and prints one line, so the n-th
    line printed is the n-th ``print``'s.
    """
    claims: list[str | None] = []
    for line in block.splitlines():
        if not re.match(r"\s*print\(", line):
            continue
        assert not UNCHECKED.search(line), f"a print line's comment that is no '# ->' claim: {line.strip()}"
        found = CLAIM.search(line)
        claims.append(re.split(r"\s{2,}", found.group(1).strip())[0] if found else None)
    return claims


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("doc", PYTHON_DOCS)
def test_python_blocks_run_twice_on_a_folder_store(doc: str, tmp_path: Path) -> None:
    found = blocks(doc, "python")
    assert found, f"{doc} has no python block"
    for block in found:
        assert API_DEMO in block or "cloudstore" not in block, "an example on a store other than the folder"
    claims = [print_claims(block) for block in found]
    assert any(c is not None for block in claims for c in block), f"{doc} says nothing a run prints"
    for run in (1, 2):
        for i, block in enumerate(found):
            done = subprocess.run([sys.executable, "-c", block], capture_output=True, text=True, timeout=120,
                                  cwd=tmp_path, env=home_env(tmp_path))
            assert done.returncode == 0, f"{doc} block {i + 1}, run {run}:\n{done.stderr[-3000:]}"
            assert "Traceback" not in done.stderr
            printed = done.stdout.splitlines()
            assert len(printed) == len(claims[i]), (doc, i + 1, run, printed)
            for line, claim in zip(printed, claims[i], strict=True):
                if claim is not None:
                    assert line == claim.replace(DOCS_HOME, str(tmp_path)), f"{doc} block {i + 1}, run {run}"
    assert (tmp_path / "lnk-api-demo").is_dir(), "the examples' store is not under $HOME"


def shell_demo(tmp_path: Path) -> tuple[str, str, int]:
    """The README's bridge metrics demo block, on the test's folder and a free port."""
    demo = [b for b in blocks("README.md", "sh") if "lnk-store-bridge" in b and "--metrics-port" in b]
    assert len(demo) == 1, demo
    port = free_port()
    ports = set(re.findall(r"--metrics-port (\d+)", demo[0]))
    assert len(ports) == 1, ports
    assert SHELL_DEMO in demo[0], "the demo's store is not under $HOME"
    script = demo[0].replace(ports.pop(), str(port))
    return demo[0], script, port


def test_the_bridge_metrics_demo_prints_the_readmes_sample(tmp_path: Path) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    original, script, _ = shell_demo(tmp_path)
    done = subprocess.run(["bash", "-e", "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=home_env(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "{'reply': 'done'}" in done.stdout, done.stdout  # the demo prints the reply dict
    sample = following_block("README.md", original).split("\n")
    sample_lines = {line for line in sample if line.strip()}
    printed = [line for line in done.stdout.splitlines() if line.startswith("lnk_")]
    # The same lines from the port and, after the bridge stops, from its file; the README shows one copy.
    for line in sample_lines:
        name_labels = line.rsplit(" ", 1)[0]
        assert any(p.rsplit(" ", 1)[0] == name_labels for p in printed), (line, printed)
        if "lnk_bridge_calls_total" in line or "lnk_store_replies_total" in line:
            assert line in printed, (line, printed)  # the counts a reader can check by hand
    log = (tmp_path / "lnk-demo" / "bridge.log").read_text()
    assert "Traceback" not in log and "Contract(" not in log

    # Then the JSON log line of a driver, on the bucket the demo filled.
    logs = [b for b in blocks("README.md", "sh") if "LNK_STORE_LOG=debug" in b]
    assert len(logs) == 1
    commands = "\n".join(line for line in logs[0].splitlines() if not line.startswith("#"))
    assert SHELL_DEMO in commands
    done = subprocess.run(["bash", "-e", "-c", commands], capture_output=True, text=True, timeout=60,
                          cwd=tmp_path, env=home_env(tmp_path))
    assert done.returncode == 0, done.stderr
    said = re.search(r"# stdout: (.*)", logs[0])
    assert said and json.loads(done.stdout) == json.loads(said.group(1)), done.stdout
    line = json.loads(done.stderr.strip().splitlines()[-1])
    for key in ("time", "level", "logger", "program", "message", "op", "reply", "requests", "ms"):
        assert key in line, (key, line)


def admin_sample(text: str, before: str) -> str:
    """The plain ``` block of docs/admin.md that follows the words ``before``."""
    m = re.search(re.escape(before) + r"\s*```\n(.*?)^```", text, re.S | re.M)
    assert m, f"docs/admin.md has no sample after {before!r}"
    return m.group(1)


def admin_run(*args: str, home: Path) -> str:
    """``lnk-store-admin ARGS`` on the test's home, its stdout."""
    done = subprocess.run([sys.executable, "-m", "cloudstore.admin.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=home, env=home_env(home))
    assert done.returncode == 0, done.stderr
    return done.stdout


def normalised(out: str, home: Path) -> str:
    """What a run of the admin tool prints, less what differs between runs: the time a lease has left, an age,
    bytes (a lease's, a mark's), the release that wrote the format record; the docs' home as the test's."""
    out = out.replace(DOCS_HOME, str(home))
    out = re.sub(r"\(\d+\.\ds left\)", "(Ns left)", out)
    out = re.sub(r"unchanged for \d+ s", "unchanged for N s", out)
    out = re.sub(r"\s+\d+ bytes", " N bytes", out)
    return re.sub(r"written by cloudstore \S+", "written by cloudstore V", out).strip()


def test_the_admin_guides_samples_are_what_the_tool_prints(tmp_path: Path) -> None:
    """docs/admin.md's store to try it on, then its ``inspect`` sample, its ``gc --apply --min-age 0`` sample
    and the count after it: what the tool prints today (issue 46, item 7: on c81d270 the sample's totals no
    longer matched, the claim index was never shown, and the file ledger was counted as ``other``)."""
    text = (ROOT / "docs/admin.md").read_text()
    demo = blocks("docs/admin.md", "sh")[0]
    assert "lnk-bucket-store call" in demo and SHELL_DEMO in demo
    done = subprocess.run(["bash", "-e", "-c", demo], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env=home_env(tmp_path))
    assert done.returncode == 0 and '"error"' not in done.stdout, done.stdout + done.stderr
    url = f"file://{tmp_path}/lnk-demo"

    shown = admin_run("inspect", url, home=tmp_path)
    assert normalised(shown, tmp_path) == normalised(admin_sample(text, "Example output, on the store above:"),
                                                     tmp_path)
    kinds = json.loads(admin_run("inspect", url, "--json", home=tmp_path))["totals"]["kinds"]
    assert kinds["ledger"]["objects"] == 1 and kinds["claim"]["objects"] == 1 and "other" not in kinds, kinds

    applied = admin_run("gc", url, "--apply", "--min-age", "0", home=tmp_path)
    assert normalised(applied, tmp_path) == normalised(admin_sample(text, "`--apply --min-age 0` prints"), tmp_path)
    said = re.search(r"and `inspect` then counts (\d+) objects, one head", text)
    assert said, "docs/admin.md no longer says what inspect counts after gc"
    after = json.loads(admin_run("inspect", url, "--json", home=tmp_path))["totals"]
    assert after["objects"] == int(said.group(1)) and after["kinds"]["head"]["objects"] == 1, after


@pytest.mark.slow  # starts every emulator, SeaweedFS included
def test_pasting_what_emulators_py_prints_points_the_drivers_at_moto(tmp_path: Path) -> None:
    """``python tests/emulators.py`` prints settings to paste (README, "Developing"): pasted whole, they reach
    fake-gcs-server and moto, whose names head them; SeaweedFS's come under names of their own, and the line it
    prints to switch to SeaweedFS does.  On c81d270 SeaweedFS's lines came last under the same names, so a
    paste pointed the drivers at SeaweedFS."""
    from emulators import READY, seaweed_binary

    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "emulators.py")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True, cwd=tmp_path)
    watchdog = threading.Timer(180, proc.kill)  # a hung start ends the read below (and fails it), never the run
    watchdog.start()
    printed: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.rstrip("\n") == READY:
                break
            printed.append(line)
        else:
            pytest.fail(f"emulators.py ended before it said it was ready: {printed}")
    finally:
        watchdog.cancel()
        proc.send_signal(signal.SIGINT)  # it stops its emulators, then exits
        proc.wait(60)
    text = "".join(printed)
    moto = re.search(r"^# moto\n(?:export .*\n)*?export AWS_ENDPOINT_URL_S3=(\S+)", text, re.M)
    assert moto, text

    def pasted(extra: str = "") -> dict[str, str]:
        done = subprocess.run(["bash", "-e", "-c", f"{text}\n{extra}\nenv"], capture_output=True, text=True,
                              timeout=60, env={"PATH": os.environ["PATH"]})
        assert done.returncode == 0, done.stderr
        return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)

    env = pasted()
    assert env["AWS_ENDPOINT_URL_S3"] == moto.group(1) and env["AWS_ACCESS_KEY_ID"] == "testing", text
    assert env["LNK_GCS_URL"].startswith("gs://") and env["STORAGE_EMULATOR_HOST"].startswith("http://127.0.0.1:")
    if seaweed_binary() is None:
        return
    seaweed = env["SEAWEEDFS_AWS_ENDPOINT_URL_S3"]
    assert seaweed != moto.group(1) and seaweed.startswith("http://127.0.0.1:"), text
    switch = re.search(r"^#   (export AWS_ENDPOINT_URL_S3=.*)$", text, re.M)
    assert switch, text
    switched = pasted(switch.group(1))
    assert switched["AWS_ENDPOINT_URL_S3"] == seaweed and switched["AWS_ACCESS_KEY_ID"] != "testing", switched


def test_no_example_keeps_a_store_in_a_folder_others_may_have_made() -> None:
    """Issue 43: the docs' stores are the reader's own, never a fixed name in ``/tmp`` that another local
    user could have made first (``mkdir -p`` says nothing then, and the folder store refuses it)."""
    for doc in STORE_DOCS:
        text = (ROOT / doc).read_text()
        found = re.findall(r"(?:file://|LNK_BUCKET_URL=|mkdir -p[^\n]*?)(/tmp/[\w.-]+)", text)
        assert not found, (doc, found)


def test_every_e_or_name_the_readme_points_back_to_is_there() -> None:
    """"E above" with no E above it (eafe802): the README names where E is defined instead."""
    text = (ROOT / "README.md").read_text()
    assert "E above" not in text
    for m in re.finditer(r"bound E of `([^`]+)`", text):
        assert (ROOT / m.group(1)).exists(), m.group(1)


def test_migrate_run_again_is_as_the_readme_says(tmp_path: Path) -> None:
    """A finished migrate's destination is refused on a second run unless --force (the code), and the
    README says so instead of a bare "run it again to resume" (eafe802)."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    env = {**__import__("os").environ, "LNK_BUCKET_URL": f"file://{src}"}
    put = subprocess.run(["lnk-bucket-store", "call"], input='{"op": "append", "agent": {"owner": null, "id": "a"}, '
                         '"thread": "t", "event": {"seq": 1}}', capture_output=True, text=True, env=env, timeout=60)
    assert '"done"' in put.stdout, put.stderr
    admin = [sys.executable, "-m", "cloudstore.admin.cli", "migrate", f"file://{src}", f"file://{dst}"]
    first = subprocess.run(admin, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    again = subprocess.run(admin, capture_output=True, text=True, timeout=120)
    assert again.returncode != 0 and "--force" in again.stderr and "Traceback" not in again.stderr, again.stderr
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "run it again to resume)" not in text
    assert "a run cut short resumes when run again" in text and "a finished run's destination too" in text

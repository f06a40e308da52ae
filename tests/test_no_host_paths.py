"""Issue 25, case 7: no error reply an agent sees names a path of the host.

On eafe802 a folder store that could not be used answered ``internal error
(NotADirectoryError: [Errno 20] Not a directory: '<the store's folder>/...')``:
the reply told the agent (through a bridge, maybe another tenant's) where the
store lives on the machine.  Now the reply names the kind of failure and the
setting; the whole message goes to stderr only.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from cloudstore.protocol.service import _described


def _call(folder: Path, request: dict) -> tuple[dict, str]:
    out = subprocess.run(["lnk-bucket-store", "call"], input=json.dumps(request), capture_output=True, text=True,
                         env={**os.environ, "LNK_BUCKET_URL": f"file://{folder}"}, timeout=60)
    return json.loads(out.stdout), out.stderr


def test_a_folder_store_failing_on_the_host_names_no_host_path(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "a").write_text("a file where the store keeps a folder")
    reply, _ = _call(store, {"op": "append", "agent": {"id": "a", "owner": None}, "thread": "t",
                             "event": {"seq": 1}})
    assert reply["reply"] == "error", reply
    assert str(tmp_path) not in reply["error"], reply
    assert "LNK_BUCKET_URL" in reply["error"], reply


def test_an_unexpected_message_keeps_no_quoted_absolute_path() -> None:
    assert "/srv" not in _described(ValueError("cannot use '/srv/lnk/x/y'"), "s3")
    assert "/srv" not in _described(FileNotFoundError(2, "No such file or directory", "/srv/lnk"), "file")

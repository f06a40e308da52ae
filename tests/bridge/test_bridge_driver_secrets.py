"""What a failing driver wrote on stderr stays in the bridge's log, never in the caller's reply.

A driver's stderr is written for its operator: a traceback names the agent's
folder, an SDK error the endpoint and the bucket. The caller is an agent
that proved who it is, not the operator; it learns that the driver failed
and how (exit code, how many lines), nothing of where things are kept.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from cloudstore.bridge import Limits

SECRET = "/srv/secret-folder/agents s3://hidden-bucket/prefix http://10.9.8.7:9000"

# A call-only driver that fails the way a crashing SDK does: a long stderr, exit 1.
FAILING_DRIVER = f"""
import sys
args = sys.argv[1:]
if args == ["contract"]:
    print('{{"version": 1}}')
    sys.exit(0)
sys.stdin.buffer.read()
sys.stderr.write("Traceback (most recent call last):\\n" + "x" * 5000 + "\\n{SECRET}\\n")
sys.exit(1)
"""


def test_a_failed_call_only_driver_reply_keeps_its_stderr_out(rig, tmp_path: Path, caplog) -> None:
    script = tmp_path / "failing_driver.py"
    script.write_text(FAILING_DRIVER)
    r = rig(driver=[sys.executable, str(script)], limits=Limits(call_timeout=60.0))
    with caplog.at_level(logging.WARNING, logger="cloudstore.bridge"):
        reply = r.client().op("last", thread="t")
    assert reply["reply"] == "error"
    assert reply["error"].startswith("driver: "), reply
    assert "exited 1" in reply["error"]
    for part in ("secret-folder", "hidden-bucket", "10.9.8.7", "Traceback"):
        assert part not in reply["error"], reply
    # The operator still sees the tail, cut short, in the bridge's log.
    logged = "\n".join(rec.getMessage() for rec in caplog.records)
    assert "hidden-bucket" in logged
    assert max(len(rec.getMessage()) for rec in caplog.records) < 4000


def test_a_long_name_is_cut_in_refusals_and_logs(rig, caplog) -> None:
    """A refused name was once echoed whole into one log line (a 900 KB id, a 900 KB line)."""
    r = rig()
    long_id = "x" * 3000  # fits the proof line's bound, not a served agent
    with caplog.at_level(logging.INFO, logger="cloudstore.bridge"):
        reply = r.client(agent_id=long_id).op("last", thread="t")
    assert reply["reply"] == "error" and reply["error"].startswith("refused: ")
    assert len(reply["error"]) < 400, reply
    assert "3000 characters" in reply["error"]
    assert all(len(rec.getMessage()) < 1000 for rec in caplog.records)

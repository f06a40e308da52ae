"""A stored record can no longer make the driver delete another agent's key (issue 25, item 3).

On eafe802 a job record whose waiting ``entry`` named another agent's file
(``<root>a/<victim>/f/skills/a.md``) made its own agent's ``job_remove``
delete that file outright, no tombstone: the victim's next ``file_write`` at
version 0 was given version 1 again.  A claim and a ``job_shift`` out of
waiting went through the same delete (``DueIndex.drop`` with the record's
entry), and ``migrate`` copied such records unchanged.

Now every record is checked against its own agent's and job's keys before
any key it names is deleted: the hostile agent's op answers an error naming
the job record, and the victim's file is byte for byte as it was.
"""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from typing import Any

import pytest
from support import fresh_agent, location_of, serving

from cloudstore.generations import Overwrite
from cloudstore.protocol.validate import compact
from cloudstore.settings import open_store
from cloudstore.store.keys import AgentKeys

JOB = {"id": "j", "spec": {"say": "hi"}, "due": 5}
NOT_AFTER = 2_000_000_000.0


def keys_of(root: str, agent: dict) -> AgentKeys:
    return AgentKeys(root, agent["owner"], agent["id"])


def plant(store_obj: Any, record_key: str, entry: str) -> None:
    """Make the record's waiting place name ``entry`` (as a machine with bucket credentials could)."""
    got = store_obj.get(record_key)
    assert got is not None
    record = json.loads(got.data)
    record["places"]["waiting"]["entry"] = entry
    store_obj.put(record_key, compact(record).encode("ascii"), Overwrite())


@pytest.fixture
def own(store_env: Any) -> Any:
    """The store as the scheduler's own driver sees it (``job_claim`` answered); its settings in this
    process's environment too, for reading the backend directly."""
    return replace(store_env, env={**store_env.env, "LNK_SCHEDULER_OPS": "1"})


@pytest.mark.parametrize("op", ["job_remove", "job_claim", "job_shift"])
def test_a_record_naming_another_agents_file_deletes_nothing_of_it(own: Any, op: str) -> None:
    loc = location_of(own)
    raw = open_store(loc)
    victim, hostile = fresh_agent("victim-owner"), fresh_agent("hostile-owner")
    victim_file = keys_of(loc.prefix, victim).file("skills/a.md")
    with serving(own) as (proc,):
        def ask(agent: dict, name: str, **args: Any) -> Any:
            return proc.request({"op": name, "agent": agent, **args}, timeout=60)

        data = base64.b64encode(b"the victim's skill").decode()
        assert ask(victim, "file_write", path="skills/a.md", data=data, version=0) == {"reply": "wrote", "version": 1}
        before = raw.backend.get(victim_file)
        assert before is not None
        assert ask(hostile, "job_put", place="waiting", job=JOB) == {"reply": "done"}
        plant(raw, keys_of(loc.prefix, hostile).job("j"), victim_file)

        if op == "job_remove":
            reply = ask(hostile, "job_remove", place="waiting", id="j")
        elif op == "job_shift":
            reply = ask(hostile, "job_shift", id="j", **{"from": "waiting", "to": "firing"})
        else:
            reply = ask(hostile, "job_claim", id="j", thread="job:j", holder="runner", lapse_ms=60_000,
                        not_after=NOT_AFTER)
        assert reply["reply"] == "error" and "job record" in reply["error"], reply
        assert loc.prefix not in reply["error"] or loc.prefix == "", reply
        after = raw.backend.get(victim_file)
        assert after is not None and after[0] == before[0], "the victim's file was changed"
        # the victim's version never comes back: a write at 0 is still stale, as before
        assert ask(victim, "file_write", path="skills/a.md", data=data, version=0) == {"reply": "stale", "version": 1}
        assert ask(victim, "file_read", path="skills/a.md") == {"reply": "file", "file": {"data": data, "version": 1}}
        # and the process goes on answering every agent
        assert ask(hostile, "job_get", place="firing", id="j")["reply"] in ("job", "error")
        assert ask(victim, "job_put", place="waiting", job=JOB) == {"reply": "done"}
        assert ask(victim, "job_remove", place="waiting", id="j") == {"reply": "found", "found": True}


def test_a_record_naming_another_jobs_entry_is_refused_too(store_env: Any) -> None:
    """An entry of the agent's own OTHER job is no key of this job's: deleting it would lose that job's wake."""
    loc = location_of(store_env)
    raw = open_store(loc)
    agent = fresh_agent()
    with serving(store_env) as (proc,):
        def ask(name: str, **args: Any) -> Any:
            return proc.request({"op": name, "agent": agent, **args}, timeout=60)

        assert ask("job_put", place="waiting", job={**JOB, "id": "other", "due": 7}) == {"reply": "done"}
        assert ask("job_put", place="waiting", job=JOB) == {"reply": "done"}
        record = json.loads(raw.get(keys_of(loc.prefix, agent).job("other")).data)  # type: ignore[union-attr]
        others = record["places"]["waiting"]["entry"]
        plant(raw, keys_of(loc.prefix, agent).job("j"), others)
        reply = ask("job_remove", place="waiting", id="j")
        assert reply["reply"] == "error" and "job record" in reply["error"], reply
        assert raw.backend.get(others) is not None, "another job's due entry was deleted"
        assert ask("job_get", place="waiting", id="other")["job"]["due"] == 7
        assert ask("job_next")["next"] in (5, 7)  # j's own entry still stands, younger than the grace


def test_migrate_does_not_copy_a_record_naming_another_agents_key(store_env: Any, tmp_path: Any) -> None:
    from cloudstore.admin import migrate

    loc = location_of(store_env)
    raw = open_store(loc)
    victim, hostile = fresh_agent("victim-owner"), fresh_agent("hostile-owner")
    victim_file = keys_of(loc.prefix, victim).file("skills/a.md")
    with serving(store_env) as (proc,):
        data = base64.b64encode(b"v").decode()
        assert proc.request({"op": "file_write", "agent": victim, "path": "skills/a.md", "data": data,
                             "version": 0}, timeout=60)["reply"] == "wrote"
        assert proc.request({"op": "job_put", "agent": hostile, "place": "waiting", "job": JOB},
                            timeout=60) == {"reply": "done"}
    record_key = keys_of(loc.prefix, hostile).job("j")
    plant(raw, record_key, victim_file)
    said: list[str] = []
    summary = migrate.migrate(store_env.url, f"file://{tmp_path}/dst", log=said.append)
    assert not summary.ok
    rel = record_key[len(loc.prefix):]
    assert any(rel in why for why in summary.refused), summary.refused
    assert any(rel in line and line.startswith("refused:") for line in said), said
    copied = tmp_path / "dst"
    dst = open_store(location_of(replace(store_env, backend="file", env={"LNK_BUCKET_URL": f"file://{copied}"})))
    assert dst.get(rel) is None, "the hostile record was copied"
    assert dst.get(victim_file[len(loc.prefix):]) is not None, "the victim's file was not copied"

"""The shared claim index (claim_index.py): every job in firing, named to the scheduler's own driver.

``job_claims`` (the runner's recovery listing) names each agent's jobs in
firing, whichever op put them there (``job_put``, ``job_shift``, the runner's
``job_claim``), and stops naming them once they leave firing; an agent's
driver refuses it.  A crash's leftover (an entry whose record holds no job in
firing) and foreign objects in the index are counted by ``inspect`` and
reclaimed by ``gc`` past the grace, never a live entry.
"""

from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any

from support import Session, serving

from cloudstore.admin import gc
from cloudstore.admin.inspect import inspect
from cloudstore.admin.walk import list_all, open_url
from cloudstore.generations import Overwrite
from cloudstore.protocol.validate import Agent
from cloudstore.store.claim_index import ClaimIndex
from cloudstore.store.keys import claim_root


def job(id_: str, due: float | int, spec: Any = None) -> dict:
    return {"id": id_, "spec": spec, "due": due}


def named(reply: dict) -> list[tuple[str, Any]]:
    assert reply["reply"] == "claims", reply
    return sorted(((e["agent"], e["job"]) for e in reply["claims"]), key=lambda x: (x[0], x[1] or ""))


def test_job_claims_names_every_agents_jobs_in_firing_only_for_the_schedulers_driver(store: Any) -> None:
    own = replace(store, env={**store.env, "LNK_SCHEDULER_OPS": "1"})
    with serving(store) as plain, serving(own) as ops:
        a = Session(ops[0], {"id": "a", "owner": None})
        b = Session(ops[0], {"id": "b/x", "owner": "o"})
        refused = Session(plain[0], {"id": "a", "owner": None})("job_claims")
        assert refused["reply"] == "error" and "unknown op" in refused["error"]
        assert a("job_claims") == {"reply": "claims", "claims": [], "more": False}
        a("job_put", place="firing", job=job("put", 1))
        a("job_put", place="waiting", job=job("shifted", 2))
        a("job_shift", id="shifted", **{"from": "waiting", "to": "firing"})
        b("job_put", place="waiting", job=job("claimed", 3))
        claimed = b("job_claim", id="claimed", thread="job:claimed", holder="r1", lapse_ms=30_000,
                    not_after=time.time())
        assert claimed["job"] is not None, claimed
        a("job_put", place="waiting", job=job("waits", 4))  # waiting is never in it
        long_id = "é" * 120  # hashed in the key: named null
        a("job_put", place="firing", job=job(long_id, 5))
        got = a("job_claims")
        assert got["more"] is False
        assert named(got) == [("-/_a", None), ("-/_a", "put"), ("-/_a", "shifted"), ("_o/_b%2Fx", "claimed")]
        assert all(isinstance(e["age_ms"], int) and e["age_ms"] >= 0 for e in got["claims"])
        first = a("job_claims", limit=1)
        assert first["more"] is True and len(first["claims"]) == 1
        rest = a("job_claims", limit=10, after=first["claims"][0]["key"])
        assert len(rest["claims"]) == 3
        # Out of firing, every way: the entry goes.
        a("job_remove", place="firing", id="put")
        a("job_shift", id="shifted", **{"from": "firing", "to": "ending"})
        b("job_remove", place="firing", id="claimed")
        a("job_remove", place="firing", id=long_id)
        assert a("job_claims")["claims"] == []
        for bad in ({"limit": 0}, {"limit": 1001}, {"after": 5}, {"after": "a\u0000b"}):
            assert a("job_claims", **bad)["reply"] == "error", bad


def test_a_claim_refused_as_held_writes_no_entry(store: Any) -> None:
    own = replace(store, env={**store.env, "LNK_SCHEDULER_OPS": "1"})
    with serving(own) as ops:
        a = Session(ops[0], {"id": "a", "owner": None})
        a("job_put", place="waiting", job=job("j", 1))
        assert a("take", thread="job:j", holder="other", lapse_ms=60_000)["took"] == "took"
        lost = a("job_claim", id="j", thread="job:j", holder="r1", lapse_ms=60_000, not_after=time.time())
        assert lost["took"] == "held" and lost["job"] is None
        assert a("job_claims")["claims"] == []


def test_inspect_and_gc_know_the_claim_index(store_env: Any) -> None:
    o = open_url(store_env.url)
    own = replace(store_env, env={**store_env.env, "LNK_SCHEDULER_OPS": "1"})
    with serving(own) as ops:
        a = Session(ops[0], {"id": "a", "owner": None})
        a("job_put", place="firing", job=job("live", 1))
    # A crash's leftover (its job never reached firing) and a foreign object in the index.
    ClaimIndex(o.space).add(o.space.keys(Agent(id="ghost", owner=None)), "nobody")
    o.store.put(claim_root(o.root) + "junk", b"x", Overwrite())
    report = inspect(o)
    assert report["claim_index"]["entries"] == 2 and report["claim_index"]["foreign"] == 1
    assert report["claim_index"]["not_firing"] == 1
    assert json.dumps(report)
    # Within the grace gc keeps all of it; past it, the leftover and the foreign object go, the live one stays.
    plan, _, _ = gc.run(o, False, gc.Policy(min_age=0))
    assert [d for d in plan.doomed if d.kind.startswith("claim")] == []
    later = gc.Policy(min_age=0, now=lambda: o.store.clock.now() + 600)
    plan, result, conditional = gc.run(o, True, later)
    assert sorted(d.kind for d in plan.doomed if d.kind.startswith("claim")) == ["claim-foreign", "claim-orphan"]
    left = sorted(k.rel for k in list_all(o) if k.kind == "claim")
    if conditional:
        assert left == ["_claim/-/_a/_live"], left
    else:  # fake-gcs-server ignores a delete's generation: gc keeps what only a conditional delete may remove
        assert result is not None and result.kept_unsafe.get("claim-orphan") == 1
        assert left == ["_claim/-/_a/_live", "_claim/-/_ghost/_nobody"], left
    with serving(own) as ops:
        a = Session(ops[0], {"id": "a", "owner": None})
        # A young leftover gc had to keep is still answered (a runner then finds its lease free and no job).
        assert [e["job"] for e in a("job_claims")["claims"]] == (["live"] if conditional else ["live", "nobody"])

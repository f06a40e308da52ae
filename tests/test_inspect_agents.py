"""``lnk-store-admin inspect`` reports every agent it can, side by side (issue 25, issue 26 case 6).

One agent whose objects make an op answer an error (a hostile or broken head)
used to stop the whole report; now that agent is shown with the error and
every other agent is reported as usual.  The reports run 16 agents at a time
(their cost at a cloud's round trips is measured by benchmarks/inspect_scale.py).
"""

from __future__ import annotations

from typing import Any

from support import service_of

from cloudstore.admin import inspect
from cloudstore.admin.walk import open_url
from cloudstore.generations import Overwrite
from cloudstore.protocol.validate import Agent


def test_a_broken_agent_is_shown_and_the_others_reported(store_env: Any) -> None:
    service = service_of(store_env)
    agents = [Agent(id=f"a{i}", owner="o") for i in range(20)]
    for agent in agents:
        assert service.answer({"op": "append", "agent": agent.wire(), "thread": "t",
                               "event": {"seq": 1}}) == {"reply": "done"}
    broken = agents[7]
    service.space.store.put(service.space.keys(broken).lease("t"), b'{"thread": 5, "epoch": "x"}', Overwrite())
    report = inspect.inspect(open_url(store_env.url))
    by_id = {a.get("id", a["id_part"]): a for a in report["agents"]}
    assert len(by_id) == 20
    failed = [a for a in report["agents"] if "errors" in a]
    assert len(failed) == 1 and failed[0]["id_part"].endswith("a7"), failed
    for agent in agents:
        if agent is not broken:
            assert by_id[agent.id]["events"] == 1
    assert "not inspected" in inspect.table(report)


def test_progress_of_agents_names_no_bytes_it_does_not_count() -> None:
    # inspect counts agents as it goes, not their bytes: a plain progress line said "0 bytes" for 1,000 agents.
    import io

    from cloudstore.admin.progress import Progress

    for sized, want in ((False, "2/2 agents, "), (True, "2/2 objects, 10 bytes, ")):
        out = io.StringIO()
        progress = Progress(2, what="agents" if not sized else "objects", stream=out, sized=sized)
        progress.add(2, 10)
        progress.close()
        assert out.getvalue().startswith(want) and ("bytes" in out.getvalue()) == sized, out.getvalue()

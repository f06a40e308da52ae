"""Issue 43, part 4: no reply of the bridge hides an unknown outcome.

A store that holds a write's reply (the fault proxy's ``delay`` rule with
``after``: the write is forwarded and applied at once, its reply held back)
makes a ``job_put`` through the bridge outlast its limits:

* with the op's budget above the bridge's call limit, the bridge stops the
  driver; its ``timeout:`` answer must say ``outcome unknown`` (the write
  landed: a fresh read shows it), never read as "nothing was changed";
* with the bridge's own op budget (inside its call limit), lnk-gcs cuts the
  try to what is left of the budget, sends no next write once it is spent,
  and answers itself, saying so (``outcome unknown``: a write was sent).

Asserted on replies and on what the proxy saw, never on times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from faults.http_proxy import FaultProxy, Rule
from support import S3_SERVERS, StoreUnderTest, make_store

from cloudstore.bridge import Limits, bridge_error_word
from cloudstore.errors import OutcomeUnknownError, from_reply
from cloudstore.protocol.service import UNKNOWN_WORDS

HELD = 20.0  # seconds the proxy holds the reply: past the call limits below and the SDKs' 10 s read timeout


@dataclass
class Behind:
    backend: str
    proxy: FaultProxy
    store: StoreUnderTest

    def upload_of(self, marker: bytes) -> dict[str, Any]:
        """Matcher of the uploads whose body carries ``marker`` (the job's record holds its spec)."""
        return {"method": "PUT" if self.backend in S3_SERVERS else "POST", "content": marker}


def behind(backend: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Behind]:
    base = make_store(backend, request, tmp_path_factory)
    setting = "AWS_ENDPOINT_URL_S3" if backend in S3_SERVERS else "STORAGE_EMULATOR_HOST"
    with FaultProxy(base.env[setting], flavor="s3" if backend in S3_SERVERS else "gcs") as proxy:
        yield Behind(backend, proxy, replace(base, env=proxy.redirect(base.env)))


@pytest.fixture(params=("gcs", "moto"))
def proxied(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Behind]:
    yield from behind(request.param, request, tmp_path_factory)


@pytest.fixture
def gcs_proxied(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Behind]:
    yield from behind("gcs", request, tmp_path_factory)


def job(spec: str) -> dict[str, Any]:
    return {"id": "j1", "spec": spec, "due": 1}


def test_a_call_the_bridge_stopped_for_time_says_outcome_unknown(rig, proxied: Behind) -> None:
    # The op's budget is set above the call limit on purpose: the bridge, not the driver, stops the call.
    r = rig(driver=proxied.store.program, env=dict(proxied.store.env),
            limits=Limits(call_timeout=8, op_seconds=120))
    client = r.client(0)
    assert client.op("job_put", place="ending", job=job("spec-one")) == {"reply": "done"}
    held = proxied.proxy.add(Rule("delay", after=HELD, **proxied.upload_of(b"spec-two")))
    reply = client.op("job_put", place="ending", job=job("spec-two"))
    assert reply["reply"] == "error" and bridge_error_word(reply) == "timeout", reply
    assert UNKNOWN_WORDS in reply["error"], reply
    assert isinstance(from_reply("job_put", reply["error"]), OutcomeUnknownError)
    # The write had landed: a reply saying "nothing was changed" would have been a lie.
    assert held.fired == 1
    assert client.op("job_get", place="ending", id="j1") == {"reply": "job", "job": job("spec-two")}


def test_an_op_out_of_budget_sends_no_next_write_and_says_so(rig, gcs_proxied: Behind) -> None:
    # The bridge's own budget: two thirds of its call limit (6 s of 9).
    r = rig(driver=gcs_proxied.store.program, env=dict(gcs_proxied.store.env), limits=Limits(call_timeout=9))
    client = r.client(0)
    assert client.op("job_put", place="ending", job=job("spec-one")) == {"reply": "done"}
    held = gcs_proxied.proxy.add(Rule("delay", after=HELD, **gcs_proxied.upload_of(b"spec-two")))
    reply = client.op("job_put", place="ending", job=job("spec-two"))
    assert reply["reply"] == "error" and bridge_error_word(reply) is None, reply  # the driver's own answer
    assert "ran out" in reply["error"], reply
    assert isinstance(from_reply("job_put", reply["error"]), OutcomeUnknownError), reply
    assert held.matched == 1  # the try the budget cut short; no retry of it was sent

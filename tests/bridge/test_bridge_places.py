"""The place-allocation rules (bridge/places.py) driven step by step with
stand-in processes: which agent each freed place goes to, counted."""

from __future__ import annotations

import threading

from bridge_helpers import wait_for

from cloudstore.bridge.places import SHARED_QUANTUM, Grant, Places

FAR = 1e9  # a deadline no test reaches (monotonic seconds)


class Proc:
    """A stand-in driver process: alive, and named after the agent it serves."""

    def __init__(self, key: str) -> None:
        self.key = key

    def alive(self) -> bool:
        return True


class Rig:
    """Places, and calls that wait in them on threads queued one after another (a known order)."""

    def __init__(self, total: int = 4, quantum: int = 8) -> None:
        self.places: Places[Proc] = Places(total, quantum)
        self.granted: list[Grant[Proc]] = []
        self._lock = threading.Lock()

    def take_now(self, key: str) -> Grant[Proc]:
        grant = self.places.take(key, FAR)
        grant.proc = grant.proc or Proc(key)
        return grant

    def wait(self, key: str) -> None:
        """One call of ``key`` queued behind those already waiting."""
        before = self.places.counts()["waiting"]

        def run() -> None:
            grant = self.places.take(key, FAR)
            grant.proc = grant.proc or Proc(key)
            with self._lock:
                self.granted.append(grant)

        threading.Thread(target=run, daemon=True).start()
        wait_for(lambda: self.places.counts()["waiting"] == before + 1, what=f"a call of {key} to wait")

    def free(self, grant: Grant[Proc]) -> Grant[Proc]:
        """Give ``grant``'s place back with its healthy process; the grant it went to."""
        n = len(self.granted)
        self.places.give(grant.key, grant.proc, grant.turns)
        wait_for(lambda: len(self.granted) == n + 1, what="the freed place to be handed on")
        return self.granted[-1]


def test_a_place_freed_by_an_agent_over_its_share_goes_to_the_agent_waiting():
    r = Rig()
    held = [r.take_now("flood") for _ in range(4)]  # one agent takes every place
    for _ in range(4):
        r.wait("flood")  # and keeps 4 more calls waiting
    r.wait("other")
    r.wait("other")
    got = [r.free(held[0]), r.free(held[1])]
    assert [g.key for g in got] == ["other", "other"]  # 2 places each, not 4 for one
    assert got[0].proc is not None and got[0].proc.key == "other"  # a process of its own,
    assert [p.key for p in got[0].drop] == ["flood"]  # the flooder's stopped to make room
    assert r.places.held_by("flood") == 2 and r.places.held_by("other") == 2
    nxt = r.free(held[2])  # "other" waits no more: the flooder's own driver serves its next call
    assert nxt.key == "flood" and nxt.proc is held[2].proc and not nxt.drop


def test_waiting_agents_are_served_round_robin_fifo_within_one_and_turns_reuse_a_driver():
    r = Rig(total=1, quantum=3)
    first = r.take_now("a")
    for key in ["a", "a", "a", "a", "b", "c", "b"]:
        r.wait(key)
    keys, grant = [], first
    for _ in range(7):
        grant = r.free(grant)
        keys.append((grant.key, grant.turns))
    # "a" keeps its driver for a turn of 3 calls (no start), then goes to the back of the
    # round: b (whose turn takes its second call too), c, then a's last two calls.
    assert keys == [("a", 2), ("a", 3), ("b", 1), ("b", 2), ("c", 1), ("a", 1), ("a", 2)]
    assert r.places.counts() == {"places": 1, "held": 1, "idle": 0, "waiting": 0}


def test_shared_processes_are_handed_on_across_agents_and_fairness_is_still_by_agent():
    # One kind for every agent (shared drivers) and a turn of one call: a freed place goes
    # round-robin to the next agent, with its process (no stop, no start).
    places: Places[Proc] = Places(2, quantum=SHARED_QUANTUM)
    shared = "env"
    held = [places.take("flood", FAR, shared) for _ in range(2)]
    for g in held:
        g.proc = Proc("shared")
    granted: list[Grant[Proc]] = []

    def wait(key: str) -> None:
        before = places.counts()["waiting"]
        threading.Thread(target=lambda: granted.append(places.take(key, FAR, shared)), daemon=True).start()
        wait_for(lambda: places.counts()["waiting"] == before + 1, what=f"a call of {key} to wait")

    for key in ["flood", "flood", "b", "c"]:
        wait(key)
    order = []
    grant = held[0]
    for n in range(4):
        places.give(grant.key, grant.proc, grant.turns, grant.kind)
        wait_for(lambda n=n: len(granted) == n + 1, what="the freed place to be handed on")
        grant = granted[-1]
        order.append(grant.key)
        assert grant.proc is held[0].proc and not grant.drop  # the same process, whoever's call
    assert order == ["b", "c", "flood", "flood"]  # the flooder over its share (2 of 2) waits its round
    assert places.held_by("flood") == 2 and places.counts()["idle"] == 0
    # Nobody waits: the process goes idle, and any agent's next call takes it.
    places.give(grant.key, grant.proc, grant.turns, grant.kind)
    again = places.take("d", FAR, shared)
    assert again.proc is held[0].proc and not again.drop

"""Every op is declared once (``cloudstore.protocol.service.OPS``); everything that lists ops agrees with it.

What is held to the table:

* (a) ``Service``'s ``op_*`` methods are exactly the declared handlers, each named ``op_<its name>``;
* (b) the bridge's metric labels (``bridge.server._ops``) are the table's names;
* (c) ``cloudstore.api.ops``, ``api.AgentHandle`` and ``aio.AsyncAgentHandle`` have one method per
  op of the protocol (the table's ops that are not scheduler-only), besides their own named below;
* (d) each op of the protocol is sent by the conformance family of its family (read with ``ast``);
  the scheduler-only ops are no part of the protocol, so ``lnk-store-check``, which judges any
  driver, never sends them: they are held to the scheduler's client (``scheduling/store_client.py``),
  the one module that sends them, and their behaviour to tests/test_job_claim.py,
  tests/test_claim_index.py, tests/test_due_bounds.py and tests/test_hostile_fuzz.py;
* (e) docs/protocol.md's op tables name exactly the protocol's ops, and its "Extensions" the others.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pytest

import cloudstore.aio
import cloudstore.api
from cloudstore.bridge.server import _op_label, _ops
from cloudstore.conformance.harness import FAMILIES
from cloudstore.protocol.service import OPS, Service

ROOT = Path(__file__).resolve().parent.parent
CONFORMANCE = ROOT / "cloudstore" / "conformance"

#: The protocol's ops: what an agent may send, the API's methods, the conformance suite's and the docs' ops.
PROTOCOL = {name for name, op in OPS.items() if not op.scheduler_only}
SCHEDULER_ONLY = {name for name, op in OPS.items() if op.scheduler_only}

#: An op's family -> the conformance family (``harness.FAMILIES``) that checks it.
CONFORMANCE_FAMILY = {
    "conversations": "check", "leases": "check", "jobs": "check_jobs", "files": "check_files",
    "tools": "check_narrowing",
}

#: The methods of the API's classes that are not one op each.
API_OPS_EXTRA = {"raw"}  # any op, as the protocol writes it
HANDLE_EXTRA = {"request"}  # the same, on a handle


def undeclared(cls: type) -> tuple[set[str], set[str]]:
    """``op_*`` methods of ``cls`` no op of ``OPS`` declares, and declared handlers ``cls`` lacks."""
    methods = {name for name, _ in inspect.getmembers(cls, callable) if name.startswith("op_")}
    declared = {op.handler.__name__ for op in OPS.values()}
    return methods - declared, declared - methods


def public_methods(cls: type) -> set[str]:
    """The names of ``cls``'s own public methods (static ones included), as a caller sees them."""
    return {name for name, value in vars(cls).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, staticmethod))}


# -- (a) the service


def test_the_services_handlers_are_exactly_the_declared_ones() -> None:
    assert undeclared(Service) == (set(), set())
    for name, op in OPS.items():
        assert op.handler.__name__ == f"op_{name}", (name, op.handler.__name__)
        assert getattr(Service, op.handler.__name__) is op.handler, name


def test_an_undeclared_handler_is_caught() -> None:
    """The check above fails for a ``Service`` that grew an ``op_`` method nobody declared in ``OPS``."""

    class Grown(Service):
        def op_job_frobnicate(self, req: dict, agent: object) -> dict:
            return {"reply": "done"}

    extra, lacking = undeclared(Grown)
    assert extra - undeclared(Service)[0] == {"op_job_frobnicate"} and lacking == set()


def test_scheduler_only_ops_are_dispatched_only_when_asked(tmp_path: Path) -> None:
    """``Service.ops`` is the table, less the scheduler-only ops unless ``scheduler_ops``."""
    from cloudstore.generations import RetryingStore
    from cloudstore.local import LocalBackend
    from cloudstore.store.space import Space

    space = Space(RetryingStore(LocalBackend(str(tmp_path))), "")
    assert set(Service(space).ops) == PROTOCOL
    assert set(Service(space, scheduler_ops=True).ops) == set(OPS)
    assert SCHEDULER_ONLY == {"job_due", "job_claim", "job_claims", "job_finish", "lease_renew", "lease_take"}


# -- (b) the bridge


def test_the_bridges_labels_are_the_tables_names() -> None:
    assert _ops() == frozenset(OPS)
    assert all(_op_label(name) == name for name in OPS)
    assert _op_label("op_append") == "other"


# -- (c) the Python API


def test_the_api_has_one_method_per_op_of_the_protocol() -> None:
    for cls, extra in ((cloudstore.api.ops, API_OPS_EXTRA), (cloudstore.api.AgentHandle, HANDLE_EXTRA),
                       (cloudstore.aio.AsyncAgentHandle, HANDLE_EXTRA)):
        methods = public_methods(cls)
        assert extra <= methods, (cls.__qualname__, extra - methods)
        assert methods - extra == PROTOCOL, (cls.__qualname__, methods - extra ^ PROTOCOL)


# -- (d) the conformance suite


def _sent(tree: ast.AST) -> set[str]:
    """The ops a module sends: the op argument of an ``ask(agent, "<op>", ...)`` call, or ``{"op": "<op>"}``."""
    found = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "ask"
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)):
            found.add(node.args[1].value)
        elif isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if (isinstance(key, ast.Constant) and key.value == "op" and isinstance(value, ast.Constant)
                        and isinstance(value.value, str)):
                    found.add(value.value)
    return found


def _family_modules() -> dict[str, set[str]]:
    """Conformance family -> the ops its modules send; a module is a family's when it makes ``CheckSet("<family>")``."""
    sends: dict[str, set[str]] = {}
    for path in sorted(CONFORMANCE.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        families = {node.args[0].value for node in ast.walk(tree)
                    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "CheckSet"
                    and node.args and isinstance(node.args[0], ast.Constant)}
        for family in families:
            sends.setdefault(family, set()).update(_sent(tree))
    return sends


def test_each_op_of_the_protocol_is_sent_by_its_conformance_family() -> None:
    assert set(CONFORMANCE_FAMILY.values()) == set(FAMILIES)
    sends = _family_modules()
    assert set(FAMILIES) <= set(sends), set(FAMILIES) - set(sends)
    missing = {name: CONFORMANCE_FAMILY[OPS[name].family] for name in PROTOCOL
               if name not in sends[CONFORMANCE_FAMILY[OPS[name].family]]}
    assert missing == {}, "ops their conformance family never sends"


def test_the_scheduler_only_ops_are_sent_by_the_scheduler_alone() -> None:
    """No conformance family sends them (a driver need not answer them); the scheduler's client does."""
    sends = _family_modules()
    assert not any(SCHEDULER_ONLY & ops for ops in sends.values())
    client = ROOT / "cloudstore" / "scheduling" / "store_client.py"
    constants = {node.value for node in ast.walk(ast.parse(client.read_text(encoding="utf-8")))
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    assert SCHEDULER_ONLY <= constants, SCHEDULER_ONLY - constants


# -- (e) docs/protocol.md


def _protocol_md() -> tuple[set[str], set[str]]:
    """The ops of docs/protocol.md's op tables (first column under an ``| op |`` header), and the
    lower-case names its "Extensions of this project" section lists as bullets."""
    tabled: set[str] = set()
    extensions: set[str] = set()
    in_table, section = False, ""
    for line in (ROOT / "docs" / "protocol.md").read_text(encoding="utf-8").splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells:
            in_table = False
        elif cells[0] == "op":
            in_table = True
        elif in_table and not set(cells[0]) <= set("-: "):
            name = re.fullmatch(r"`([a-z_]+)`", cells[0])
            assert name, f"an op table's row names no op: {line!r}"
            tabled.add(name.group(1))
        bullet = re.match(r"- `([a-z_]+)`", line)
        if section == "Extensions of this project" and bullet:
            extensions.add(bullet.group(1))
    return tabled, extensions


def test_the_protocol_doc_names_exactly_the_protocols_ops() -> None:
    tabled, extensions = _protocol_md()
    assert tabled == PROTOCOL, ("in docs only", tabled - PROTOCOL, "in OPS only", PROTOCOL - tabled)
    assert extensions == SCHEDULER_ONLY, extensions ^ SCHEDULER_ONLY


# -- (f) the ops declared read-only write nothing


#: Arguments for each read-only op, on the store the test below fills first.
READ_ARGS: dict[str, dict[str, object]] = {
    "read": {"thread": "t1"}, "last": {"thread": "t1"}, "threads": {}, "leases": {"lapse_ms": 60000},
    "job_get": {"place": "waiting", "id": "j1"}, "job_list": {"place": "waiting"},
    "job_count": {"place": "waiting"}, "file_read": {"path": "skills/a.md"}, "file_list": {"folder": "skills"},
    "tools_read": {"thread": "t1"}, "tools_list": {},
}


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    """Every file below ``root``: its modification time (ns) and bytes."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


def test_the_ops_declared_read_only_change_nothing_stored(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``Op.read_only`` is what lets the bridge say "nothing was changed" of a reply it did not pass on
    (``bridge.server._what_changed``): each such op, answered as a driver answers it (its work after the
    reply included), leaves every stored file of a filled folder store as it was; an op not declared is
    a write (append here changes the tree, so the check can fail)."""
    from cloudstore.bridge.server import _what_changed
    from cloudstore.protocol.answerer import Answerer, setting_of

    declared = {name for name, op in OPS.items() if op.read_only}
    assert declared == set(READ_ARGS)
    folder = tmp_path / "store"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("LNK_BUCKET_URL", folder.as_uri())
    driver = Answerer(setting_of("file"))
    agent = {"id": "a", "owner": "o"}

    def send(op: str, **args: object) -> None:
        reply = driver.answer(json.dumps({"op": op, "agent": agent, **args}).encode())
        assert reply.get("reply") != "error", (op, reply)
        driver.after_reply()  # what the reply left for after it, as serve does it

    send("append", thread="t1", event={"seq": 1})
    send("take", thread="t1", holder="h", lapse_ms=60000)
    send("job_put", place="waiting", job={"id": "j1", "spec": {}, "due": 1900000000})
    send("file_write", path="skills/a.md", data="eA==", version=0)
    send("tools_narrow", thread="t1", tools=["search"])
    for name, args in READ_ARGS.items():
        before = _tree(folder)
        send(name, **args)
        assert _tree(folder) == before, name
        assert _what_changed(name) == "nothing was changed"
    before = _tree(folder)
    send("append", thread="t1", event={"seq": 2})
    assert _tree(folder) != before
    assert _what_changed("append").startswith("outcome unknown")

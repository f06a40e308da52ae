"""Fixtures for the conformance suite's own tests: the toy driver, run fresh each time.

The toy driver (tests/broken_drivers/toy_driver.py) is correct unless
TOY_BREAK names a defect; each test gives it a store folder of its own.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudstore.conformance import Report, run

TOY = Path(__file__).resolve().parent.parent / "broken_drivers" / "toy_driver.py"
#: The toy as an argv (the interpreter running the tests, not a PATH shim).
TOY_PROGRAM = (sys.executable, str(TOY))


@pytest.fixture
def toy(tmp_path: Path) -> Callable[..., Report]:
    """``toy(**env_and_run_options)``: run the suite against the toy, quick unless told otherwise.

    Upper-case keywords are the toy's environment (TOY_BREAK, TOY_KEEPS,
    TOY_CONTRACT); the rest go to :func:`cloudstore.conformance.run`.
    """
    count = iter(range(1000))

    def go(**options: Any) -> Report:
        env = {"TOY_STORE_DIR": str(tmp_path / f"store-{next(count)}")}
        env.update({k: v for k, v in options.items() if k.isupper()})
        kwargs = {k: v for k, v in options.items() if not k.isupper()}
        kwargs.setdefault("quick", True)
        return run(TOY_PROGRAM, env=env, **kwargs)

    return go

"""The upgrade matrix's fixtures: a fresh store on the folder and on moto, and release drivers on it.

``store`` here overrides the root conftest's: the matrix runs on the folder
(the fast loop) and on moto's S3 server, each test in a bucket of its own
there (a ``moto`` parameter: the root conftest marks that run ``slow``).
``fleet`` starts drivers of any release (``releases.HEAD`` for this
checkout) on the test's store and closes them afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from releases import Driver
from support import StoreUnderTest, fresh_agent, make_store

#: Where the matrix runs: the folder in the fast loop, moto in the slow tier.
MATRIX_BACKENDS = ("file", "moto")


@pytest.fixture(params=MATRIX_BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> StoreUnderTest:
    """A fresh store: a new folder, or a new moto bucket (nothing of another test in its listings)."""
    return make_store(request.param, request, tmp_path_factory, own_bucket=True)


@pytest.fixture
def agent() -> dict[str, Any]:
    """A fresh agent for the test's drivers to share."""
    return fresh_agent()


@pytest.fixture
def fleet(store: StoreUnderTest, agent: dict[str, Any]) -> Iterator[Callable[[str], Driver]]:
    """``fleet(release)``: a serve process of that release's driver on the test's store, bound to ``agent``."""
    started: list[Driver] = []

    def start(release: str) -> Driver:
        driver = Driver(release, store, agent)
        started.append(driver)
        return driver

    yield start
    for driver in started:
        driver.close()

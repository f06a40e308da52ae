"""The house's shape holds: every module in a layer, no import cycle, no arrow back up, no main imported.

Counted by ``tests/house.py`` over ``ast`` (nothing is imported), every import included, the ones
inside functions too; ``python tests/house.py`` prints the same figures for any checkout.
"""

from __future__ import annotations

import importlib
import subprocess
import sys

import house


def test_every_module_stands_in_a_layer() -> None:
    """A new folder or top-level module must be placed in ``house.LAYERS`` before it counts as housed."""
    unplaced = [m for m in house.modules(house.ROOT) if m != "cloudstore" and house.layer(m) is None]
    assert unplaced == []


def test_no_import_cycle_counting_imports_inside_functions() -> None:
    assert house.cycles(house.arrows()) == []


def test_no_arrow_runs_back_up_a_layer() -> None:
    assert house.upward(house.arrows()) == []


def test_the_root_imports_nothing_but_its_version_when_imported() -> None:
    """``lnk-gcs contract`` imports the root: the API and aio arrows run on first use only (PEP 562)."""
    assert house.root_arrows() == set()
    assert house.arrows()["cloudstore"] - {"cloudstore._version"} <= {t for _, t in house.LAZY_ROOT}


def test_no_module_imports_a_programs_main() -> None:
    assert house.mains_imported(house.arrows()) == []


def test_the_counts_see_what_they_are_for() -> None:
    """The rules catch each defect they exist for, on a graph made to hold it."""
    graph = {
        "cloudstore.s3": {"cloudstore.settings"},  # a backend reaching up to the opening layer
        "cloudstore.settings": {"cloudstore.s3"},  # ... and back: a cycle
        "cloudstore.api": {"cloudstore.driver"},  # the library importing a program's main
        "cloudstore.store.space": {"cloudstore.protocol.validate"},  # the storage importing the wire's rules
        "cloudstore": {"cloudstore.api", "cloudstore.aio"},  # the root's documented lazy arrows
        "cloudstore.driver": {"cloudstore.protocol.service"},  # a program importing the library: fine
    }
    assert house.cycles(graph) == [["cloudstore.s3", "cloudstore.settings"]]
    assert house.upward(graph) == [
        ("cloudstore.api", "cloudstore.driver"),
        ("cloudstore.s3", "cloudstore.settings"),
        ("cloudstore.store.space", "cloudstore.protocol.validate"),
    ]
    assert house.mains_imported(graph) == [("cloudstore.api", "cloudstore.driver")]


def test_an_import_inside_a_function_is_an_arrow(tmp_path) -> None:
    """The dodge the cycles used (an import put in a function) is counted, one under TYPE_CHECKING is not."""
    package = tmp_path / "cloudstore"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "s3.py").write_text("def f():\n    from .settings import SettingError\n")
    (package / "settings.py").write_text(
        "from typing import TYPE_CHECKING\nfrom . import s3\nif TYPE_CHECKING:\n    from .driver import x\n")
    (package / "driver.py").write_text("")
    graph = house.arrows(str(tmp_path))
    assert graph["cloudstore.s3"] == {"cloudstore.settings"}
    assert graph["cloudstore.settings"] == {"cloudstore.s3"}


def test_the_documented_import_paths_still_answer() -> None:
    """README and docs name these: the move into folders kept each one."""
    import cloudstore

    assert callable(cloudstore.open)
    assert isinstance(cloudstore.__version__, str)
    for name, attrs in {
        "cloudstore.api": ("open", "Store", "AgentHandle", "Job", "Took"),
        "cloudstore.aio": ("open",),
        "cloudstore.errors": ("CloudstoreError", "RefusedError", "FailedError", "OutcomeUnknownError"),
        "cloudstore.conformance": ("run", "FAMILIES", "Report"),
        "cloudstore.generations": ("RetryingStore", "Create", "Update", "Overwrite"),
    }.items():
        module = importlib.import_module(name)
        assert all(hasattr(module, a) for a in attrs), (name, [a for a in attrs if not hasattr(module, a)])
    assert cloudstore.aio is importlib.import_module("cloudstore.aio")


def test_the_script_prints_the_counts() -> None:
    done = subprocess.run([sys.executable, house.__file__], capture_output=True, text=True, timeout=60, check=True)
    assert "import cycles (every import, functions' too): 0" in done.stdout
    assert "arrows that run back up a layer: 0" in done.stdout
    assert "imports of a program's main: 0" in done.stdout

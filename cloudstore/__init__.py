"""cloudstore: Link store drivers that keep an agent's things in cloud buckets.

Kept import-free on purpose: ``lnk-gcs contract`` must answer without paying
for google-cloud-storage or boto3.  ``open`` (the Python API, cloudstore/api/__init__.py)
imports what it needs when called, and a cloud SDK only for a store of its kind;
the asyncio flavour is ``cloudstore.aio.open``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__ as __version__  # one place: cloudstore/_version.py

if TYPE_CHECKING:
    from .api import Store


def open(url: str, **settings: Any) -> Store:  # noqa: A001 - cloudstore.open, as io.open / gzip.open
    """Open the store ``url`` names (``file://``, ``s3://``, ``gs://``); see ``cloudstore.api.open``."""
    from .api import open as open_store

    return open_store(url, **settings)


def __getattr__(name: str) -> Any:
    """``cloudstore.aio`` without importing it first: loaded on first use (it imports no SDK either)."""
    if name == "aio":
        import importlib

        return importlib.import_module(".aio", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

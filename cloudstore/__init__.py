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


def open(  # noqa: A001 - cloudstore.open, as io.open / gzip.open
    url: str, *, create: bool = False, endpoint_url: str | None = None, region_name: str | None = None,
    concurrency: int = 8,
) -> Store:
    """Open the store ``url`` names: ``file:///ABSOLUTE/FOLDER``, ``s3://BUCKET[/PREFIX]``, ``gs://BUCKET[/PREFIX]``.

    ``create=True`` makes a ``file://`` folder that does not exist (without it,
    such a folder is refused, as the drivers refuse it; buckets are never
    made); ``endpoint_url`` / ``region_name`` override the environment's for
    ``s3://``; ``concurrency`` bounds the calls that run at once (8, the
    API's ``DEFAULT_CONCURRENCY``).  The keywords are spelt out here, not
    passed through as ``**settings``: this package is typed (``py.typed``),
    and a checker or ``help()`` should show them.  See ``cloudstore.api.open``.
    """
    from .api import open as open_store

    return open_store(url, create=create, endpoint_url=endpoint_url, region_name=region_name,
                      concurrency=concurrency)


def __getattr__(name: str) -> Any:
    """``cloudstore.aio`` without importing it first: loaded on first use (it imports no SDK either)."""
    if name == "aio":
        import importlib

        return importlib.import_module(".aio", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

"""The asyncio API on ``s3://`` needs the ``async`` extra, and says so (issue 29, item 12).

On eafe802 neither the README nor docs/api.md named the extra, and a missing
aiobotocore answered "the store URL names a store that cannot be opened",
blaming a URL that was right.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WITHOUT_AIOBOTOCORE = """
import asyncio, sys
sys.modules["aiobotocore"] = None  # as if not installed: importing it raises ImportError
import cloudstore.aio
from cloudstore.errors import CloudstoreError
async def main():
    async with cloudstore.aio.open("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9", region_name="us-east-1"):
        pass
try:
    asyncio.run(main())
except CloudstoreError as exc:
    assert isinstance(exc, ImportError), type(exc).__mro__
    print(type(exc).__name__, exc)
"""


def test_a_missing_aiobotocore_names_the_extra_not_the_url() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_AIOBOTOCORE], capture_output=True, text=True, timeout=60,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "MissingExtra" in done.stdout and "'cloudstore[async]'" in done.stdout, done.stdout
    assert "URL" not in done.stdout and "cannot be opened" not in done.stdout, done.stdout


def test_readme_and_api_doc_name_the_extra() -> None:
    from cloudstore.aio import MissingExtra  # the name the docs give exists

    assert issubclass(MissingExtra, ImportError)
    for doc in (ROOT / "README.md", ROOT / "docs" / "api.md"):
        text = doc.read_text()
        assert "'.[async]'" in text and "MissingExtra" in text, doc
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: pytest itself depends on tomli there
        import tomli as tomllib  # type: ignore[no-redef]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("aiobotocore") for r in extras["async"])

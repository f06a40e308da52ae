"""The header of a run: which program, its contract, which store and which mode are judged.

A report without it could not be read alone: a CI log of 74 PASS lines did
not say whether they judged the driver meant, on the store meant (a
setting left at a default, a stale PATH), in the mode meant.  The settings
are shown as given with ``--env`` (or, given none, the store URLs of this
environment), a credential never: a name that says secret, key, token,
password or credentials shows ``<hidden>``, and a URL its host and path
only (no user, password or query, where signed URLs keep their signature).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

from .._version import __version__
from ..protocol.answerer import BUCKET_SETTING, GCS_SETTING
from .expect import Json
from .faults import ENDPOINT_SETTINGS

HIDDEN = "<hidden>"
#: The settings naming a store or its endpoint for this project's drivers: what a header shows of this
#: environment when no --env is given (not every *_URL: a webhook's URL is a secret of its own).
STORE_SETTINGS = (BUCKET_SETTING.name, GCS_SETTING.name, *(name for name, _ in ENDPOINT_SETTINGS))
#: Setting names whose values are credentials (AWS_SECRET_ACCESS_KEY, AWS_ACCESS_KEY_ID, *_TOKEN, ...).
SECRET_NAME = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|ACCESS_KEY|PRIVATE|SESSION|AUTH|(^|_)KEY(_|$)",
                         re.IGNORECASE)


def shown_value(key: str, value: str) -> str:
    """``value`` as a header may show it: hidden for a credential, a URL without user, password or query."""
    if SECRET_NAME.search(key):
        return HIDDEN
    if "://" in value:
        try:
            url = urlsplit(value)
        except ValueError:
            return HIDDEN  # not a URL after all: nothing says what part of it is safe to show
        return urlunsplit((url.scheme, url.netloc.rpartition("@")[2], url.path, "", ""))
    return value


def shown_settings(given: Mapping[str, str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings naming the store, as shown: those given with ``--env``; with none given, this
    environment's :data:`STORE_SETTINGS`, which the driver then reads."""
    if given:
        return {k: shown_value(k, v) for k, v in given.items()}
    env = os.environ if environ is None else environ
    return {k: shown_value(k, env[k]) for k in STORE_SETTINGS if k in env}


def mode_words(*, mode: str, via_bridge: bool, quick: bool, faults: bool, crash: bool, rounds: int,
               families: Sequence[str] | None, checks: Sequence[str]) -> str:
    """The run's mode in words: which family set (conformance, faults, crash), how requests travel, how much."""
    kind = "faults" if faults else "crash" if crash else "conformance"
    way = "" if faults or crash else (", through a store bridge (--via-bridge)" if via_bridge else f", {mode}")
    what_quick = "one seeded fault per op" if faults else "one seeded kill moment per op" if crash \
        else "slow checks left out"
    depth = f"quick ({what_quick})" if quick else "full"
    chosen = f"; families {', '.join(families)}" if families else ""
    named = f"; checks naming {', '.join(map(repr, checks))}" if checks else ""
    races = "" if faults or crash else f", {rounds} round{'s' if rounds != 1 else ''} a race"
    return f"{kind}{way}, {depth}{races}{chosen}{named}"


def lines(argv: Sequence[str], contract: Mapping[str, Json], settings: Mapping[str, str], mode: str,
          given: bool) -> list[str]:
    """The header's lines (without the ``#`` the CLI puts before each)."""
    store = "; ".join(f"{k}={v}" for k, v in settings.items()) or "(none named)"
    source = "" if given else " (no --env: the driver reads its settings from this environment)"
    return [
        f"lnk-store-check {__version__} judging {shlex.join(argv)}",
        f"contract: {json.dumps(dict(contract), separators=(', ', ': '))}",
        f"store: {store}{source}",
        f"mode: {mode}",
    ]

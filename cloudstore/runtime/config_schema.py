"""A small, strict schema for the JSON config files of the long-running programs.

Why in-house: the configs are a few flat objects and lists, and what matters
is that a wrong value is refused at start-up with the key path that is wrong
(``agents[2].owner: must be a string or null, not 5``), instead of being
coerced (``"false"`` read as true, ``true`` read as 1 worker) or crashing with
a traceback later.  A general validator would be a new dependency for about
150 lines.

Strict means: a bool is not a number, numbers are finite and within their
range, strings are strings (text, without lone surrogates), null is taken
only where a field says so, and unknown keys are refused (a typo must not be
a silently ignored setting).  ``load_json`` also refuses ``NaN``/``Infinity``
and an object that names a key twice (JSON would keep the last one).

Only the config readers (``lnk-cloud-scheduler``, ``lnk-store-bridge``)
import this module; the store drivers never do, so their start-up cost does
not grow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import CloudstoreError
from . import strict_json

# A check beyond the type: the problem with the value, or None when it is fine.
Extra = Callable[[Any], str | None]


class ConfigFileError(CloudstoreError, ValueError):
    """A config file could not be used; the message says where and why."""


class SchemaError(ConfigFileError):
    """A value breaks the schema: ``path`` names it (``agents[2].owner``; ``""`` for the whole file)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem)


def shown(value: Any) -> str:
    """A value as JSON would spell it, cut short: what the operator wrote, not Python's repr."""
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def key_path(path: str, key: str) -> str:
    """``path.key``, or ``path["key"]`` when the key is not a plain name."""
    if key.isidentifier():
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key, ensure_ascii=False)}]"


class Spec:
    """One field's rule.  ``check`` returns the value (as the program will use it) or raises SchemaError."""

    what = "a value"  # how an error names what was wanted: "must be <what>"

    def check(self, value: Any, path: str) -> Any:
        raise NotImplementedError

    def wrong(self, value: Any, path: str) -> SchemaError:
        return SchemaError(path, f"must be {self.what}, not {shown(value)}")

    def takes(self, value: Any) -> bool:
        """Whether ``value`` has this spec's JSON type (``Either`` picks its branch by it)."""
        return True


def _extra(extra: Extra | None, value: Any, path: str) -> None:
    problem = extra(value) if extra is not None else None
    if problem is not None:
        raise SchemaError(path, problem)


@dataclass(frozen=True)
class Str(Spec):
    """A JSON string; not empty unless ``empty``; none of the characters in ``forbid`` (e.g. NUL)."""

    empty: bool = False
    forbid: str = ""
    extra: Extra | None = None

    @property
    def what(self) -> str:  # type: ignore[override]
        return "a string" if self.empty else "a non-empty string"

    def takes(self, value: Any) -> bool:
        return isinstance(value, str)

    def check(self, value: Any, path: str) -> str:
        if not isinstance(value, str) or (not self.empty and value == ""):
            raise self.wrong(value, path)
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise SchemaError(path, "is not valid Unicode text (it holds a lone surrogate)") from None
        bad = sorted({c for c in value if c in self.forbid})
        if bad:
            raise SchemaError(path, f"must not hold {', '.join(repr(c) for c in bad)}")
        _extra(self.extra, value, path)
        return value


@dataclass(frozen=True)
class Bool(Spec):
    """true or false; never a number or a string such as "false"."""

    what = "true or false"

    def check(self, value: Any, path: str) -> bool:
        if not isinstance(value, bool):
            raise self.wrong(value, path)
        return value


@dataclass(frozen=True)
class Int(Spec):
    """A JSON integer (not a bool, not 2.0) from ``low`` to ``high``."""

    low: int
    high: int

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"an integer from {self.low} to {self.high}"

    def check(self, value: Any, path: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not self.low <= value <= self.high:
            raise self.wrong(value, path)
        return value


@dataclass(frozen=True)
class Number(Spec):
    """A finite JSON number (integer or not; never a bool) over ``low`` (or from it) and up to ``high``."""

    low: float
    high: float
    low_included: bool = False

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"a number {'>=' if self.low_included else '>'} {self.low:g} and <= {self.high:g}"

    def check(self, value: Any, path: str) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.wrong(value, path)
        number = float(value) if not isinstance(value, int) or abs(value) < 2**63 else math.inf
        above = number >= self.low if self.low_included else number > self.low
        if not math.isfinite(number) or not above or number > self.high:
            raise self.wrong(value, path)
        return number


@dataclass(frozen=True)
class Nullable(Spec):
    """``inner``, or null (meaning "none": said only where a field takes it)."""

    inner: Spec

    @property
    def what(self) -> str:  # type: ignore[override]
        return f"{self.inner.what} or null"

    def takes(self, value: Any) -> bool:
        return value is None or self.inner.takes(value)

    def check(self, value: Any, path: str) -> Any:
        if value is None:
            return None
        if not self.inner.takes(value):
            raise self.wrong(value, path)
        return self.inner.check(value, path)


@dataclass(frozen=True)
class ListOf(Spec):
    """A JSON list of ``item``s, at least ``min_items`` of them; ``extra`` judges the whole list."""

    item: Spec
    min_items: int = 0
    extra: Extra | None = None

    @property
    def what(self) -> str:  # type: ignore[override]
        least = "a non-empty list" if self.min_items else "a list"
        return f"{least} of {self.item.what.removeprefix('a ').removeprefix('an ')}s"

    def takes(self, value: Any) -> bool:
        return isinstance(value, list)

    def check(self, value: Any, path: str) -> list[Any]:
        if not isinstance(value, list) or len(value) < self.min_items:
            raise self.wrong(value, path)
        out = [self.item.check(v, f"{path}[{i}]") for i, v in enumerate(value)]
        _extra(self.extra, out, path)
        return out


@dataclass(frozen=True)
class MapOf(Spec):
    """A JSON object whose keys are judged by ``key`` (a Str) and values by ``value``."""

    key: Str
    value: Spec
    what = "an object"

    def takes(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.wrong(value, path)
        out = {}
        for k, v in value.items():
            where = key_path(path, k)
            self.key.check(k, where)
            out[k] = self.value.check(v, where)
        return out


@dataclass(frozen=True)
class Either(Spec):
    """One of ``choices``, picked by the value's JSON type, so that an error names the inner path."""

    choices: Sequence[Spec]

    @property
    def what(self) -> str:  # type: ignore[override]
        return " or ".join(c.what for c in self.choices)

    def takes(self, value: Any) -> bool:
        return any(c.takes(value) for c in self.choices)

    def check(self, value: Any, path: str) -> Any:
        for choice in self.choices:
            if choice.takes(value):
                return choice.check(value, path)
        raise self.wrong(value, path)


@dataclass(frozen=True)
class Field:
    """One key of an ``Obj``: its spec, and whether it must be present."""

    spec: Spec
    required: bool = False


@dataclass(frozen=True)
class Obj(Spec):
    """A JSON object with exactly these keys (unknown ones refused); absent optional keys stay absent."""

    fields: Mapping[str, Field] = field(default_factory=dict)
    extra: Extra | None = None
    what = "an object"

    def takes(self, value: Any) -> bool:
        return isinstance(value, dict)

    def check(self, value: Any, path: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.wrong(value, path)
        for k in value:
            if k not in self.fields:
                raise SchemaError(key_path(path, k), f"unknown key (known: {', '.join(sorted(self.fields))})")
        for k, f in self.fields.items():
            if f.required and k not in value:
                raise SchemaError(key_path(path, k), "is required")
        out = {k: self.fields[k].spec.check(v, key_path(path, k)) for k, v in value.items()}
        _extra(self.extra, out, path)
        return out


def load_json(path: str) -> Any:
    """The JSON value in file ``path``; ConfigFileError (naming the file) when unreadable or not strict JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigFileError(f"{path}: cannot read it: {exc}") from None
    try:
        return strict_json.loads(text)
    except RecursionError:
        raise ConfigFileError(f"{path}: not valid JSON: nested too deep") from None
    except ValueError as exc:
        raise ConfigFileError(f"{path}: not valid JSON: {exc}") from None


def load_config(path: str, schema: Spec) -> Any:
    """The config file ``path`` checked against ``schema``; ConfigFileError naming the file and the key path."""
    raw = load_json(path)
    try:
        return schema.check(raw, "")
    except SchemaError as exc:
        raise ConfigFileError(f"{path}: {exc}") from None

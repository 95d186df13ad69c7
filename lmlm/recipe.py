"""One recipe format for the end-to-end commands: a dataclass built from a TOML table and ``--set`` assignments.

``lmlm pipeline`` (:class:`lmlm.pipeline.recipe.Recipe`), ``lmlm quickstart``
(:class:`lmlm.quickstart.QuickstartConfig`) and ``lmlm reproduce``
(:class:`lmlm.reproduce.config.ReproduceConfig`) read their configuration the same way: a preset (a row
of a preset table, a shipped TOML file or a TOML file of one's own) whose fields replace the
dataclass's defaults, then ``--set key=value`` assignments (``section.key=value`` inside a table), each
value read as TOML (a bare word as a string). An unknown field or a value of the wrong type is a
:class:`RecipeError` naming its place; every field has a default, so a recipe states only what differs.

Ground floor: imports only :mod:`lmlm.errors`.

Examples:
    >>> from lmlm.quickstart import QuickstartConfig
    >>> from_preset(QuickstartConfig, {"smoke": {"max_steps": 200}}, "smoke", ["lr=1e-3"]).lr
    0.001
"""

from __future__ import annotations

import copy
import sys
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from .errors import LmlmError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["RecipeError", "build", "parse_toml", "read_toml", "apply_set", "from_preset"]


class RecipeError(LmlmError, ValueError):
    """A recipe that cannot run; the message names the field and the value."""


def build(cls, data: Mapping[str, Any], where: str):
    """``cls`` from a TOML table: unknown keys are errors naming their place, sub-tables recurse."""
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in data.items():
        if key not in known:
            raise RecipeError(f"{where}: unknown field {key!r} (known: {', '.join(known)})")
        f = known[key]
        default = f.default_factory() if callable(f.default_factory) else f.default
        if is_dataclass(default):
            if not isinstance(value, dict):
                raise RecipeError(f"{where}: {key} must be a table")
            kwargs[key] = build(type(default), value, f"{where}.{key}")
        else:
            kwargs[key] = coerce(value, default, f"{where}.{key}", optional="None" in str(f.type))
    return cls(**kwargs)


def coerce(value: Any, default: Any, where: str, optional: bool = False) -> Any:
    """``value`` as the type of ``default`` (an int for a float field, a list for a tuple one), or an error."""
    if value is None and optional:
        return None
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise RecipeError(f"{where} must be true or false, got {value!r}")
        return value
    if isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(default, tuple) and isinstance(value, list):
        return tuple(value)
    if default is not None and not isinstance(value, type(default)):
        raise RecipeError(f"{where} must be a {type(default).__name__}, got {value!r}")
    return value


def parse_toml(text: str, where: str) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RecipeError(f"{where}: not TOML: {e}") from None


def read_toml(path: str | Path) -> dict[str, Any]:
    """The table of a TOML recipe file."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"{path}: no such recipe file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise RecipeError(f"{path}: not a TOML recipe (not UTF-8 text: {e.reason} at byte {e.start})") from None
    return parse_toml(text, str(path))


def apply_set(data: dict[str, Any], assignment: str) -> None:
    """Apply ``section.key=value`` (the value read as TOML, else as a string) to the raw recipe."""
    key, sep, raw = assignment.partition("=")
    if not sep or not key.strip():
        raise RecipeError(f"--set {assignment!r}: expected section.key=value")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    parts = key.strip().split(".")
    table = data
    for part in parts[:-1]:
        table = table.setdefault(part, {})
        if not isinstance(table, dict):
            raise RecipeError(f"--set {assignment!r}: {part} is not a table")
    table[parts[-1]] = value


def from_preset(cls, presets: Mapping[str, Mapping[str, Any]], name: str, sets: Iterable[str] = (),
                kind: str = "", **values):
    """``cls`` from preset ``name`` (a key of ``presets``, or a ``.toml`` file), then the ``sets``
    assignments, then ``values`` (keyword fields from Python); its ``name`` field is the preset's.

    Raises:
        RecipeError (a ``ValueError``): an unknown preset, an unknown field or a value of the wrong type.
    """
    if name.endswith(".toml"):
        data, where = {"name": Path(name).stem, **read_toml(name)}, name
    elif name in presets:
        data, where = {"name": name, **copy.deepcopy(presets[name])}, f"{kind} preset {name}".strip()
    else:
        raise RecipeError(f"unknown {kind + ' ' if kind else ''}preset {name!r}; known: {sorted(presets)}")
    for assignment in sets:
        apply_set(data, assignment)
    return build(cls, {**data, **values}, where)

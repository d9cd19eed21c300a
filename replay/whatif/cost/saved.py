"""A saved step-time model (``CostModel.save``'s JSON) read back, every field checked first.

The rule is one: each field has the type its dataclass declares (``CostModel``, ``OverlapModel``,
``ProfilePrior``, ``AddCost``, ``HostSpeed``), read from their annotations, and the few typed
``Any`` there have the shape their readers take (``SHAPES``); a fit is checked as
``LinearFit.to_dict`` writes it (``SavedFit``). Integers are >= 0 and numbers finite. A file that
does not match is one ``CostModelError`` naming the file and the field (``fits.decode.coef``),
before any object is built from it or any formatting meets a list where a number was due.
"""

from __future__ import annotations

import math
import types
from dataclasses import MISSING, fields, is_dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict, Union, get_args, get_origin, get_type_hints

from engine.errors import ReplayLLMError
from engine.profiling import PROFILE_FORMAT
from replay.whatif.cost.features import FEATURES, LinearFit
from replay.whatif.cost.overlap import OverlapModel
from replay.whatif.cost.profile import ProfilePrior
from tracing.layout import read_json_object

Feature = Annotated[str, FEATURES]  # a string naming one of ``features.FEATURES``
IGNORED = ("version", "target")  # written by ``to_dict``, read by nothing but the version check
MAX_SHOWN = 40  # characters of a wrong value quoted in the message


class CostModelError(ReplayLLMError):
    """A step-time model cannot be fitted or loaded."""


class HeldOut(TypedDict):
    """``fit.errors``: a held-out error."""

    n: int
    mape_pct: float
    sum_error_pct: float


class Coverage(TypedDict):
    """``explain.class_coverage``: the range one class's fit rests on."""

    size: Feature
    min: float
    max: float
    steady_max: float | None
    steps: int
    window_steps: int
    floor_known: bool


class Selection(TypedDict, total=False):
    """``fit.fit_all``'s report of one class (its candidates' scores are not read back)."""

    holdout: str


class OverlapHeldOut(TypedDict, total=False):
    host: dict[str, HeldOut]
    interval: dict[str, HeldOut]


class SavedFit(TypedDict):
    """``LinearFit.to_dict``; ``routes`` and ``route_s`` (one cost per route) may be absent."""

    intercept: float
    coef: dict[Feature, float]
    features: list[Feature]
    samples: int
    floor: float
    prefill_longest_s: float


class _Routes(TypedDict, total=False):
    routes: list[int]
    route_s: list[float]


# Fields whose declared type is looser than what reads them: (dataclass, field) -> shape.
Range = dict[Feature, tuple[float, float]]
SHAPES: dict[tuple[type, str], Any] = {
    (OverlapModel, "heldout"): OverlapHeldOut,
    (ProfilePrior, "profile_range"): dict[str, Range],
    (ProfilePrior, "trace_range"): dict[str, Range],
    (ProfilePrior, "mismatch"): dict[str, tuple[Any, Any]],
}
SAVED_AS: dict[type, Any] = {LinearFit: SavedFit}


class _Mismatch(Exception):
    """A field of the wrong type: its path in the file and what it must be."""


def read_saved(path: str | Path, version: int, cls: type, shapes: dict[str, Any]
               ) -> dict[str, Any]:
    """The fields of the model ``cls`` saved at ``path`` at ``version``, each checked
    (``shapes``: the model's own fields' shapes where looser than declared); a
    ``CostModelError`` for a file that cannot be read, of another version, or of any field
    missing, unknown or of the wrong type."""
    data = read_json_object(path, CostModelError, "cost model")
    if data.get("format") == PROFILE_FORMAT:  # said so, not "cost model version 1"
        raise CostModelError(
            f"{path}: a device profile (replayllm profile), not a saved cost model: give it "
            "as --profile beside a trace (whatif TRACE --profile PROFILE.json, or --timing-from "
            "TRACE --profile PROFILE.json; CostModel.fit(events, profile=...))")
    if "version" not in data:
        raise CostModelError(f"{path}: not a cost model file (no version field)")
    found = data["version"]
    if not (isinstance(found, int) and not isinstance(found, bool) and found == version):
        raise CostModelError(f"{path}: cost model version {found!r}, expected {version}")
    data = {k: v for k, v in data.items() if k not in IGNORED}
    try:
        _check_object(data, cls, "", {(cls, name): shape for name, shape in shapes.items()})
    except _Mismatch as exc:
        raise CostModelError(f"{path}: not a cost model file: {exc}") from None
    return data


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else f"a {type(value).__name__}"


def _check(value: Any, hint: Any, where: str, shapes: dict[tuple[type, str], Any]) -> None:
    """Raise ``_Mismatch`` unless ``value`` (at ``where``) is of type ``hint``."""
    origin, args = get_origin(hint), get_args(hint)
    hint = SAVED_AS.get(hint, hint)
    if hint is Any:
        return
    if origin in (Union, types.UnionType):  # only ``X | None`` is declared
        if value is None and type(None) in args:
            return
        _check(value, next(a for a in args if a is not type(None)), where, shapes)
    elif origin is Annotated:
        _check(value, args[0], where, shapes)
        if value not in args[1]:
            raise _Mismatch(f"{where} must be one of {', '.join(args[1])}, got {_shown(value)}")
    elif hint in (int, float, bool, str):
        _check_scalar(value, hint, where)
    elif origin in (list, tuple):
        fixed = origin is tuple and args[-1] is not Ellipsis
        if not isinstance(value, list) or (fixed and len(value) != len(args)):
            size = f" of {len(args)}" if fixed else ""
            raise _Mismatch(f"{where} must be a list{size}, got {_shown(value)}")
        for i, item in enumerate(value):
            _check(item, args[i] if fixed else args[0], f"{where}[{i}]", shapes)
    elif origin is dict:
        if not isinstance(value, dict):
            raise _Mismatch(f"{where} must be a JSON object, got {_shown(value)}")
        for key, item in value.items():
            _check(key, args[0], f"{where} key", shapes)
            _check(item, args[1], f"{where}.{key}", shapes)
    else:
        _check_object(value, hint, where, shapes)


def _check_scalar(value: Any, hint: type, where: str) -> None:
    if hint is bool:
        ok, what = isinstance(value, bool), "true or false"
    elif hint is str:
        ok, what = isinstance(value, str), "a string"
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        what = "an integer >= 0"
    else:
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool)
              and math.isfinite(value))
        what = "a finite number"
    if not ok:
        raise _Mismatch(f"{where} must be {what}, got {_shown(value)}")


def _check_object(value: Any, cls: Any, where: str, shapes: dict[tuple[type, str], Any]
                  ) -> None:
    """A dataclass's fields (all its init fields, none other; those without a default
    required) or a TypedDict's keys (others ignored)."""
    if not isinstance(value, dict):
        raise _Mismatch(f"{where} must be a JSON object, got {_shown(value)}")
    hints = get_type_hints(cls, include_extras=True)
    if is_dataclass(cls):
        names = [f.name for f in fields(cls) if f.init]
        required = {f.name for f in fields(cls)
                    if f.init and f.default is MISSING and f.default_factory is MISSING}
        unknown = sorted(set(value) - set(names))
        if unknown:
            raise _Mismatch(f"unknown field {_join(where, unknown[0])}")
    else:
        names, required = list(hints), set(cls.__required_keys__)
    for name in names:
        if name in value:
            _check(value[name], shapes.get((cls, name), SHAPES.get((cls, name), hints[name])),
                   _join(where, name), shapes)
        elif name in required:
            raise _Mismatch(f"{_join(where, name)} is missing")
    if cls is SavedFit:
        _check_object(value, _Routes, where, shapes)
        missing = [name for name in FEATURES if name not in value["coef"]]
        if missing:
            raise _Mismatch(f"{_join(where, 'coef')}.{missing[0]} is missing")
        if len(value.get("routes", ())) != len(value.get("route_s", ())):
            raise _Mismatch(f"{_join(where, 'route_s')} must hold one cost per route")


def _join(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


# ``CostModel``'s fields typed looser than read (``explain``): passed to ``read_saved``.
MODEL_SHAPES: dict[str, Any] = {"heldout": dict[str, HeldOut],
                                "coverage": dict[str, Coverage],
                                "selection": dict[str, Selection]}

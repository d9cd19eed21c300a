"""The variants a what-if runs: ``--set`` and ``--grid`` values parsed and checked, crossed into
one ``(name, overrides)`` per variant (``whatif`` and ``tune``); and ``whatif``'s step-time model
options, checked before any work (``profile_option``, ``check_model_options``)."""

from __future__ import annotations

import itertools
import os
from typing import Any

from engine.config import Config, parse_override
from engine.config import parse_overrides as config_parse_overrides
from engine.errors import ConfigError, ReplayLLMError
from replay.whatif.simulate import format_overrides


class WhatifError(ReplayLLMError):
    """Bad whatif arguments."""


def parse_value(key: str, text: str) -> Any:
    """A typed, range-checked Config value; errors name the field and what it accepts."""
    value = parse_override(key, text.strip())
    try:
        # The field's own rule, checked on a base where no cross-field rule can object.
        Config(policy="chunked").replace(**{key: value})
    except ConfigError as exc:
        raise ConfigError(str(exc)) from None
    return value


def parse_overrides(items: list[str]) -> dict[str, Any]:
    return config_parse_overrides(items, parse_value)


def parse_grid(items: list[str], fixed: dict[str, Any] | None = None,
               option: str = "--grid") -> dict[str, list[Any]]:
    """``--grid KEY=V1,V2,...`` items as value lists; a key given twice, an empty value, a
    value given twice (``1,01``: two variants of one name) or a key also fixed by ``--set``
    (``fixed``) is an error, not a variant silently dropped or doubled.
    ``option``: the flag the items came with, as errors name it (``tune``'s ``--space``)."""
    twice = f"{option} and {option}" + (" or --set" if fixed is not None else "")
    out: dict[str, list[Any]] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        values = text.split(",")
        if not sep or not text.strip() or not all(v.strip() for v in values):
            raise WhatifError(f"{option} expects KEY=V1,V2,... (no empty value), got {item!r}")
        if key in out or key in (fixed or {}):
            raise WhatifError(f"{key} is given twice ({twice})")
        out[key] = [parse_value(key, v) for v in values]
        repeated = [v for i, v in enumerate(out[key]) if v in out[key][:i]]
        if repeated:  # two variants of one name: their rows could not be told apart
            raise WhatifError(f"{option} {key}: the value {repeated[0]} is given twice "
                              f"(in {item!r})")
    return out


def build_variants(
    overrides: dict[str, Any], grid: dict[str, list[Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """(name, overrides) per variant: the --set values, crossed with every grid combination."""
    if not grid:
        return [(format_overrides(overrides), overrides)]
    keys = list(grid)
    variants = []
    for combo in itertools.product(*(grid[k] for k in keys)):
        point = dict(zip(keys, combo))
        variants.append((format_overrides(point), {**overrides, **point}))
    return variants


def check_some_ran(results: list[Any]) -> None:
    """The exit rule of ``whatif``, streamed or not: where no variant could run (each a
    ``SimResult``), one line naming each one's status (exit 2), once the table and outputs
    are written."""
    if not any(r.ok for r in results):
        statuses = "; ".join(f"{r.name}: {r.status}" for r in results)
        raise WhatifError(f"no variant could run ({statuses})")


def profile_option(given: list[str] | None) -> tuple[str | None, list[str]]:
    """``whatif --profile``'s one argument (its flag collects each use) with each file named
    once, and the notes to print. Several profiles, comma-separated, are pooled by each point's
    median, so a file named again would outweigh the others (``P,P,Q``: Q counts for nothing):
    it is pooled once, and a note says so. The flag given twice kept the last one only: one
    line (``A.json,B.json`` pools both)."""
    if not given:
        return None, []
    if len(given) > 1:
        raise WhatifError("--profile is given twice: name the profiles to pool in one "
                          "--profile A.json,B.json")
    from replay.whatif.cost.profile import PROFILE_SEPARATOR, profile_paths

    paths = profile_paths(given[0])
    kept: dict[str, str] = {}  # the file (however spelled) -> the first spelling
    repeated: list[str] = []
    for path in paths:
        same = os.path.realpath(path)
        if same not in kept:
            kept[same] = path
        elif kept[same] not in repeated:
            repeated.append(kept[same])
    if not repeated:
        return given[0], []
    return PROFILE_SEPARATOR.join(kept.values()), [
        f"note: --profile names {path} more than once: pooled once (a repeat would outweigh "
        "the other profiles in each point's median)" for path in repeated]


def check_model_options(workload: str | None, timing_from: str | None, options: dict[str, Any]
                        ) -> None:
    """``options`` (flag -> value given) shape a step-time model: with ``--workload`` the only
    model is ``--timing-from``'s, so without it they were ignored in silence (exit 0)."""
    given = [flag for flag, value in options.items() if value]
    if workload is not None and not timing_from and given:
        raise WhatifError(f"{' and '.join(given)} shape the step-time model, which --workload "
                          "has only from --timing-from TRACE: give it, or drop them")

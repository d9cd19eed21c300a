"""``load_profile`` validates what it reads (``tracing.validate.check_profile_rows``), so every
reader of a device profile (``whatif --profile``, ``read_profile``'s pooling, tools) gets a
``ProfileError`` naming the file and the field instead of a TypeError / KeyError / ValueError in
the fit, or a row timed "nan" fitted in silence; and every committed profile still loads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from engine.profiling import ProfileError, load_profile
from replay.whatif.cost.profile import read_profile

PROFILES = sorted((Path(__file__).resolve().parents[2] / "traces" / "profiles").glob("*.json"))


def _row(**change: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda p: {**p, "rows": [{**p["rows"][0], **change}, *p["rows"][1:]]}


EDITS: list[tuple[Callable[[dict[str, Any]], dict[str, Any]], str]] = [
    (lambda p: {**p, "key": "x"}, "key must be a JSON object"),
    (lambda p: {**p, "rows": "x"}, "rows must be a list"),
    (lambda p: {**p, "rows": [1]}, "profile row 0 must be a JSON object"),
    (lambda p: {**p, "rows": [{}]}, "kind must be one of"),
    (_row(interval_s="nan"), "interval_s must be a finite number"),
    # A step timed past an hour is an edit or a broken clock: fitted, it priced a tiny model's
    # run at 7.6e299 s, printed in full (found by the what-if round, session 35).
    (_row(interval_s=1e300), "interval_s must be a finite number"),
    (_row(duration_s=4000.0), "duration_s must be a finite number"),
    (_row(num_seqs=-1), "num_seqs must be an integer >= 0"),
    (_row(graph_used="no"), "graph_used must be true or false"),
    (_row(label=None), "label must be a string"),
    (_row(prefix_groups="2"), "prefix_groups must be an integer >= 0"),
    (_row(decode_context_max=-5), "decode_context_max must be an integer >= 0"),
    (_row(cached_tokens=1.5), "cached_tokens must be an integer >= 0"),
    (_row(eager="yes"), "eager must be true or false"),
]


def test_every_committed_profile_loads() -> None:
    """The checks accept every profile in traces/profiles (each row of each)."""
    assert PROFILES
    for path in PROFILES:
        assert load_profile(path)["rows"], path


@pytest.mark.parametrize("edit, needle", EDITS, ids=[needle for _, needle in EDITS])
def test_a_wrong_typed_profile_is_a_profile_error(tmp_path: Path, edit: Any, needle: str) -> None:
    """A profile of the right format and version whose key or a row is of the wrong type or out
    of bounds: ``load_profile`` raises ``ProfileError`` naming the file and the field, read alone
    or pooled with a good profile (``read_profile``); it returned the data before."""
    bad = tmp_path / "bad.profile.json"
    bad.write_text(json.dumps(edit(json.loads(PROFILES[0].read_text()))))
    with pytest.raises(ProfileError, match=needle) as caught:
        load_profile(bad)
    assert str(caught.value).startswith(f"{bad}: ")
    with pytest.raises(ProfileError, match=needle):
        read_profile(f"{PROFILES[0]},{bad}")


def test_a_profile_without_rows_still_says_so(tmp_path: Path) -> None:
    """No rows (absent or empty) stays "no timed steps", after the type checks."""
    data = json.loads(PROFILES[0].read_text())
    for rows in ({}, {"rows": []}):
        bad = tmp_path / "empty.json"
        bad.write_text(json.dumps({k: v for k, v in data.items() if k != "rows"} | rows))
        with pytest.raises(ProfileError, match="no timed steps"):
            load_profile(bad)

"""The engine benchmark's variant names (benchmarks/engine.py): a policy, its token budget and
``@KEY=VALUE`` settings, turned into the Config overrides a variant runs with."""

from __future__ import annotations

import pytest

from benchmarks.engine import _variant_overrides
from engine.errors import ConfigError


def test_a_policy_and_its_budget() -> None:
    assert _variant_overrides("chunked") == {"policy": "chunked"}
    assert _variant_overrides("chunked-2048") == {"policy": "chunked",
                                                  "max_num_batched_tokens": 2048}


def test_settings_after_the_policy_are_typed_config_overrides() -> None:
    assert _variant_overrides("chunked-2048@overlap_mixed_steps=false") == {
        "policy": "chunked", "max_num_batched_tokens": 2048, "overlap_mixed_steps": False}
    with pytest.raises(ConfigError, match="unknown config key"):
        _variant_overrides("chunked@no_such_field=1")

"""``SamplingParams`` takes what users pass from vLLM code and numpy sweeps, and never drops a
setting silently.

Before: ``stop=None`` (vLLM's default) and ``stop=5`` raised a bare ``TypeError``; a generator
of stop strings was consumed by the check and the request ran with none; numpy numbers
(``np.int64`` max_tokens, ``np.float32`` temperature) were refused as "must be an integer, got
np.int64(5)".
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams


def test_stop_none_is_no_stop_strings() -> None:
    assert SamplingParams(stop=None).stop == ()  # type: ignore[arg-type]


def test_stop_strings_from_a_generator_are_kept() -> None:
    params = SamplingParams(stop=(s for s in ["\n\n", "END"]))  # type: ignore[arg-type]
    assert params.stop == ("\n\n", "END")


@pytest.mark.parametrize("stop", [5, "ab", ["a", None], [""], (s for s in ["a", ""])])
def test_a_bad_stop_is_one_clear_error(stop: object) -> None:
    with pytest.raises(InvalidRequestError, match="stop must be a sequence of non-empty strings"):
        SamplingParams(stop=stop)  # type: ignore[arg-type]


def test_numpy_numbers_are_taken_as_python_numbers() -> None:
    params = SamplingParams(temperature=np.float32(0.5), max_tokens=np.int64(7),
                            top_p=np.float32(0.25), top_k=np.int32(3), seed=np.uint64(9))
    assert params == SamplingParams(temperature=0.5, max_tokens=7, top_p=0.25, top_k=3, seed=9)
    for name in ("temperature", "top_p"):
        assert type(getattr(params, name)) is float
    for name in ("max_tokens", "top_k", "seed"):
        assert type(getattr(params, name)) is int


@pytest.mark.parametrize("field, value", [("max_tokens", np.float64(3.0)), ("max_tokens", True),
                                          ("top_k", np.bool_(True)), ("seed", 1.5),
                                          ("temperature", np.bool_(True))])
def test_a_number_of_the_wrong_kind_is_still_refused(field: str, value: object) -> None:
    with pytest.raises(InvalidRequestError, match=field):
        SamplingParams(**{field: value})  # type: ignore[arg-type]

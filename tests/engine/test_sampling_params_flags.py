"""``SamplingParams.ignore_eos`` must be a bool, and a request's priority may be any integer
numpy gives, as ``max_tokens`` and ``seed`` may.

Before: ``ignore_eos`` was the one field never checked. ``SamplingParams(ignore_eos="no")``
(or ``"false"`` read from a config file) was truthy: the engine ignored EOS and the trace
recorded ``ignore_eos=True``, silently the opposite of what was asked. And a numpy integer
priority (``priorities=list(np_array)``) was refused with "priority must be an integer ...,
got np.int64(2)", an integer, while ``max_tokens=np.int64(3)`` was taken.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.config import Config
from engine.engine_core import EngineCore
from engine.errors import InvalidRequestError
from engine.executor import NullExecutor
from engine.sampling_params import SamplingParams
from tracing.sink import MemorySink


@pytest.mark.parametrize("value", ["no", "false", "True", 0, 1, None, 1.0],
                         ids=["no", "false", "True-str", "zero", "one", "none", "float"])
def test_an_ignore_eos_that_is_not_a_bool_is_refused_by_name(value: object) -> None:
    with pytest.raises(InvalidRequestError, match="ignore_eos must be True or False"):
        SamplingParams(ignore_eos=value)  # type: ignore[arg-type]


def test_numpy_bools_are_taken_as_plain_bools() -> None:
    """A workload column read with numpy holds ``np.bool_``: taken, stored as ``bool``."""
    for value in (True, False):
        params = SamplingParams(ignore_eos=np.bool_(value))
        assert params.ignore_eos is value


def test_a_numpy_integer_priority_is_taken_and_recorded_as_an_int() -> None:
    core = EngineCore(Config(num_kvcache_blocks=16, kvcache_block_size=4, max_model_len=32,
                             max_num_batched_tokens=32, policy="priority"),
                      NullExecutor(16), sink=MemorySink())
    params = SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True)
    core.add_request([1, 2, 3], params, priority=np.int64(5))
    core.add_request([4, 5, 6], params, priority=np.int32(-1))
    core.run_until_idle()
    core.close()
    recorded = core.sink.tables["request_added"]["priority"]
    assert recorded == [5, -1] and all(type(p) is int for p in recorded)
    assert core.sink.tables["seq_scheduled"]["seq_id"][0] == 1, "priority -1 is served first"
    with pytest.raises(InvalidRequestError, match="priority must be an integer"):
        core.add_request([1], params, priority=np.bool_(True))

"""A user policy whose hook is not a method (``eviction_key = 3`` as a class attribute: a typo,
or a setting given a hook's name) is refused when the policy is built, in one line naming the
hook, what it holds and where it was set.

Before: the hook's first call said only "raised TypeError: 'int' object is not callable in
eviction_key", as if the policy's code had failed, and only when the scheduler first called the
hook: at engine start for ``eviction_key``, mid-run for ``admit`` and ``chunk``, never for a
``victim`` no run needed. Real methods (static, class methods, callables set in ``__init__``)
are still accepted."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.config import Config
from engine.policy import make_policy
from engine.policy_guard import GuardedPolicy, PolicyError
from replay.testing import RequestSpec, Workload, run_workload

POLICIES = """
    from engine.policy import Policy


    class KeyThree(Policy):
        eviction_key = 3


    class AdmitNone(Policy):
        admit = None


    class Base(Policy):
        chunk = "all"


    class Inherits(Base):
        pass


    class VictimProperty(Policy):
        @property
        def victim(self):
            return 5


    class SetInInit(Policy):
        def __init__(self, config):
            super().__init__(config)
            self.admit = [1, 2]


    class FineOnes(Policy):
        @staticmethod
        def chunk(seq, remaining, step):
            return remaining

        @classmethod
        def victim(cls, candidates, step):
            return candidates[-1]

        def __init__(self, config):
            super().__init__(config)
            self.eviction_key = lambda block: block.released
"""


def _config(policy: str) -> Config:
    return Config(policy=policy, kvcache_block_size=2, num_kvcache_blocks=8, max_model_len=16,
                  max_num_batched_tokens=16)


@pytest.fixture
def module(policy_module) -> str:
    return policy_module("bad_hooks", POLICIES)


@pytest.mark.parametrize("cls, message", [
    ("KeyThree", "eviction_key is 3 (int), a class attribute of KeyThree, not a method"),
    ("AdmitNone", "admit is None (NoneType), a class attribute of AdmitNone, not a method"),
    ("Inherits", "chunk is 'all' (str), a class attribute of Base, not a method"),
    ("VictimProperty", "victim is 5 (int), a property of VictimProperty, not a method"),
    ("SetInInit", "admit is [1, 2] (list), set on the instance (in __init__), not a method"),
])
def test_a_hook_that_is_not_a_method_is_named_when_the_policy_is_built(
        module: str, cls: str, message: str) -> None:
    """make_policy raises the PolicyError naming the hook, its value and where it was set."""
    with pytest.raises(PolicyError) as error:
        make_policy(_config(f"{module}:{cls}"))
    text = str(error.value)
    assert text.startswith(f"policy '{module}:{cls}': {message}"), text
    assert "def " in text and "(self, " in text and "\n" not in text


def test_run_workload_reports_it_at_engine_start_before_any_step(module: str) -> None:
    """Through replay.testing: the ``policy`` violation at engine start, for a hook (chunk)
    the old code reached only in a step."""
    run = run_workload(Workload(_config(f"{module}:Inherits"),
                                (RequestSpec(0, (1, 2), 2, True, (3, 3)),)))
    assert list(run.violations) == ["policy"]
    assert run.violations["policy"][0].startswith(
        f"engine start: policy '{module}:Inherits': chunk is 'all' (str)")


def test_real_methods_of_every_kind_still_run(module: str) -> None:
    """Static and class methods and a callable set in __init__ are methods enough."""
    assert isinstance(make_policy(_config(f"{module}:FineOnes")), GuardedPolicy)
    run = run_workload(Workload(_config(f"{module}:FineOnes"),
                                (RequestSpec(0, (1, 2), 2, True, (3, 3)),)))
    assert run.violations == {}


def test_the_cli_prints_one_line(module: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``replayllm run`` exits 2 with the one line, no traceback."""
    from replay.cli.main import main

    code = main(["run", "--num-seqs", "2", "--out", str(tmp_path / "t"),
                 "--set", f"policy={module}:KeyThree"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and err.count("\n") == 1
    assert "eviction_key is 3 (int), a class attribute of KeyThree, not a method" in err

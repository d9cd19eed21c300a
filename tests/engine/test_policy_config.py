"""A policy named the wrong way in ``Config`` says the right way.

What these tests prove:

- ``Config(policy=MyPolicy)`` (the class, or an instance) was ``policy must be str, got <class
  ...>``, not saying what to give; it names the import path 'module:Class' to give, as
  ``policy_class`` already did for ``workloads(policies=(MyPolicy,))``.
- ``policy="sjf.ShortestJobFirst"`` (a dot where the colon belongs) was the generic ``policy
  must be one of 'prefill_first', ... or an import path package.module:ClassName``: it suggests
  ``sjf:ShortestJobFirst`` when the module imports and has the class, and says the class
  follows a colon when the string only looks like a dotted path. A built-in's misspelling is
  still the generic message.
"""

from __future__ import annotations

import pytest

from engine.config import Config, parse_overrides
from engine.errors import ConfigError
from engine.policy import Policy

SJF = """
    from engine.policy import Policy


    class ShortestJobFirst(Policy):
        pass
"""


class Inline(Policy):
    """A policy handed to Config as an object."""


@pytest.mark.parametrize("given", [Inline, "instance"])
def test_a_policy_class_in_config_names_the_import_path_to_give(given) -> None:
    value = Inline(Config()) if given == "instance" else Inline
    with pytest.raises(ConfigError) as caught:
        Config(policy=value)  # type: ignore[arg-type]
    text = str(caught.value)  # was: policy must be str, got <class '...Inline'>
    assert f"give a policy by its import path as a string, '{__name__}:Inline'" in text, text


def test_another_non_string_policy_still_says_a_string_is_wanted() -> None:
    with pytest.raises(ConfigError, match="policy must be a built-in's name or an import path"):
        Config(policy=3)  # type: ignore[arg-type]


def test_a_dot_where_the_colon_belongs_suggests_the_import_path(policy_module) -> None:
    module = policy_module("s38b_sjf", SJF)
    with pytest.raises(ConfigError) as caught:
        Config(policy=f"{module}.ShortestJobFirst")
    assert str(caught.value) == (
        f"policy '{module}.ShortestJobFirst': an import path names the class after a colon: "
        f"give '{module}:ShortestJobFirst'")
    assert Config(policy=f"{module}:ShortestJobFirst").policy == f"{module}:ShortestJobFirst"


def test_a_dotted_path_whose_module_is_missing_still_says_where_the_colon_goes() -> None:
    with pytest.raises(ConfigError) as caught:
        Config(**parse_overrides(["policy=no_such_pkg_q.sched.Fair"]))
    text = str(caught.value)
    assert "policy 'no_such_pkg_q.sched.Fair': an import path names the class after a colon" \
        in text, text
    assert "'no_such_pkg_q.sched:Fair'" in text and "cannot import no_such_pkg_q.sched" in text


def test_a_misspelt_builtin_keeps_the_list_of_builtins() -> None:
    with pytest.raises(ConfigError, match="policy must be one of 'prefill_first'"):
        Config(policy="chunkd")

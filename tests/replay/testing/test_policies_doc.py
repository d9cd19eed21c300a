"""docs/policies.md runs as written: its policy modules are written to a temporary directory,
its ``# run`` blocks execute (live on the CPU tiny model, verify, what-if on a committed trace),
its property test passes, and the broken policy's property test fails with the report shown.
Then the recorded trace under an edited policy: ``replayllm verify`` notes the change before
replaying and still reports the first divergence."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from hypothesis import settings

from replay.testing import PropertyViolations
from replay.testing.strategies import scaled

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "policies.md"
BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _blocks() -> list[tuple[str, str]]:
    out = []
    for body in BLOCK.findall(DOC.read_text()):
        tag, _, code = body.partition("\n")
        out.append((tag.removeprefix("# ").strip(), code))
    return out


def test_the_policy_guide_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(REPO)
    namespace: dict[str, object] = {"tmp": tmp_path}
    tags = []
    for tag, code in _blocks():
        tags.append(tag)
        if tag.endswith(".py"):
            (tmp_path / tag).write_text(code)
            sys.modules.pop(tag[:-3], None)
            continue
        exec(compile(code, f"{DOC}:{tag}", "exec"), namespace)  # noqa: S102
        # The guide's property tests at a fifth of the profile's examples (the suite's own
        # property test covers the built-ins at full depth).
        tests = [settings(max_examples=scaled(0.2))(v) for k, v in namespace.items()
                 if k.startswith("test_") and callable(v)]
        if tag == "test":
            for test in tests:
                test()
        elif tag == "test-fails":
            with pytest.raises(PropertyViolations) as failure:
                tests[0]()
            report = str(failure.value)
            assert "properties violated: progress" in report
            assert "scheduler made no progress" in report and "rebuild it: Workload(" in report
        for name in [k for k in namespace if k.startswith("test_")]:
            del namespace[name]
    assert tags == ["sjf.py", "run", "run", "test", "test", "short_only.py", "test-fails"]
    assert "identical:" in capsys.readouterr().out

    # Edit the policy the trace was recorded with: verify says so first, then diverges.
    from replay.cli.main import main

    module = tmp_path / "sjf.py"
    module.write_text(module.read_text().replace("key=lambda s: s.num_tokens)",
                                                 "key=lambda s: s.num_tokens, reverse=True)"))
    sys.modules.pop("sjf", None)
    code = main(["verify", str(tmp_path / "sjf-trace")])
    out = capsys.readouterr().out.splitlines()
    assert code != 0
    assert out[0].startswith("note: policy sjf:ShortestJobFirst: its source changed")
    assert out[1].startswith("diverged at event")


VIEWS_POLICY = """\
from engine.policy import Chunked


class Remember(Chunked):
    seen = []  # every view chunk() was given, in order

    def chunk(self, seq, remaining, step):
        Remember.seen.append(seq)
        return 1
"""


def test_the_guides_hint_on_views_across_steps_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The guide says how a policy remembers sequences across steps (a view is a new object each
    step: ``==``, keys by the view or ``seq.seq_id``, never ``is``; no ``isinstance(...,
    Sequence)``) and each thing it says holds for a user policy run by the engine."""
    from engine.config import Config
    from engine.engine_core import EngineCore
    from engine.executor import NullExecutor
    from engine.policy_view import SequenceView
    from engine.sampling_params import SamplingParams
    from engine.sequence import Sequence
    from tracing.sink import MemorySink

    text = " ".join(DOC.read_text().split())
    for said in ("A view is a new object at each step", "compares them with `==`, never `is`",
                 "`seq.seq_id`", "`isinstance(seq, engine.sequence.Sequence)` is False",
                 "`isinstance(seq, SequenceView)` (`from engine.policy_view import SequenceView`)"):
        assert said in text, said
    (tmp_path / "remember.py").write_text(VIEWS_POLICY)
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("remember", None)
    cfg = Config(kvcache_block_size=2, num_kvcache_blocks=16, max_model_len=16,
                 max_num_batched_tokens=16, max_num_seqs=4, policy="remember:Remember")
    core = EngineCore(cfg, NullExecutor(16, vocab_size=100), sink=MemorySink())
    core.add_request([1, 2, 3], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True))
    core.step()
    core.step()
    first, second = sys.modules["remember"].Remember.seen[:2]
    assert first == second and first is not second and hash(first) == hash(second)
    assert {first: "kept"}[second] == "kept" and first.seq_id == second.seq_id
    assert not isinstance(first, Sequence) and isinstance(first, SequenceView)

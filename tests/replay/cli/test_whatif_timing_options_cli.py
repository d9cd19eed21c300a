"""``--profile`` and ``--cost-option`` are never dropped in silence.

With ``--stream``, the step-time model was loaded without the command's arguments: a
``--profile``, ``--cost-option`` or ``--host-from`` given with ``whatif --workload FILE
--timing-from TRACE --stream`` was ignored, and the prediction was the plain model's. With
``--timing-from MODEL.json`` (a saved model, fitted already) ``--profile`` and ``--cost-option``
were ignored with or without ``--stream``, and a profile's option (``profile_mode``,
``profile_scale``) without ``--profile`` changed nothing. The streamed command now fits the model
it is told to, as without streaming, and a saved model with either option, or a profile's option
without a profile, is one line, exit 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _cli import SAMPLE, message_lines, run_cli, write_jsonl

REQUESTS = [{"prompt_token_ids": list(range(1, 9 + i)), "max_tokens": 3, "temperature": 0.0,
             "ignore_eos": True} for i in range(4)]


def _model_options(out: Path) -> dict:
    return json.loads((out / "cost_model.json").read_text())["options"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_cost_option_reaches_the_model(tmp_path: Path, stream: bool) -> None:
    """``--cost-option overlap=off``: the model the run used (its saved ``cost_model.json``)
    has the option, streamed or not."""
    workload = write_jsonl(tmp_path / "w.jsonl", REQUESTS)
    out = tmp_path / "out"
    code, _, stderr = run_cli(["whatif", "--workload", str(workload), "--timing-from",
                               str(SAMPLE), "--cost-option", "overlap=off", "--out", str(out),
                               "--no-plots", *(["--stream"] if stream else [])])
    assert code == 0, stderr
    assert _model_options(out) == {"overlap": False}


@pytest.mark.parametrize("option", [["--cost-option", "overlap=off"],
                                    ["--profile", "PROFILE"]])
@pytest.mark.parametrize("stream", [False, True])
def test_a_saved_model_refuses_refit_options(tmp_path: Path, option: list[str],
                                             stream: bool) -> None:
    """``--timing-from MODEL.json`` with ``--profile`` or ``--cost-option``: one line naming
    the option and the saved model, exit 2, no output."""
    workload = write_jsonl(tmp_path / "w.jsonl", REQUESTS)
    first = tmp_path / "first"
    code, _, stderr = run_cli(["whatif", "--workload", str(workload), "--timing-from",
                               str(SAMPLE), "--out", str(first), "--no-plots"])
    assert code == 0, stderr
    model = first / "cost_model.json"
    profile = tmp_path / "p.json"
    profile.write_text("{}")  # never read: the saved model is refused first
    option = [str(profile) if o == "PROFILE" else o for o in option]
    out = tmp_path / "out"
    code, _, stderr = run_cli(["whatif", "--workload", str(workload), "--timing-from",
                               str(model), *option, "--out", str(out), "--no-plots",
                               *(["--stream"] if stream else [])])
    lines = message_lines(stderr)
    assert code == 2 and len(lines) == 1, stderr
    assert option[0] in lines[0] and "saved model" in lines[0]
    assert not out.exists()


@pytest.mark.parametrize("option", ["profile_mode=blend", "profile_scale=off"])
def test_a_profile_option_without_a_profile_is_refused(tmp_path: Path, option: str) -> None:
    """``--cost-option profile_mode=...`` (or ``profile_scale``) without ``--profile`` changed
    nothing, exit 0: now one line naming it and ``--profile``, exit 2, before any work."""
    out = tmp_path / "out"
    code, _, stderr = run_cli(["whatif", str(SAMPLE), "--cost-option", option, "--out",
                               str(out), "--no-plots"])
    lines = message_lines(stderr)
    assert code == 2 and len(lines) == 1, stderr
    assert option.partition("=")[0] in lines[0] and "--profile" in lines[0]
    assert not out.exists()

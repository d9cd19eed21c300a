"""``CostModel.load`` (``whatif --timing-from MODEL.json``) checks every field of a saved model
(``replay/whatif/cost/saved.py``): a file of the wrong shape is one ``CostModelError`` naming the
file and the field, never a TypeError / AttributeError when ``describe`` or the simulator first
meets it, and never a NaN fit priced in silence."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from replay.recorded import from_trace
from replay.whatif.cost.model import MODEL_VERSION, CostModel, CostModelError
from tracing.reader import read_trace

REPO = Path(__file__).resolve().parents[3]
PROFILE = REPO / "traces" / "profiles" / "h200-qwen3-0.6b.profile.json"


@pytest.fixture(scope="module")
def saved() -> dict[str, Any]:
    """A model of every part (overlap mode, a profile prior), as ``save`` writes it."""
    events = from_trace(read_trace(REPO / "traces" / "h200-reference"))
    model = CostModel.fit(events, source="h200-reference", profile=str(PROFILE))
    return json.loads(json.dumps(model.to_dict()))


def _fits(data: dict[str, Any], **change: Any) -> None:
    for fit in data["fits"].values():
        fit.update(change)


EDITS: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("version", lambda d: d.update(version=MODEL_VERSION - 1),
     f"cost model version {MODEL_VERSION - 1}, expected {MODEL_VERSION}"),
    ("version text", lambda d: d.update(version=str(MODEL_VERSION)), "cost model version '"),
    ("no fits", lambda d: d.pop("fits"), "fits is missing"),
    ("unknown", lambda d: d.update(bogus=1), "unknown field bogus"),
    ("coverage", lambda d: d.update(coverage=[1]), "coverage must be a JSON object"),
    ("coverage row", lambda d: d["coverage"]["decode_graph"].update(min="x"),
     "coverage.decode_graph.min must be a finite number"),
    ("coverage size", lambda d: d["coverage"]["decode_graph"].update(size="nope"),
     "coverage.decode_graph.size must be one of"),
    ("heldout", lambda d: d.update(heldout="x"), "heldout must be a JSON object"),
    ("heldout row", lambda d: d["heldout"].update(all={"n": 1}),
     "heldout.all.mape_pct is missing"),
    ("selection", lambda d: d.update(selection={"decode_graph": "x"}),
     "selection.decode_graph must be a JSON object"),
    ("warmup_s", lambda d: d.update(warmup_s={"decode_graph": "x"}),
     "warmup_s.decode_graph must be a finite number"),
    ("prefill_graph_sizes", lambda d: d.update(prefill_graph_sizes="16,32"),
     "prefill_graph_sizes must be a list"),
    ("prefill_graph_sizes item", lambda d: d.update(prefill_graph_sizes=["16"]),
     "prefill_graph_sizes[0] must be an integer >= 0"),
    ("kv_heads", lambda d: d.update(kv_heads="8"), "kv_heads must be an integer >= 0"),
    ("fit coef", lambda d: _fits(d, coef=[1.0]), ".coef must be a JSON object"),
    ("fit coef missing", lambda d: [f["coef"].pop("num_seqs") for f in d["fits"].values()],
     ".coef.num_seqs is missing"),
    ("fit NaN", lambda d: _fits(d, intercept=float("nan")), ".intercept must be a finite number"),
    ("fit feature", lambda d: _fits(d, features=["nope"]), ".features[0] must be one of"),
    ("fit routes", lambda d: _fits(d, routes=[8], route_s=[]), ".route_s must hold one cost"),
    ("overlap offsets", lambda d: d["overlap"].update(offsets={"sequential": 1}),
     "overlap.offsets.sequential must be a JSON object"),
    ("overlap spread", lambda d: d["overlap"].update(spread="ab"), "overlap.spread must be a list"),
    ("add", lambda d: d.update(add={"per_request_s": "x"}),
     "add.per_request_s must be a finite number"),
    ("host", lambda d: d.update(host={"ratio": "x", "shapes": 1}),
     "host.ratio must be a finite number"),
    ("prior range", lambda d: d["prior"].update(profile_range={"decode_graph": {"x": [0, 1]}}),
     "prior.profile_range.decode_graph key must be one of"),
    ("prior mismatch", lambda d: d["prior"].update(mismatch={"device": ["a"]}),
     "prior.mismatch.device must be a list of 2"),
]


def test_a_saved_model_round_trips(saved: dict[str, Any], tmp_path: Path) -> None:
    """Every part a fit writes (overlap, prior, add, coverage...) passes the checks and loads
    back to the same dictionary."""
    path = tmp_path / "model.json"
    path.write_text(json.dumps(saved))
    assert saved["overlap"] and saved["prior"]  # the checks met every part
    assert json.loads(json.dumps(CostModel.load(path).to_dict())) == saved


@pytest.mark.parametrize("name, edit, needle", EDITS, ids=[e[0] for e in EDITS])
def test_a_wrong_field_is_a_cost_model_error(saved: dict[str, Any], tmp_path: Path, name: str,
                                             edit: Callable[[dict[str, Any]], Any],
                                             needle: str) -> None:
    """Each field of the wrong type, shape or value (was: loaded, then a TypeError,
    AttributeError or format ValueError in ``describe`` or ``predict``, or a NaN fit) is a
    ``CostModelError`` naming the file and the field."""
    data = json.loads(json.dumps(saved))
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CostModelError) as caught:
        CostModel.load(path).describe()
    assert str(caught.value).startswith(f"{path}: ") and needle in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("text", ["[1, 2]", "{}", "nope", ""])
def test_not_a_model_file(tmp_path: Path, text: str) -> None:
    """A list, an object without a version, or no JSON at all: a ``CostModelError``."""
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(CostModelError, match="bad.json: not a cost model file"):
        CostModel.load(path)

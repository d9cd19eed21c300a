"""``--set enforce_eager=true`` where the timing source has no eager-decode fit: the note names
the fit the step-time model then prices eager decodes from (``CostModel.fallback``)."""

from __future__ import annotations

from types import SimpleNamespace

from engine.config import Config
from replay.whatif.cost.model import CostModel
from replay.whatif.notes import variant_notes

EXECUTOR = SimpleNamespace(synthesized=0, overlapped_steps=0, steps=10)


def _eager_note(fits: dict) -> list[str]:
    notes = variant_notes(Config(), Config(enforce_eager=True), CostModel(fits=fits), EXECUTOR)
    return [n for n in notes if "no eager decodes" in n]


def test_a_source_with_one_pooled_fit_is_not_said_to_have_graph_decodes() -> None:
    """A CPU trace of a few steps has one pooled fit and no graph decode at all: the note said
    "predicted from graph decodes"; it now names the pooled fit."""
    (note,) = _eager_note({"pooled": None})
    assert note.endswith("predicted from the pooled fit")
    assert "graph" not in note


def test_a_source_with_graph_decodes_names_their_fit() -> None:
    (note,) = _eager_note({"decode_graph": None, "prefill": None})
    assert note.endswith("predicted from the decode_graph fit")
    assert _eager_note({"decode_eager": None}) == []

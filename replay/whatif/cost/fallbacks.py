"""A step class the source has no fit of its own for: priced from related fits.

A target config can run steps of a class its source never ran: chunked prefill's mixed steps
from a prefill-first source, eager decodes under ``enforce_eager``, a graph prefill from a source
that captured prefill graphs but timed none through one, an eager prefill of a size the source
ran only through a graph. Each is priced from the fit that shares its physics (``resolve``), two
of them by combining fits (``COMPOSITE``, ``GRAPH_FROM_EAGER``), and ``fallback_words`` says
which, so that a prediction says what it rests on.
"""

from __future__ import annotations

from collections.abc import Mapping

from replay.whatif.cost.fit import FEATURES, LinearFit

# Pseudo-keys of ``resolve``: a class priced by combining fits.
COMPOSITE = "composite"  # a mixed step: the prefill fit plus the decode slopes
GRAPH_FROM_EAGER = "graph_from_eager"  # a graph prefill: the eager prefill fit's compute part
# Related classes to try, in order, for a class without a fit (after the combinations above).
FALLBACKS: dict[str, tuple[str, ...]] = {
    "decode_graph": ("decode_eager", "pooled"),
    "decode_eager": ("decode_graph", "pooled"),
    # A graph prefill's fit has no launch floor (may be low): an eager prefill's last resort.
    "prefill": ("mixed", "prefill_graph", "pooled"),
    # An eager prefill fit without a compute slope (a floor only): an upper bound.
    "prefill_graph": ("prefill", "mixed", "pooled"),
    "mixed": ("pooled",),
}


def graph_prefill_from_eager(fit: LinearFit) -> LinearFit | None:
    """A CUDA-graph prefill priced from an eager prefill fit: its compute part (no launch
    floor: one graph launch) with the per-token slope charged on the padded tokens, which the
    graph's GEMMs compute; attention and per-sequence slopes stay on the real work. None: the
    fit has no per-token slope (a floor alone says nothing about compute)."""
    at = FEATURES.index
    per_token = fit.coef[at("prefill_tokens")]
    if per_token <= 0:
        return None
    coef = list(fit.coef)
    coef[at("padded_tokens")] += per_token
    coef[at("prefill_tokens")] = 0.0
    features = tuple(dict.fromkeys(
        "padded_tokens" if name == "prefill_tokens" else name for name in fit.features))
    return LinearFit(fit.intercept, tuple(coef), features, 0)


def composite_mixed(fits: Mapping[str, LinearFit]) -> LinearFit:
    """A mixed step as its prefill part (the prefill fit, over the prefill sequences) plus
    its decode part (the eager-decode slopes, over the decode sequences), one intercept and
    the prefill fit's floor (a mixed step runs eagerly).

    Prefill sequences are ``num_seqs - decode_seqs``, so the prefill fit's per-sequence slope
    moves onto ``num_seqs`` and is taken back from ``decode_seqs``.
    """
    prefill = fits["prefill"]
    decode = fits.get("decode_eager") or fits.get("decode_graph")
    coef = list(prefill.coef)
    if decode is not None:
        at = FEATURES.index
        per_prefill_seq = prefill.coef[at("num_seqs")]
        # A mixed step runs eager: a graph fit's padding slope is paid per real sequence.
        per_decode_seq = decode.coef[at("decode_seqs")] + decode.coef[at("padded_batch_size")]
        coef[at("decode_seqs")] = per_decode_seq - per_prefill_seq
        coef[at("decode_context_tokens")] = decode.coef[at("decode_context_tokens")]
    return LinearFit(prefill.intercept, tuple(coef), prefill.features, 0, prefill.floor)


def resolve(fits: Mapping[str, LinearFit], cls_name: str) -> str:
    """The fit a class uses: its own, else ``COMPOSITE`` (mixed), ``GRAPH_FROM_EAGER`` (a graph
    prefill, where the eager prefill fit has a compute slope) or a related class's."""
    if cls_name in fits:
        return cls_name
    if cls_name == "mixed" and "prefill" in fits:
        return COMPOSITE
    if cls_name == "prefill_graph" and "prefill" in fits and graph_prefill_from_eager(
            fits["prefill"]) is not None:
        return GRAPH_FROM_EAGER
    for other in FALLBACKS[cls_name]:
        if other in fits:
            return other
    return next(iter(fits))


def related_fit(fits: Mapping[str, LinearFit], surrogates: Mapping[str, LinearFit],
                cls_name: str, with_floor: bool = True) -> LinearFit:
    """The fit ``resolve`` picks for a class; ``with_floor=False``: a floored fit's plain
    linear stand-in (``surrogates``) in its place."""
    key = resolve(fits, cls_name)
    chosen = fits if with_floor else {**fits, **surrogates}
    if key == COMPOSITE:
        return composite_mixed(chosen)
    if key == GRAPH_FROM_EAGER:  # floorless, so the same with or without floors
        graph = graph_prefill_from_eager(fits["prefill"])
        assert graph is not None  # resolve checked
        return graph
    return chosen[key]


def fallback_words(fits: Mapping[str, LinearFit], cls_name: str) -> str:
    """What a class is priced from, in words ("": its own fit)."""
    key = resolve(fits, cls_name)
    if key == cls_name:
        return ""
    if key == COMPOSITE:
        return "the prefill fit plus the decode fits' slopes"
    if key == GRAPH_FROM_EAGER:
        return "the eager prefill fit's compute part at the padded token count (no launch floor)"
    if cls_name == "prefill" and key == "prefill_graph":
        return "the prefill_graph fit (no launch floor: may be low)"
    return f"the {key} fit"

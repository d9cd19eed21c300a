"""The step-time model's switches (``CostOptions``) and the GEMM routes of a graph decode.

``CostOptions`` switches each mechanism of the model, so that a validation matrix can compare
the model with and without it; the defaults are the model as it prices by default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from replay.whatif.cost import fit as fitting
from replay.whatif.cost.features import Steps

PROFILE_MODES = ("blend", "pooled", "profile")
# The padded decode rows up to which the engine's split-K tilings serve a projection (the
# buckets of engine/model/layers/decode_gemm.py's DECODE_TILINGS: o_proj and down to 16 and to
# 64 rows, o_proj alone to 128; cuBLAS above): where a decode step's GEMMs change kernel.
SPLIT_K_ROUTES = (16, 64, 128)


def decode_routes(header: dict[str, Any]) -> tuple[int, ...]:
    """The GEMM routes of a recording's graph decodes (``LinearFit.routes``): the split-K
    buckets where its engine ran split-K GEMMs (``Config.split_k_gemm``), else none (cuBLAS at
    every size)."""
    config = header.get("config") or {}
    return SPLIT_K_ROUTES if config.get("split_k_gemm") else ()


@dataclass(frozen=True)
class CostOptions:
    """The model's mechanisms, each switchable (all on: the model as it has always been).

    ``warmup_steps``: a class's far-too-slow first step kept out of its fit, charged once.
    ``warmup_window``: the run's leading warm-up steps kept out where later steps cover them
    (without a pooled profile; with one they stay in, BENCHMARKS 7q).
    ``calibration``: the header's start-up calibration rows fitted with the run's steps.
    ``overlap``: overlap mode (device time, host time and offsets) where host time was measured.
    ``class_offsets``: per class and launch mode offsets (off: the sequential steps' sync
    latency and the overlapped steps' mean, for every class).
    ``engine_host``: calibration steps charged the engine's own work per step and per prompt
    token (``overlap.engine_host_s``, ``overlap.engine_token_s``), which a timed executor call
    lacks.
    ``profile_mode``: with a profile, ``pooled`` (profile rows fitted with the source's as
    calibration rows; the default since BENCHMARKS 7o), ``blend`` (the source's fit within its
    range, the profile beyond) or ``profile`` (the profile's fits only). ``profile_scale``:
    scale them to the source. ``run_weight``: under ``pooled``, each class's run steps weigh
    together as much as its calibration and profile rows (``fit.weigh_run``).
    ``request_add``: the live loop's host time to add each request (``arrivals``).
    ``prefill_roofline``: prefill attention bounded by its longest program (``roofline``).
    ``host_stalls`` (opt-in): an eager step's device time pays the host's stalls at the rate
    the source's host times show (``overlap.host_stall_rate``).
    ``shared_reads``: a decode's re-reads of blocks its other rows read too priced at the
    fraction of a read from memory that steps sharing blocks (a profile's) show
    (``fit.shared_read_fraction``); off: every read from memory. ``shared_kv`` (opt-in): the
    re-reads free (fraction 0). ``causal_work``: prefill attention work counted as the
    causal mask computes it, ``prefill_attn_work - sum(new^2) / 2`` (``linear.causal_work``),
    so a fresh prompt's attention is not counted twice what a cached prefix's is.
    ``relative_roofline``: the roofline's linear part fitted by relative error, the
    criterion its per-key slope is chosen by (``roofline._with_slope``). Both: BENCHMARKS 7l,
    on by default since 7m. ``host_spread`` (opt-in): an overlapped step priced over the
    source's spread of host times about their fit (``overlap.host_spread``), not at their mean.
    ``decode_routes`` (opt-in): a graph decode's fixed cost per GEMM route of its padded rows
    (``decode_routes``: the split-K tilings' buckets, cuBLAS above), fitted with the class's
    slopes, not one for every size (BENCHMARKS 7z: right on the few-row steps, not kept
    by default: the H200 matrix misses more)."""

    warmup_steps: bool = True
    warmup_window: bool = True
    calibration: bool = True
    overlap: bool = True
    class_offsets: bool = True
    engine_host: bool = True
    profile_mode: str = "pooled"
    profile_scale: bool = True
    run_weight: bool = True
    longest_program: bool = True
    shared_kv: bool = False
    request_add: bool = True
    prefill_roofline: bool = True
    host_stalls: bool = False
    shared_reads: bool = True
    causal_work: bool = True
    relative_roofline: bool = True
    host_spread: bool = False
    decode_routes: bool = False

    def __post_init__(self) -> None:
        if self.profile_mode not in PROFILE_MODES:
            raise ValueError(f"profile_mode must be one of {PROFILE_MODES}, "
                             f"got {self.profile_mode!r}")

    @classmethod
    def parse(cls, items: list[str]) -> CostOptions:
        """``name=value`` items (``overlap=off``, ``profile_mode=pooled``)."""
        values: dict[str, Any] = {}
        names = {f for f in cls.__dataclass_fields__}
        for item in items:
            key, sep, text = item.partition("=")
            if not sep or key not in names:
                raise ValueError(f"cost option {item!r}: expected NAME=VALUE with NAME one of "
                                 f"{', '.join(sorted(names))}")
            if key == "profile_mode":
                values[key] = text
            elif text.lower() in ("on", "true", "1", "yes"):
                values[key] = True
            elif text.lower() in ("off", "false", "0", "no"):
                values[key] = False
            else:
                raise ValueError(f"cost option {item!r}: expected on or off")
        return cls(**values)

    def shared_read_fraction(self, steps: Steps) -> float:
        """What a shared block's re-read costs ``steps``' fits, as a fraction of a read from
        memory (``fit.fit_all``'s ``shared_reads``) under these options."""
        if self.shared_kv:
            return 0.0
        if not self.shared_reads:
            return 1.0
        return fitting.shared_read_fraction(steps, self.prefill_roofline,
                                            self.relative_roofline)

    def changed(self) -> dict[str, Any]:
        """The options that differ from the defaults."""
        default = asdict(CostOptions())
        return {k: v for k, v in asdict(self).items() if default[k] != v}

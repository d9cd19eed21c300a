"""Engine configuration: every field validated, defaults from Nano-vLLM."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from engine.errors import ConfigError
from engine.policy import EVICTION_ORDERS, WHOLE_PROMPT_POLICIES, policy_class
from tracing.layout import DEFAULT_FLUSH_SECONDS, DEFAULT_FLUSH_STEPS, TRACE_WRITERS
from tracing.validate import MAX_TRACE_BLOCKS

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEVICES = ("auto", "cpu", "cuda")
ATTENTION_BACKENDS = ("auto", "torch", "triton", "flash_attn")
# When a decode step may be deferred (Scheduler.can_defer): "needed": while the free blocks cover
# what the next step's decodes can claim; "per_running": one free block per running sequence
# (the rule of traces recorded before schema 3).
DEFER_BLOCK_RULES = ("needed", "per_running")
# torch.backends.cuda.preferred_blas_library for the projections; "default" leaves torch's choice.
BLAS_LIBRARIES = ("default", "cublas", "cublaslt")
# The kernels an eager launch of a long prompt can take (engine/model/kernels/prefill_attention.py).
LONG_PREFILL_KERNELS = ("tma", "triton", "flash_sdpa")
AUTO_SIZED_BLOCKS = -1
# The largest KV pool: the largest a trace may describe (tracing/validate.py: verify and the
# what-if refuse a header with more), so no run records a trace its own reader refuses. Every
# engine, replay and simulation builds one Python object per block (~1.4 us and ~300 bytes
# each: 2^22 blocks take ~7 s and 1.4 GB, two billion would take an hour and 600 GB), and a
# 140 GB GPU holds ~10^4 blocks of Qwen3-0.6B's 256 tokens. A memory-sized pool
# (AUTO_SIZED_BLOCKS) is capped at it (``cap_blocks``).
MAX_KV_BLOCKS = MAX_TRACE_BLOCKS
# calibration_repeats = -1: time the start-up calibration GPU_CALIBRATION_REPEATS times on a GPU,
# and skip it on the CPU (tens of seconds there, for a cost model that CPU runs rarely need).
AUTO_CALIBRATION = -1
GPU_CALIBRATION_REPEATS = 3
DEFAULT_CPU_KV_CACHE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class _Rule:
    kind: type
    low: float | None = None
    high: float | None = None
    choices: tuple[Any, ...] | None = None
    allow: tuple[Any, ...] = ()
    why: str = ""  # the reason of a bound that is not obvious, said with it

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        parts = [self.kind.__name__]
        if self.low is not None and self.high is not None:
            parts.append(f"in [{self.low}, {self.high}]")
        elif self.low is not None:
            parts.append(f">= {self.low}")
        if self.allow:
            parts.append("or " + ", ".join(repr(a) for a in self.allow))
        if self.why:
            parts.append(f"({self.why})")
        return " ".join(parts)


_INT_MAX = 2**31 - 1

FIELD_RULES: dict[str, _Rule] = {
    "max_num_batched_tokens": _Rule(int, 1, _INT_MAX),
    "max_num_seqs": _Rule(int, 1, _INT_MAX),
    "max_model_len": _Rule(int, 1, _INT_MAX),
    "gpu_memory_utilization": _Rule(float, 0.05, 1.0),
    "tensor_parallel_size": _Rule(int, 1, 8),
    "enforce_eager": _Rule(bool),
    "kvcache_block_size": _Rule(int, 1, 65536),
    "num_kvcache_blocks": _Rule(int, 1, MAX_KV_BLOCKS, allow=(AUTO_SIZED_BLOCKS,),
                                why="the largest pool a trace may describe; a 140 GB GPU holds "
                                "~10^4 blocks"),
    "kv_cache_bytes": _Rule(int, 1, None),
    "policy": _Rule(str),
    "eviction": _Rule(str, choices=tuple(EVICTION_ORDERS)),
    "enable_prefix_caching": _Rule(bool),
    "prefix_cache_duplicates": _Rule(bool),
    "hash_seed": _Rule(int, 0, 2**64 - 1),
    "seed": _Rule(int, 0, 2**63 - 1),
    "dtype": _Rule(str, choices=DTYPES),
    "device": _Rule(str, choices=DEVICES),
    "attention_backend": _Rule(str, choices=ATTENTION_BACKENDS),
    "eos": _Rule(int, -1, _INT_MAX),
    "trace_flush_steps": _Rule(int, 1, _INT_MAX),
    "trace_flush_seconds": _Rule(float, 0.0, None),
    "trace_segment_writer": _Rule(str, choices=TRACE_WRITERS),
    "calibration_repeats": _Rule(int, 0, 1000, allow=(AUTO_CALIBRATION,)),
    "async_scheduling": _Rule(bool),
    "prefill_graph_tokens": _Rule(int, 0, _INT_MAX),
    "prefill_graph_seqs": _Rule(int, 1, _INT_MAX),
    "defer_block_rule": _Rule(str, choices=DEFER_BLOCK_RULES),
    "overlap_mixed_steps": _Rule(bool),
    "fused_kernels": _Rule(bool),
    "fused_kv_store": _Rule(bool),
    "blas_library": _Rule(str, choices=BLAS_LIBRARIES),
    "split_k_gemm": _Rule(bool),
    "decode_gemm_prefetch": _Rule(bool),
    "decode_qk_prologue": _Rule(bool),
    "programmatic_launch": _Rule(bool),
    "decode_longest_first": _Rule(bool),
    "long_prefill_kernel": _Rule(str, choices=LONG_PREFILL_KERNELS),
    "freeze_gc_heap": _Rule(bool),
}


@dataclass(frozen=True)
class Config:
    """Every setting of one engine. Construct with keywords; ``Config.replace`` validates overrides.

    ``num_kvcache_blocks = -1`` sizes the KV pool from memory: on CUDA from free GPU memory times
    ``gpu_memory_utilization``, on CPU from ``kv_cache_bytes``.
    """

    model: str | None = None
    max_num_batched_tokens: int = 16384
    # The most sequences one step schedules (its prefills and decodes together), as the
    # seed's (Nano-vLLM's) scheduler counts: admitted requests may outnumber it and take turns
    # (vLLM's bounds the requests running at once).
    max_num_seqs: int = 512
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.9
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    kvcache_block_size: int = 256
    num_kvcache_blocks: int = AUTO_SIZED_BLOCKS
    kv_cache_bytes: int = DEFAULT_CPU_KV_CACHE_BYTES
    policy: str = "prefill_first"
    # Which cached free block is evicted first (engine/policy.EVICTION_ORDERS); a policy may
    # override it.
    eviction: str = "release"
    enable_prefix_caching: bool = True
    # Every block holding a cached hash serves it (engine/cache_copies.py, as vLLM's BlockPool):
    # two sequences that filled blocks with the same tokens (computed before either was cached)
    # keep the hash cached until the last copy is handed out again. False: one block per hash,
    # which drops the hash when that block goes, though a copy holds it (traces recorded before).
    prefix_cache_duplicates: bool = True
    hash_seed: int = 0
    seed: int = 0
    dtype: str = "auto"
    device: str = "auto"
    attention_backend: str = "auto"
    eos: int = -1
    trace_flush_steps: int = DEFAULT_FLUSH_STEPS
    trace_flush_seconds: float = DEFAULT_FLUSH_SECONDS
    # Who writes the trace's segments (tracing.layout.TRACE_WRITERS): threads of this process,
    # or a child process, whose encoding then never shares the engine's interpreter.
    trace_segment_writer: str = "thread"
    # Timed repetitions of each start-up calibration step (engine/calibration.py); 0: none;
    # AUTO_CALIBRATION: GPU_CALIBRATION_REPEATS on a GPU, none on the CPU.
    calibration_repeats: int = AUTO_CALIBRATION
    # Schedule step N+1 while step N runs on the device when N's tokens cannot change the
    # decision (engine/engine_core.py). Decisions and events are those of the sequential loop.
    async_scheduling: bool = True
    # Prefills of up to this many tokens (within the token budget) and prefill_graph_seqs
    # prompts run through CUDA graphs captured per token count (engine/runner/prefill_graphs.py):
    # launched in one call, not one per kernel, so a slow or busy host cannot stretch them; 0:
    # eager.
    prefill_graph_tokens: int = 16384
    prefill_graph_seqs: int = 64
    # How overlapped scheduling makes sure the next step cannot preempt (DEFER_BLOCK_RULES).
    defer_block_rule: str = "needed"
    # Mixed steps (prompt chunks with decodes) are deferred like decode steps. For that, a block
    # filled by a decode's token enters the prefix cache at the end of the schedule that hashes
    # it, not during it, so a mixed pass admits without the previous step's token values; False:
    # at once, and a mixed step waits for its tokens (the rule of traces recorded before it).
    overlap_mixed_steps: bool = True
    # CUDA only: fused Triton kernels for RMSNorm, QK-norm + RoPE and SwiGLU (engine/model/kernels/
    # fused.py); False runs the PyTorch code of each layer (A/B comparisons of numerics or speed).
    fused_kernels: bool = True
    # CUDA only: the fused QK-norm + RoPE kernel also writes K/V into the cache where the attention
    # backend allows it, instead of a separate store_kv launch.
    fused_kv_store: bool = True
    # CUDA only: the BLAS library of the projections (BLAS_LIBRARIES; benchmarks/gemm.py compares).
    blas_library: str = "default"
    # CUDA only: at decode batch sizes the attention output and down projections run as split-K
    # Triton GEMMs whose partials the next RMSNorm sums (engine/model/layers/decode_gemm.py);
    # False: cuBLAS for every projection (the numerics of traces recorded before the field).
    split_k_gemm: bool = True
    # CUDA only, with split_k_gemm: up to 16 decode rows every projection (qkv and gate_up too)
    # runs a Triton GEMM that prefetches its weights into L2 before waiting for the kernel before
    # it (decode_gemm.PREFETCH_TILINGS). False: the split-K table alone, qkv and gate_up on
    # cuBLAS (the traces recorded before the field; the default: the engine A/B found no gain
    # beyond the run-to-run spread, docs/BENCHMARKS.md 8q).
    decode_gemm_prefetch: bool = False
    # CUDA with the Triton backend: in a decode-only step the decode attention kernel takes the
    # QKV projection's rows, applies QK-norm and RoPE to its query and new key and stores the
    # new K/V itself (engine/model/kernels/decode_prologue.py): one launch fewer a layer. False:
    # qk_norm_rope runs first (the traces recorded before the field).
    decode_qk_prologue: bool = True
    # CUDA only, compute capability 9+: Triton kernels launch with programmatic dependent launch
    # (engine/model/kernels/launch.py), so a kernel's launch overlaps the end of the one before;
    # results are identical. False: plain launches (the traces recorded before the field).
    programmatic_launch: bool = True
    # CUDA only: a decode step's attention programs take its rows longest context first
    # (engine/model/kernels/paged_attention.py), so the longest rows do not finish alone at the
    # end of the launch; results are identical. False: row order (traces recorded before it).
    decode_longest_first: bool = True
    # CUDA with the Triton backend only: the kernel of an eager prefill launch whose longest
    # prompt has >= 8,192 new tokens (long_prefill.long_prefill_route): "tma" (Hopper's bulk
    # copies, prefill_attention_tma.py, where the launch fits it, else "triton"), "triton" (the
    # traces recorded before the field) or "flash_sdpa" (one prompt with fresh keys). The three
    # round bf16 differently; speeds: docs/BENCHMARKS.md 8k.
    long_prefill_kernel: str = "tma"
    # Freeze the heap the engine's start-up leaves (engine/gc_heap.py) so the garbage collector's
    # full passes skip it: a full pass over it stalled a step by ~150 ms on the H200 host. Host
    # timing only; False: the collector as Python sets it up (the traces recorded before it).
    freeze_gc_heap: bool = True
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.policy, str):
            policy_class(self.policy)  # a class or an instance: it names the import path to give
        for name, rule in FIELD_RULES.items():
            value = getattr(self, name)
            if rule.kind is float and isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, name, float(value))
                value = float(value)
            _check(name, value, rule)
        # A built-in (engine/policy.BUILTIN_POLICIES), or an import path package.module:ClassName
        # of an engine.policy.Policy subclass: validated by importing it.
        policy_class(self.policy)
        whole = self.policy in WHOLE_PROMPT_POLICIES
        if whole and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_model_len "
                f"({self.max_model_len}) under policy {self.policy!r}, or a long prompt could "
                "never be scheduled; lower max_model_len or use policy='chunked'"
            )

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name != "extra"]

    def replace(self, **changes: Any) -> Config:
        """A copy with ``changes`` applied; unknown keys raise ``ConfigError`` naming valid ones."""
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise ConfigError(
                f"unknown config key(s) {', '.join(unknown)}; valid keys: "
                + ", ".join(self.field_names())
            )
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.field_names()}


def cap_blocks(blocks: int) -> int:
    """A pool sized from memory (``AUTO_SIZED_BLOCKS``), capped at ``MAX_KV_BLOCKS``."""
    return min(blocks, MAX_KV_BLOCKS)


def _check(name: str, value: Any, rule: _Rule) -> None:
    if value in rule.allow and type(value) is type(rule.allow[0]):
        return
    is_bool = isinstance(value, bool)
    ok_type = isinstance(value, rule.kind) and not (rule.kind is not bool and is_bool)
    if not ok_type:
        raise ConfigError(f"{name} must be {rule.describe()}, got {value!r}")
    if rule.kind is float and not math.isfinite(value):
        raise ConfigError(f"{name} must be a finite {rule.describe()}, got {value!r}")
    if rule.choices is not None and value not in rule.choices:
        raise ConfigError(f"{name} must be {rule.describe()}, got {value!r}")
    if rule.low is not None and value < rule.low or rule.high is not None and value > rule.high:
        raise ConfigError(f"{name} must be {rule.describe()}, got {value!r}")


def parse_overrides(items: list[str], parse: Any = None) -> dict[str, Any]:
    """``--set KEY=VALUE`` items as a dict for ``Config.replace`` (``parse``: per-value parser,
    ``parse_override`` by default)."""
    parse = parse or parse_override
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects KEY=VALUE, got {item!r}")
        if key.strip() in out:  # the last would win silently: a typo'd script's surprise
            raise ConfigError(f"--set {key.strip()} is given twice")
        out[key.strip()] = parse(key.strip(), text.strip())
    return out


def parse_override(key: str, text: str) -> Any:
    """Turn ``--set key=text`` into a typed value for ``Config.replace`` (errors name the field)."""
    if key == "model":
        raise ConfigError("model is not a --set field: give the checkpoint directory with --model")
    if key not in Config.field_names():
        settable = [name for name in Config.field_names() if name != "model"]
        raise ConfigError(f"unknown config key {key!r}; valid keys: " + ", ".join(settable))
    rule = FIELD_RULES.get(key)
    if rule is None:
        return text
    try:
        if rule.kind is bool:
            lowered = text.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(text)
        if rule.kind is int:
            return int(text)
        if rule.kind is float:
            return float(text)
    except ValueError:
        raise ConfigError(f"{key} must be {rule.describe()}, got {text!r}") from None
    return text

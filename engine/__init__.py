"""The inference engine: ``from engine import LLM, SamplingParams``.

``LLM`` loads lazily, so code that only schedules (replay, simulation) never imports the model
stack (torch, transformers).
"""

from __future__ import annotations

from typing import Any

from engine.config import Config
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "Config", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name in ("LLM", "LLMEngine"):
        from engine import llm as llm_engine

        return getattr(llm_engine, name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")

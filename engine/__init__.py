"""The inference engine: ``from engine import LLM, SamplingParams``."""

from engine.config import Config
from engine.llm_engine import LLM, LLMEngine
from engine.sampling_params import SamplingParams

__all__ = ["LLM", "LLMEngine", "Config", "SamplingParams"]

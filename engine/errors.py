"""Errors the engine reports to users: each carries one clear line."""


class ReplayLLMError(Exception):
    """Base of every error this project raises on purpose."""


class ConfigError(ReplayLLMError, ValueError):
    """A Config field is out of range or inconsistent."""


class InvalidRequestError(ReplayLLMError, ValueError):
    """A request (prompt or sampling params) cannot be served."""


class ModelLoadError(ReplayLLMError):
    """A checkpoint directory is missing, incomplete or of an unsupported architecture."""


class EngineClosedError(ReplayLLMError, RuntimeError):
    """An engine was used after ``close()``."""

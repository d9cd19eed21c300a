"""When the commands draw progress bars: the one rule ``run``, ``loadgen``, ``workload`` and
``whatif`` follow, the engine's start-up line's too (import it; a copy drifts). It lives in the
engine (``engine.startup_progress.progress_wanted``), which cannot import from ``replay``."""

from __future__ import annotations

from engine.startup_progress import progress_wanted

__all__ = ["progress_wanted"]

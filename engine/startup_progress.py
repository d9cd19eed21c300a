"""The start-up status line of ``LLMEngine``."""

from __future__ import annotations

from tqdm.auto import tqdm


class StartupProgress:
    """One transient status line on stderr while the engine starts (loading, calibrating): a
    start-up can take a while and says what it is doing; the line is erased when it is done."""

    def __init__(self) -> None:
        self.bar = tqdm(total=None, desc="start-up", bar_format="{desc} [{elapsed}]",
                        leave=False, dynamic_ncols=True)

    def phase(self, text: str) -> None:
        self.bar.set_description_str(f"start-up: {text}")

    def counter(self, done: int, total: int) -> None:
        self.bar.set_description_str(f"start-up: calibrating step times ({done}/{total})")

    def close(self) -> None:
        self.bar.close()

"""What the invariant checker reports: named violations, each at an event."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Violation:
    name: str
    event_id: int
    step: int
    message: str

    def __str__(self) -> str:
        return f"{self.name}: event {self.event_id} (step {self.step}): {self.message}"


@dataclass
class InvariantReport:
    """The violations found in one stream (empty: every invariant held)."""

    violations: list[Violation] = field(default_factory=list)
    num_events: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def names(self) -> list[str]:
        return sorted({v.name for v in self.violations})

    def report(self, limit: int = 3) -> str:
        if self.ok:
            return f"every invariant holds over {self.num_events} events"
        lines = [f"invariants violated: {', '.join(self.names())}"]
        for name in self.names():
            lines += [f"  {v}" for v in self.violations if v.name == name][:limit]
        return "\n".join(lines)


class InvariantViolations(AssertionError):
    """Raised by ``assert_invariants``: the report's text is the message."""

"""What every threshold / floor recommendation must respect (shared by tuning, tuning_multi
and canary)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dashboard.control.stats import DEFAULT_ALPHA


Action = Literal["change", "hold", "explore"]


@dataclass(frozen=True)
class Guardrails:
    """What a recommendation must respect."""

    target_false_hit_rate: float = 0.05
    alpha: float = DEFAULT_ALPHA
    min_decisions: int = 200
    """Logged decisions needed before recommending anything."""
    min_labelled: int = 30
    """Feedback-labelled hits at or above a candidate threshold for its bound to count."""
    max_step: float = 0.03
    """Largest change of a threshold in one push."""
    cooldown_s: float = 1800.0
    """Time since the arm's last change before the next one."""
    grid_step: float = 0.005
    explore_memory_s: float = 7 * 86400.0
    """How long a rolled-back canary keeps explorations at or below the value it tried."""

    def __post_init__(self) -> None:
        if not 0.0 < self.target_false_hit_rate < 1.0:
            raise ValueError(f"target false-hit rate must be in (0, 1), got {self.target_false_hit_rate}")
        if not 0.0 < self.alpha < 1.0:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.max_step <= 0 or self.grid_step <= 0:
            raise ValueError("max_step and grid_step must be positive")
        if min(self.min_decisions, self.min_labelled, self.cooldown_s, self.explore_memory_s) < 0:
            raise ValueError("minimum sizes, cool-down and explore memory must not be negative")

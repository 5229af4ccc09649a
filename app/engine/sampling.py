"""The sampling parameters of one generation, as the native sampler takes them."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off; 0: the best token only
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    seed: int | None = None  # None: a fresh random seed

    @property
    def uses_history(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def initial_rng_state(self) -> int:
        """The RNG state a generation starts from: the seed, or fresh randomness."""
        if self.seed is None:
            return secrets.randbits(64)
        return self.seed & 0xFFFFFFFFFFFFFFFF

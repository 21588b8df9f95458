"""cpprb's Large Batch Experience Replay helpers (Lahire et al. 2021).

Sample ``m * batch_size`` transitions from a buffer, compute surrogate
priorities for them, and let one of these functors draw the final
``batch_size`` in proportion to those priorities, with importance weights
normalised by the variant's rule.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ... import checks

__all__ = ["LaBERmean", "LaBERlazy", "LaBERmax"]


class _LaBER:
    """Draws ``batch_size`` of a large batch of ``batch_size * m`` in proportion to priorities."""

    def __init__(self, batch_size: int, m: int = 4, *, eps: float = 1e-6):
        self.rng = np.random.default_rng()
        self.batch_size = checks.integer(
            "batch_size", int(batch_size) if isinstance(batch_size, float) else batch_size, low=1
        )
        m = checks.integer("m", m, low=1)
        self.idx = np.arange(self.batch_size * m)
        self.eps = checks.number("eps", eps, low=0.0)

    def __call__(self, *, priorities: Any, **kwargs: Any) -> dict[str, np.ndarray]:
        """Sub-sample the large batch ``kwargs`` by ``priorities`` (one per transition);
        returns the chosen rows of every array given, ``weights`` and ``indexes``."""
        p = np.asarray(priorities, dtype=np.float64) + self.eps
        if p.shape != self.idx.shape:
            raise ValueError(f"priorities: expected {len(self.idx)} values (batch_size * m), got shape {p.shape}")
        if not (np.isfinite(p).all() and (p >= 0).all() and p.sum() > 0):
            raise ValueError("priorities: expected finite values >= 0, not all zero")
        p = p / p.sum()
        chosen = self.rng.choice(self.idx, self.batch_size, p=p)
        out = {name: value[chosen] for name, value in kwargs.items()}
        out["weights"] = self._weights(p, chosen)
        out["indexes"] = chosen
        return out

    def _weights(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class LaBERmean(_LaBER):
    """LaBER-mean: weights ``mean(p) / p_i`` (the variant the paper recommends)."""

    def _weights(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        return p.mean() / p[chosen]


class LaBERlazy(_LaBER):
    """LaBER-lazy: weights ``1 / p_i``, not normalised."""

    def _weights(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        return 1.0 / p[chosen]


class LaBERmax(_LaBER):
    """LaBER-max: weights ``1 / p_i`` divided by the largest of the chosen ones."""

    def _weights(self, p: np.ndarray, chosen: np.ndarray) -> np.ndarray:
        w = 1.0 / p[chosen]
        return w / w.max()

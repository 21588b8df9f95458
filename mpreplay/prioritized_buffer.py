"""Proportional prioritized replay: :class:`PrioritizedReplayBuffer`, a :class:`~mpreplay.buffer.ReplayBuffer`
whose selector draws by priority."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from . import checks
from ._ext.calls import PrioritizedCalls
from ._ext.selector import Selector
from ._ext.sumtree import PriorityTree
from .buffer import ReplayBuffer
from .prefetch import Prefetcher
from .selectors import SelectorSpec

__all__ = ["PrioritizedReplayBuffer"]


class PrioritizedReplayBuffer(PrioritizedCalls, ReplayBuffer):
    """Proportional prioritized replay (Schaul et al. 2016), stratified as in Ape-X.

    A transition is drawn with probability ``(p_i + eps)**alpha / sum_j (p_j + eps)**alpha``.
    New transitions without given priorities get the largest priority stored now
    (1.0 in an empty buffer).

    Parameters
    ----------
    alpha : float
        Prioritisation exponent (0 = uniform).
    eps : float
        Added to every priority so none has zero probability.
    new_priority : {"max_stored", "max_ever"}
        What a transition added without a priority gets: the largest priority stored
        now, or the largest ever set (at least 1.0, never falling until ``clear()``:
        cpprb's rule, shared by every process of a shared buffer).
    selector : str or SelectorSpec, optional
        Another selector that draws by priority: ``"max_heap"`` (the highest priority first),
        ``"min_heap"`` (the lowest first), see :mod:`mpreplay.selectors`; or
        ``SelectorSpec("prioritized", alpha=..., eps=..., new_priority=...)``, the default
        (``alpha``, ``eps`` and ``new_priority`` are its options: given ``selector``, they stay
        at their defaults here).
    weights_dtype : numpy dtype
        dtype of ``sample``'s importance ``weights``: float64, or float32 (what a float32
        loss takes without a cast).
    indexes_dtype : numpy dtype
        dtype of ``sample``'s ``indexes``: int64, or uint64 (cpprb's).  ``update_priorities``
        takes either.
    **options
        As for :class:`ReplayBuffer`.
    """

    _CONFIG = ReplayBuffer._CONFIG + ("_float32_weights", "_uint64_indexes")
    _PRIORITIZED = True
    _float32_weights: bool
    _uint64_indexes: bool
    _tree: PriorityTree | None  # the prioritized selector's tree, None with another selector

    def __init__(
        self,
        size: int,
        env_dict: Mapping[str, Mapping[str, Any]],
        *,
        alpha: float = 0.6,
        eps: float = 1e-4,
        new_priority: str = "max_stored",
        selector: str | SelectorSpec | None = None,
        weights_dtype: Any = np.float64,
        indexes_dtype: Any = np.int64,
        **options: Any,
    ):
        given = {"alpha": alpha, "eps": eps, "new_priority": new_priority}
        if selector is None:
            selector = SelectorSpec("prioritized", **given)
        else:
            for name, default in (("alpha", 0.6), ("eps", 1e-4), ("new_priority", "max_stored")):
                if not (type(given[name]) is type(default) and given[name] == default):
                    raise TypeError(
                        f"{name}: an option of the prioritized selector; with selector= give it "
                        f"there: SelectorSpec('prioritized', {name}=...)"
                    )
        self._float32_weights = checks.dtype("weights_dtype", weights_dtype, (np.float64, np.float32)) == np.float32
        self._uint64_indexes = checks.dtype("indexes_dtype", indexes_dtype, (np.int64, np.uint64)) == np.uint64
        super().__init__(size, env_dict, selector=selector, **options)

    def _call_options(self) -> dict[str, Any]:
        return {"float32_weights": self._float32_weights, "uint64_indexes": self._uint64_indexes}

    def _make_selector(self, array: np.ndarray, create: bool) -> Selector:
        selector = super()._make_selector(array, create)
        self._tree = getattr(selector, "tree", None)
        return selector

    @property
    def alpha(self) -> float | None:
        """The prioritisation exponent, or None where the selector has none."""
        return self._selector_spec.kernel_options().get("alpha")

    @property
    def eps(self) -> float | None:
        """What is added to every priority, or None where the selector adds nothing."""
        return self._selector_spec.kernel_options().get("eps")

    def leaf_mass(self) -> tuple[float, float]:
        """``(total, smallest)``: the sum of the leaf weights (p + eps) ** alpha of the stored
        transitions and the smallest positive one (inf when none)."""
        return float(self._selector.total_weight), float(self._selector.smallest_weight)

    def get_max_priority(self) -> float:
        """Largest priority stored now (1.0 when the buffer is empty)."""
        m = self._selector.largest_priority()
        return 1.0 if m == -np.inf else float(m)

    def default_priority(self) -> float:
        """The priority a transition added now without one gets (see ``new_priority``)."""
        return float(self._selector.new_item_priority)

    def clear(self) -> None:
        """Forget every transition (and, with ``new_priority="max_ever"``, the priorities ever set)."""
        super().clear()
        if self._tree is not None and self._selector_spec.kernel_options()["max_ever"]:
            self._tree.forget_max_ever()

    @property
    def max_priority(self) -> float:
        """The largest priority this buffer accepts (``get_max_priority()`` is the largest stored):
        no sum of leaf weights can overflow below it.  It depends on the capacity, alpha and eps."""
        return self._ring.max_priority

    def batches(
        self,
        batch_size: int,
        beta: float = 0.4,
        *,
        prefetch: int = 2,
        timeout: float | None = None,
        as_torch: bool = False,
    ) -> Prefetcher:
        """An endless iterator of ``sample(batch_size, beta)`` batches drawn ``prefetch`` ahead
        on a background thread; see :meth:`ReplayBuffer.batches`.  Priorities may be updated
        from the caller's thread meanwhile."""
        batch_size = checks.integer("batch_size", batch_size, low=1)
        beta = checks.number("beta", beta, low=0.0)
        return self._prefetcher(
            lambda out, t: self.sample(batch_size, beta, timeout=t, out=out), prefetch, timeout, as_torch
        )

    def sample_leaves(self, batch_size: int, *, timeout: float | None = None) -> dict[str, np.ndarray]:
        """Draw as :meth:`sample` does, but give each row's ``leaf`` weight (p + eps) ** alpha and
        slot ``tags`` instead of importance weights.

        For a client that draws from several buffers and weighs the rows across all of
        them (:mod:`mpreplay.sharded`).  A slot's tag changes whenever the slot is
        rewritten: :meth:`slot_tags` tells whether a sampled row is still there.
        """
        return self._ring.sample(
            checks.integer("batch_size", batch_size, low=1), True, -1.0, checks.seconds("timeout", timeout), None, True
        )

    def slot_tags(self, indexes: Any) -> np.ndarray:
        """The current tag of each slot in ``indexes`` (see :meth:`sample_leaves`); -1 while
        a writer holds the slot."""
        return self._ring.tags(checks.indexes("indexes", indexes))

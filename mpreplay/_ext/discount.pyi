# Types of the compiled module built from ext/discount.pyx (keep the two in step).  The kernels
# take float32 or float64 2-D arrays (one Cython fused type), filled in place.
import numpy as np

def discounted_cumsum(
    x: np.ndarray, out: np.ndarray, gamma: float, gammas: np.ndarray | None, dones: np.ndarray | None, right: bool
) -> None:
    """Fill ``out`` with the discounted cumulative sum of ``x`` along axis 1."""

def n_step_fold(
    rewards: np.ndarray,
    dones: np.ndarray | None,
    gamma: float,
    n: int,
    returns: np.ndarray,
    discounts: np.ndarray,
    steps: np.ndarray,
) -> None:
    """Fold up to ``n`` rewards forward from every step, stopping after a done."""

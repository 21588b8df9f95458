"""Discounted cumulative sums, n-step returns and GAE.

All functions take 1-D arrays or batched 2-D arrays (``axis`` names the time
axis), in float32 or float64, and accumulate in float64 whatever the input
dtype: a float32 result is the exact value rounded once.  They also accept
torch tensors when torch is installed; the result is then a tensor that is
differentiable with respect to the inputs (computed on the CPU).

Conventions shared by every function:

* ``dones[t]`` true (any non-zero value) means step ``t`` ends its episode, so
  nothing after ``t`` is discounted back into ``t``.
* The link between steps ``t`` and ``t + 1`` is ``gamma[t] * (1 - dones[t])``.
  The right sum follows it backwards, ``y[t] = x[t] + gamma[t] (1 - dones[t]) y[t+1]``;
  the left sum forwards, ``y[t] = x[t] + gamma[t-1] (1 - dones[t-1]) y[t-1]``.
  With the same arguments the left sum is therefore the transpose of the
  right sum, which is what backpropagation through either one needs.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, NamedTuple, overload

import numpy as np
from numpy.typing import ArrayLike

from . import checks
from ._ext import discount as _kernel

if TYPE_CHECKING:  # torch is optional: only its tensors' type is named here
    import torch

    _Dones = ArrayLike | torch.Tensor | None

__all__ = [
    "discounted_cumsum_right",
    "discounted_cumsum_left",
    "n_step_returns",
    "NStepReturns",
    "gae",
]


class NStepReturns(NamedTuple):
    """Result of :func:`n_step_returns`, each shaped like ``rewards``.

    ``returns[t] = sum_{k<m} gamma**k * rewards[t+k]`` where ``m = steps[t]``;
    ``discounts[t] = gamma**m`` is the factor for bootstrapping from the
    state reached after step ``t + m - 1``.  ``m`` is ``n``, or fewer when the
    episode ends (``dones[t+m-1]``) or the array ends first.  For a terminal
    episode end mask the bootstrap yourself:
    ``target = returns + discounts * (1 - dones[t + steps - 1]) * value_next``.
    """

    returns: Any
    discounts: Any
    steps: Any


@overload
def discounted_cumsum_right(
    x: torch.Tensor, gamma: ArrayLike | torch.Tensor, *, dones: _Dones = None, axis: int = -1, out: None = None
) -> torch.Tensor: ...
@overload
def discounted_cumsum_right(
    x: ArrayLike, gamma: torch.Tensor, *, dones: _Dones = None, axis: int = -1, out: None = None
) -> torch.Tensor: ...
@overload
def discounted_cumsum_right(
    x: ArrayLike, gamma: ArrayLike, *, dones: _Dones = None, axis: int = -1, out: np.ndarray | None = None
) -> np.ndarray: ...
def discounted_cumsum_right(
    x: ArrayLike | torch.Tensor,
    gamma: ArrayLike | torch.Tensor,
    *,
    dones: _Dones = None,
    axis: int = -1,
    out: np.ndarray | None = None,
) -> np.ndarray | torch.Tensor:
    """Discounted sum of the future: ``y[t] = x[t] + gamma[t] (1 - dones[t]) y[t+1]``.

    Parameters
    ----------
    x : float32 or float64 array (1-D or 2-D), or torch tensor
        Values to sum; never modified (unless passed again as ``out``).
    gamma : float or array in [0, 1]
        A scalar, an array shaped like ``x`` or broadcastable to it, or, for
        2-D ``x``, a 1-D array as long as the time axis.
    dones : array shaped like ``x``, optional
        Non-zero where a step ends its episode; the sum restarts there.
    axis : int
        The time axis.
    out : array, optional
        Receives the result; same shape and dtype as ``x``.  Not for tensors.

    Returns
    -------
    Array (or tensor) with the shape and dtype of ``x``.
    """
    return _cumsum(x, gamma, dones, axis, out, right=True)


@overload
def discounted_cumsum_left(
    x: torch.Tensor, gamma: ArrayLike | torch.Tensor, *, dones: _Dones = None, axis: int = -1, out: None = None
) -> torch.Tensor: ...
@overload
def discounted_cumsum_left(
    x: ArrayLike, gamma: torch.Tensor, *, dones: _Dones = None, axis: int = -1, out: None = None
) -> torch.Tensor: ...
@overload
def discounted_cumsum_left(
    x: ArrayLike, gamma: ArrayLike, *, dones: _Dones = None, axis: int = -1, out: np.ndarray | None = None
) -> np.ndarray: ...
def discounted_cumsum_left(
    x: ArrayLike | torch.Tensor,
    gamma: ArrayLike | torch.Tensor,
    *,
    dones: _Dones = None,
    axis: int = -1,
    out: np.ndarray | None = None,
) -> np.ndarray | torch.Tensor:
    """Discounted sum of the past: ``y[t] = x[t] + gamma[t-1] (1 - dones[t-1]) y[t-1]``.

    Takes the same arguments as :func:`discounted_cumsum_right`, whose
    transpose it is; ``gamma[t]`` and ``dones[t]`` describe the link from step
    ``t`` to step ``t + 1`` in both.
    """
    return _cumsum(x, gamma, dones, axis, out, right=False)


def n_step_returns(
    rewards: ArrayLike | torch.Tensor, dones: _Dones, gamma: float, n: int, *, axis: int = -1
) -> NStepReturns:
    """Fold up to ``n`` rewards forward from every step, stopping at episode ends.

    ``dones`` may be None (no episode ends inside the array).  Returns an
    :class:`NStepReturns` of ``returns`` (dtype of ``rewards``), ``discounts``
    (``gamma ** steps``, dtype of ``rewards``) and ``steps`` (int64).  With
    torch tensors, ``returns`` is differentiable with respect to ``rewards``;
    ``discounts`` and ``steps`` are constant tensors.  Costs O(n) per step.
    """
    n = checks.integer("n", n, low=1)
    gamma = _check_scalar_gamma(gamma, "gamma")
    if checks.is_tensor(rewards):
        return _torch_n_step(rewards, dones, gamma, n, axis)
    r = _as_float_array(rewards, "rewards")
    ax = _check_axis(axis, r.ndim, "rewards")
    d = _as_dones(dones, r.shape)
    result = NStepReturns(np.empty_like(r), np.empty_like(r), np.empty(r.shape, np.int64))
    longest = min(n, max(r.shape[ax], 1))  # no window reaches past the array
    _kernel.n_step_fold(_time_last(r, ax), _time_last(d, ax), gamma, longest, *(_time_last(a, ax) for a in result))
    return result


@overload
def gae(
    rewards: torch.Tensor, values: ArrayLike | torch.Tensor, dones: _Dones, gamma: float, lam: float, *, axis: int = -1
) -> torch.Tensor: ...
@overload
def gae(
    rewards: ArrayLike, values: torch.Tensor, dones: _Dones, gamma: float, lam: float, *, axis: int = -1
) -> torch.Tensor: ...
@overload
def gae(
    rewards: ArrayLike, values: ArrayLike, dones: _Dones, gamma: float, lam: float, *, axis: int = -1
) -> np.ndarray: ...
def gae(
    rewards: ArrayLike | torch.Tensor,
    values: ArrayLike | torch.Tensor,
    dones: _Dones,
    gamma: float,
    lam: float,
    *,
    axis: int = -1,
) -> np.ndarray | torch.Tensor:
    """Generalised advantage estimates.

    ``values`` has one more step than ``rewards`` along ``axis``:
    ``values[t]`` estimates the state before step ``t`` and the last entry is
    the bootstrap value of the state after the final step.  With
    ``delta[t] = rewards[t] + gamma (1 - dones[t]) values[t+1] - values[t]``
    the advantages are the right sum of ``delta`` with discount ``gamma * lam``
    reset at ``dones``.  ``dones`` marks terminal steps (no bootstrap); it may
    be None.  The lambda-returns (value targets) are
    ``advantages + values[:-1]``; they are not returned.

    Returns the advantages, shaped like ``rewards``, in the result dtype of
    ``rewards`` and ``values`` (a tensor if either is one, differentiable).
    """
    gamma = _check_scalar_gamma(gamma, "gamma")
    lam = _check_scalar_gamma(lam, "lam")
    if checks.is_tensor(rewards) or checks.is_tensor(values):
        return _torch_gae(rewards, values, dones, gamma, lam, axis)
    r = _as_float_array(rewards, "rewards")
    v = _as_float_array(values, "values")
    ax = _check_values_shape(r.shape, v.shape, axis)
    d = _as_dones(dones, r.shape)
    head = np.moveaxis(v, ax, -1)[..., :-1].astype(np.float64)
    tail = np.moveaxis(v, ax, -1)[..., 1:].astype(np.float64)
    if d is not None:
        tail[np.moveaxis(d, ax, -1).view(bool)] = 0.0
    delta = np.moveaxis(r, ax, -1) + gamma * tail - head
    reset = None if d is None else np.moveaxis(d, ax, -1).view(bool)
    advantages = discounted_cumsum_right(delta, gamma * lam, dones=reset, axis=-1)
    return np.moveaxis(advantages.astype(np.result_type(r, v), copy=False), -1, ax)


# --- numpy path ---------------------------------------------------------------------------------


def _cumsum(x: Any, gamma: Any, dones: _Dones, axis: int, out: np.ndarray | None, right: bool) -> Any:
    """The right or left sum of ``x``: an array, or a tensor if ``x`` or ``gamma`` is one."""
    if checks.is_tensor(x) or checks.is_tensor(gamma):
        if out is not None:
            raise TypeError("out: not supported with torch tensors")
        return _torch_cumsum(x, gamma, dones, axis, right)
    xs = _as_float_array(x, "x")
    ax = _check_axis(axis, xs.ndim, "x")
    scalar, gammas = _check_gamma(gamma, xs.shape, ax)
    d = _as_dones(dones, xs.shape)
    if out is None:
        out = np.empty_like(xs)
    else:
        out = _check_out(out, xs)
        xs = _apart_from(out, xs, same_layout_ok=True)
        gammas = _apart_from(out, gammas, same_layout_ok=False)  # a broadcast view, never ``x`` itself
        d = _apart_from(out, d, same_layout_ok=False)  # a fresh view, never ``x`` itself
    _kernel.discounted_cumsum(
        _time_last(xs, ax), _time_last(out, ax), scalar, _time_last(gammas, ax), _time_last(d, ax), right
    )
    return out


def _as_float_array(value: ArrayLike, name: str) -> np.ndarray:
    a = np.asarray(value)
    if a.dtype not in (np.float32, np.float64):
        raise TypeError(f"{name}: expected a float32 or float64 array, got dtype {a.dtype}")
    if a.ndim not in (1, 2):
        raise ValueError(f"{name}: expected a 1-D or 2-D array, got shape {a.shape}")
    return a


def _check_axis(axis: int, ndim: int, name: str) -> int:
    return checks.integer(f"axis (of {ndim}-D {name})", axis, low=-ndim, high=ndim - 1) % ndim


def _check_values_shape(rewards_shape: tuple, values_shape: tuple, axis: int) -> int:
    """The time axis of ``rewards``, once ``values`` is known to have one bootstrap step more on it."""
    ax = _check_axis(axis, len(rewards_shape), "rewards")
    expected = tuple(n + (i == ax) for i, n in enumerate(rewards_shape))
    if values_shape != expected:
        raise ValueError(
            f"values: expected shape {expected} (rewards' shape plus one bootstrap step on axis {axis}), "
            f"got {values_shape}"
        )
    return ax


def _check_scalar_gamma(gamma: Any, name: str) -> float:
    try:
        value = float(gamma)
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a real number in [0, 1], got {gamma!r}") from None
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name}: expected a finite number in [0, 1], got {value}")
    return value


def _check_gamma(gamma: ArrayLike, shape: tuple, ax: int) -> tuple[float, np.ndarray | None]:
    """Split ``gamma`` into a scalar or a float64 array view broadcast to ``shape``."""
    if isinstance(gamma, (float, int)):
        return _check_scalar_gamma(gamma, "gamma"), None
    g = np.asarray(gamma)
    if g.dtype.kind not in "fiu" or g.dtype == np.float16:
        raise TypeError(f"gamma: expected real numbers in [0, 1], got dtype {g.dtype}")
    if g.ndim == 0:
        return _check_scalar_gamma(g, "gamma"), None
    if not np.all((g >= 0.0) & (g <= 1.0)):
        raise ValueError("gamma: expected every discount to be finite and in [0, 1]")
    if len(shape) == 2 and g.ndim == 1 and g.shape[0] == shape[ax]:
        g = g.reshape((-1, 1) if ax == 0 else (1, -1))
    try:
        return 0.0, np.broadcast_to(g.astype(np.float64, copy=False), shape)
    except ValueError:
        raise ValueError(
            f"gamma: expected a scalar, an array broadcastable to {shape} or a 1-D array as long as the time axis, "
            f"got shape {np.shape(gamma)}"
        ) from None


def _as_dones(dones: _Dones, shape: tuple) -> np.ndarray | None:
    """``dones`` as a uint8 view of booleans shaped like the data, or None."""
    if dones is None:
        return None
    if checks.is_tensor(dones):
        dones = dones.detach().cpu().numpy()
    d = np.asarray(dones)
    if d.shape != shape:
        raise ValueError(f"dones: expected shape {shape} like the data, got {d.shape}")
    if d.dtype != bool:
        if d.dtype.kind not in "fiu":
            raise TypeError(f"dones: expected booleans or numbers, got dtype {d.dtype}")
        d = d != 0
    return d.view(np.uint8)


def _check_out(out: Any, x: np.ndarray) -> np.ndarray:
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out: expected a numpy array, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype:
        raise ValueError(f"out: expected shape {x.shape} and dtype {x.dtype}, got {out.shape} and {out.dtype}")
    if not out.flags.writeable:
        raise ValueError("out: expected a writeable array")
    return out


@overload
def _apart_from(out: np.ndarray, a: np.ndarray, same_layout_ok: bool) -> np.ndarray: ...
@overload
def _apart_from(out: np.ndarray, a: None, same_layout_ok: bool) -> None: ...
@overload
def _apart_from(out: np.ndarray, a: np.ndarray | None, same_layout_ok: bool) -> np.ndarray | None: ...
def _apart_from(out: np.ndarray, a: np.ndarray | None, same_layout_ok: bool) -> np.ndarray | None:
    """``a``, copied if writing ``out`` could change it before the kernel reads it.

    ``out`` exactly on top of ``x`` is safe: the kernels read each step of
    ``x`` before writing the same step of ``out``.
    """
    if a is None or not np.may_share_memory(out, a):
        return a
    if same_layout_ok and a.__array_interface__["data"] == out.__array_interface__["data"] and a.strides == out.strides:
        return a
    return a.copy()


@overload
def _time_last(a: np.ndarray, ax: int) -> np.ndarray: ...
@overload
def _time_last(a: None, ax: int) -> None: ...
@overload
def _time_last(a: np.ndarray | None, ax: int) -> np.ndarray | None: ...
def _time_last(a: np.ndarray | None, ax: int) -> np.ndarray | None:
    """A 2-D ``(rows, time)`` view of ``a`` for the kernels."""
    if a is None:
        return None
    return a[None, :] if a.ndim == 1 else np.moveaxis(a, ax, -1)


# --- torch path ---------------------------------------------------------------------------------


def _torch_cumsum(x: Any, gamma: Any, dones: _Dones, axis: int, right: bool) -> torch.Tensor:
    import torch

    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(np.asarray(x))
    return _cumsum_function().apply(x, gamma, dones, axis, right)


@functools.cache
def _cumsum_function() -> type[torch.autograd.Function]:
    """The autograd Function, defined on first use so torch stays optional."""
    import torch

    class DiscountedCumsum(torch.autograd.Function):
        # The right sum is y = M x with M upper triangular; its adjoint M^T is the
        # left sum with the same links, and d y / d link[c] flows through x's grad.
        @staticmethod
        def forward(ctx: Any, x: torch.Tensor, gamma: Any, dones: _Dones, axis: int, right: bool) -> torch.Tensor:
            gamma_np = gamma.detach().cpu().numpy() if isinstance(gamma, torch.Tensor) else gamma
            y = _cumsum(x.detach().cpu().numpy(), gamma_np, dones, axis, None, right)
            ctx.args = (gamma_np, dones, axis, right)
            ctx.gamma_meta = (gamma.shape, gamma.dtype) if isinstance(gamma, torch.Tensor) else None
            out = torch.from_numpy(y).to(x.device)
            ctx.save_for_backward(out)
            return out

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
            gamma_np, dones, axis, right = ctx.args
            y = ctx.saved_tensors[0].detach().cpu().numpy()
            gx = _cumsum(grad.detach().cpu().numpy(), gamma_np, dones, axis, None, not right)
            grad_x = torch.from_numpy(gx).to(grad.device) if ctx.needs_input_grad[0] else None
            grad_gamma = None
            if ctx.needs_input_grad[1]:
                grad_gamma = _links_grad(gx, y, gamma_np, dones, axis, right, *ctx.gamma_meta)
                grad_gamma = grad_gamma.to(grad.device)
            return grad_x, grad_gamma, None, None, None

    return DiscountedCumsum


def _links_grad(
    gx: np.ndarray,
    y: np.ndarray,
    gamma_np: Any,
    dones: _Dones,
    axis: int,
    right: bool,
    shape: torch.Size,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Gradient with respect to ``gamma``: d loss / d link[c] times (1 - dones[c]).

    For the right sum ``y[c] = x[c] + link[c] y[c+1]`` gives
    ``gx[c] * y[c+1]``; for the left sum ``y[c+1] = x[c+1] + link[c] y[c]``
    gives ``gx[c+1] * y[c]``.  The last link leads out of the array.
    """
    import torch

    ax = axis % y.ndim
    gx_t, y_t = np.moveaxis(gx, ax, -1), np.moveaxis(y, ax, -1)
    per_link = np.zeros(gx_t.shape, np.float64)
    per_link[..., :-1] = gx_t[..., :-1] * y_t[..., 1:] if right else gx_t[..., 1:] * y_t[..., :-1]
    d = _as_dones(dones, y.shape)
    if d is not None:
        per_link[np.moveaxis(d.view(bool), ax, -1)] = 0.0
    links = torch.from_numpy(np.moveaxis(per_link, -1, ax))
    g = np.asarray(gamma_np)
    if y.ndim == 2 and g.ndim == 1 and g.shape[0] == y.shape[ax]:
        return links.sum(dim=1 - ax).to(dtype)
    return links.sum_to_size(shape).to(dtype)


def _torch_n_step(rewards: torch.Tensor, dones: _Dones, gamma: float, n: int, axis: int) -> NStepReturns:
    """Sum of ``n`` shifted, masked copies of ``rewards``; autograd sees only tensor ops."""
    import torch

    folded = n_step_returns(rewards.detach().cpu().numpy(), dones, gamma, n, axis=axis)
    steps = torch.from_numpy(folded.steps).to(rewards.device)
    ax = _check_axis(axis, rewards.dim(), "rewards")
    r = rewards.movedim(ax, -1).to(torch.float64)
    m = steps.movedim(ax, -1)
    total = torch.zeros_like(r)
    for k in range(min(n, r.shape[-1])):
        shifted = torch.nn.functional.pad(r[..., k:], (0, k))
        total = total + (gamma**k) * torch.where(m > k, shifted, torch.zeros_like(shifted))
    returns = total.movedim(-1, ax).to(rewards.dtype)
    discounts = torch.from_numpy(folded.discounts).to(rewards.device)
    return NStepReturns(returns, discounts, steps)


def _torch_gae(rewards: Any, values: Any, dones: _Dones, gamma: float, lam: float, axis: int) -> torch.Tensor:
    import torch

    r, v = (t if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t)) for t in (rewards, values))
    dtype = torch.promote_types(r.dtype, v.dtype)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"rewards, values: expected float32 or float64, got {r.dtype} and {v.dtype}")
    ax = _check_values_shape(tuple(r.shape), tuple(v.shape), axis)
    d = _as_dones(dones, tuple(r.shape))
    r, v = r.movedim(ax, -1).to(torch.float64), v.movedim(ax, -1).to(torch.float64)
    tail = v[..., 1:]
    if d is not None:
        alive = torch.from_numpy(~np.moveaxis(d, ax, -1).view(bool)).to(v.device)
        tail = torch.where(alive, tail, torch.zeros_like(tail))
    delta = r + gamma * tail - v[..., :-1]
    d_last = None if d is None else np.moveaxis(d, ax, -1)
    advantages = discounted_cumsum_right(delta, gamma * lam, dones=d_last, axis=-1)
    return advantages.movedim(-1, ax).to(dtype)

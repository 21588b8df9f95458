"""The actor-side n-step reward folder.

:class:`NstepBuffer` sits between an environment and a replay buffer.  It
holds the last ``n`` steps of every environment and turns them into n-step
transitions::

    R_t         = sum_{k<m} gamma**k * r_{t+k}
    next_obs_t  = s_{t+m}                 (the next observation of step t+m-1)
    done_t      = done of step t+m-1      (nonzero when the fold ran into a terminal step)
    truncated_t = truncated of step t+m-1 (1 for rows flushed by on_episode_end)
    discount_t  = gamma**m

with ``m = n``, or fewer when the episode ends within ``n`` steps.  Only the
last folded step can end an episode, so ``done_t`` is set exactly when one of
the folded steps was terminal.  Every other field (obs, act, ...) is the one
of step ``t``.  A learner's target is
``R_t + discount_t * (1 - done_t) * V(next_obs_t)``: a terminal step stops the
bootstrap, a truncated one (time limit) does not.  A step flagged both done
and truncated is terminal.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import checks
from .spec import FieldSpec, convert_batch, parse_env_dict

__all__ = ["NstepBuffer"]

_DISCOUNT = "discount"


def _concat(parts: list[dict[str, np.ndarray]], specs: Mapping[str, FieldSpec]) -> dict[str, np.ndarray]:
    """The rows of several emitted dicts, in order (no rows when there are none)."""
    if not parts:
        return {name: np.empty((0,) + s.shape, s.dtype) for name, s in specs.items()}
    return {name: np.concatenate([p[name] for p in parts]) for name in specs}


def _take(arr: np.ndarray, envs: Any, cols: Any) -> np.ndarray:
    """Rows ``arr[envs, cols]`` as a new array (basic indexing gives a view)."""
    rows = arr[envs, cols]
    return rows.copy() if isinstance(envs, slice) else rows


class NstepBuffer:
    """Folds the rewards of ``size`` consecutive steps into one transition.

    Parameters
    ----------
    env_dict : mapping
        cpprb-style field specs of one step, e.g. ``{"obs": {"shape": 4}, "act": {"dtype": np.int64},
        "rew": {}, "next_obs": {"shape": 4}, "done": {}}``.  It may also declare ``"discount"``
        (a float scalar) to choose that output field's dtype; ``add`` never takes it.
    size : int
        ``n``, the number of rewards folded into one transition (1 = no folding).
    gamma : float
        Discount factor in [0, 1].
    rew, next : str, list of str or None
        The reward fields folded over the steps (float fields, any shape) and the fields taken
        from the last folded step (next observations).  Each may be one name, a list of names
        (as cpprb's ``Nstep`` takes them) or None; the defaults ``"rew"`` and ``"next_obs"``
        apply only when the env_dict has such a field.
    done : str
        Name of the terminal-flag field (a scalar).
    truncated : str, optional
        Name of a scalar field flagging a step that ended its episode without reaching a terminal
        state (a time limit).  Without it, end such episodes with :meth:`on_episode_end`.
    num_envs : int, optional
        With ``E``, every :meth:`add` takes one step of each of ``E`` environments (every field
        has a leading dimension ``E``) and folds the ``E`` streams independently.
    default_dtype : numpy dtype, optional
        dtype of fields that do not name one (float32 when None).

    When is a transition emitted
    ----------------------------
    Step ``t`` of an environment is emitted exactly once:

    * by the ``add`` of step ``t+n-1``, folded over ``m = n`` steps, when that step does not end
      the episode;
    * by the ``add`` of a step flagged ``done`` or ``truncated``, which flushes every pending step
      of its episode (``t`` folded up to and including that step, ``m`` = n or fewer);
    * by :meth:`on_episode_end`, which flushes pending steps as if their last step had been
      flagged truncated (``done`` 0, ``truncated`` 1, bootstrapping).

    Every returned dict has the :meth:`output_env_dict` fields with a leading batch dimension
    (possibly 0 rows), in rows ordered by environment, then by time.  Pending steps not yet
    emitted: :meth:`get_pending_count`; :meth:`clear` drops them.
    """

    def __init__(self, env_dict: Mapping[str, Mapping[str, Any]], size: int, gamma: float = 0.99, *,
                 rew: str | Sequence[str] | None = "rew", next: str | Sequence[str] | None = "next_obs",
                 done: str = "done", truncated: str | None = None,
                 num_envs: int | None = None, default_dtype: Any = None):
        self._n = checks.integer("size", size, low=1)
        self._gamma = checks.number("gamma", gamma, low=0.0, high=1.0)
        self._num_envs = None if num_envs is None else checks.integer("num_envs", num_envs, low=1)
        specs = parse_env_dict(env_dict, default_dtype)
        self._out_specs = self._output_specs(specs)
        self._specs = {name: s for name, s in specs.items() if name != _DISCOUNT}
        self._rews, nexts, self._done, self._truncated = self._check_keys(rew, next, done, truncated)
        self._last_step_fields = {*nexts, self._done, self._truncated} - {None}
        self._init_arrays(1 if self._num_envs is None else self._num_envs)

    # -- construction -------------------------------------------------------
    @staticmethod
    def _output_specs(specs: dict[str, FieldSpec]) -> dict[str, FieldSpec]:
        declared = specs.get(_DISCOUNT)
        if declared is None:
            return {**specs, _DISCOUNT: FieldSpec(_DISCOUNT, (), np.dtype(np.float32))}
        if declared.shape != () or declared.dtype.kind != "f":
            raise ValueError(f"env_dict[{_DISCOUNT!r}]: the output discount is a float scalar, "
                             f"got shape {declared.shape} and dtype {declared.dtype}")
        return specs

    def _names(self, arg: str, value: Any, default: str) -> tuple[str, ...]:
        """The fields ``rew=`` or ``next=`` names: one, a list, or none.  The default name
        applies only when the env_dict has such a field."""
        if value is None:
            return ()
        if isinstance(value, str) and value == default and default not in self._specs:
            return ()
        names = (value,) if isinstance(value, str) else value
        if (isinstance(names, (bytes, Mapping)) or not hasattr(names, "__iter__")
                or not all(isinstance(n, str) for n in names)):
            raise TypeError(f"{arg}: expected a field name, a list of field names or None, got {value!r}")
        return tuple(names)

    def _check_keys(self, rew: Any, next: Any, done: str, truncated: str | None) -> tuple[tuple[str, ...], tuple[str, ...], str, str | None]:
        rews, nexts = self._names("rew", rew, "rew"), self._names("next", next, "next_obs")
        keys = [("rew", k) for k in rews] + [("next", k) for k in nexts] + [("done", done)]
        if truncated is not None:
            keys.append(("truncated", truncated))
        for arg, key in keys:
            if not isinstance(key, str):
                raise TypeError(f"{arg}: expected a field name, got {key!r}")
            if key not in self._specs:
                raise ValueError(f"{arg}: field {key!r} is not in env_dict (fields {list(self._specs)})")
        if len({key for _, key in keys}) < len(keys):
            raise ValueError(f"rew, next, done and truncated must name different fields, got {keys}")
        for key in rews:
            if self._specs[key].dtype.kind != "f":
                raise TypeError(f"rew: field {key!r} must have a float dtype to hold discounted sums, "
                                f"got {self._specs[key].dtype}")
        for arg, key in keys:
            if arg in ("done", "truncated") and self._specs[key].shape != ():
                raise ValueError(f"{arg}: field {key!r} must be a scalar flag, got shape {self._specs[key].shape}")
        return rews, nexts, done, truncated

    def _init_arrays(self, num_envs: int) -> None:
        n = self._n
        # Column c of every ring holds the step of the add() call whose number is c modulo n, in
        # every environment at once: a write is one slice assignment, and an environment's
        # pending steps are always its newest `count` columns, ending at column self._cur.
        self._ring = {name: np.zeros((num_envs, n) + s.shape, s.dtype)
                      for name, s in self._specs.items() if name not in self._rews}
        # Running folded reward of the pending step in each column (float64 whatever rew's dtype).
        self._acc = {name: np.zeros((num_envs, n) + self._specs[name].shape, np.float64) for name in self._rews}
        ages = (np.arange(n)[:, None] - np.arange(n)[None, :]) % n
        powers = [self._gamma ** k for k in range(n + 1)]
        # _weight[c][q]: gamma**(age of column q when column c is written).
        self._weight = np.array(powers)[ages]
        self._discounts = np.array(powers, dtype=self._out_specs[_DISCOUNT].dtype)
        self._full_fold = np.full(num_envs, n)
        self._envs = np.arange(num_envs)
        self._cur = n - 1
        self._set_count(np.zeros(num_envs, np.int64))

    # -- public API -----------------------------------------------------------
    @property
    def size(self) -> int:
        """``n``, the number of steps folded into one transition."""
        return self._n

    @property
    def gamma(self) -> float:
        """The discount factor."""
        return self._gamma

    @property
    def num_envs(self) -> int | None:
        """Number of environments folded side by side (None: single-step add)."""
        return self._num_envs

    def output_env_dict(self) -> dict[str, dict[str, Any]]:
        """The env_dict of emitted transitions: the input fields plus the float ``discount``.

        A replay buffer built on it stores the dicts returned by :meth:`add` and
        :meth:`on_episode_end` as they are.
        """
        return {name: {"shape": s.shape, "dtype": s.dtype} for name, s in self._out_specs.items()}

    def get_pending_count(self, env: int | None = None) -> int:
        """Steps added but not emitted yet, in all environments or in environment ``env``."""
        return int(self._count.sum() if env is None else self._count[self._env_index(env)])

    def clear(self) -> None:
        """Drop every pending step without emitting it."""
        self._set_count(np.zeros_like(self._count))

    def add(self, **step: Any) -> dict[str, np.ndarray]:
        """Add one step (one per environment with ``num_envs``) and return what it completes.

        ``step`` holds every env_dict field except ``discount``.  Without ``num_envs`` it may also
        hold ``k`` consecutive steps of the environment (a leading dimension ``k`` on every
        field), folded as ``k`` single adds.  The whole call is checked and converted first; on
        error nothing changes.  The returned rows are the steps this call completed (see the
        class docstring); the values are copied, so later adds never alter them and the caller
        may reuse its own arrays.
        """
        k, rows = convert_batch(self._specs, step)
        num_envs = len(self._count)
        if self._num_envs is None and k != 1:
            return _concat([self._add_step({name: r[i:i + 1] for name, r in rows.items()}) for i in range(k)],
                           self._out_specs)
        if k != num_envs:
            raise ValueError(f"add: expected a leading dimension num_envs={num_envs} on every field, got a batch of {k}")
        return self._add_step(rows)

    def check(self, **step: Any) -> int:
        """How many steps ``add(**step)`` would take, raising as it would on bad input;
        changes nothing."""
        k, _ = convert_batch(self._specs, step)
        if self._num_envs is not None and k != self._num_envs:
            raise ValueError(f"add: expected a leading dimension num_envs={self._num_envs} on every field, "
                             f"got a batch of {k}")
        return k

    def _add_step(self, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Fold one converted step of every environment."""
        n = self._n
        cur = self._cur = (self._cur + 1) % n
        for name, ring in self._ring.items():
            ring[:, cur] = rows[name]
        for name, acc in self._acc.items():
            acc[:, cur] = 0.0
            acc += self._weight[cur].reshape((n,) + (1,) * (acc.ndim - 2)) * rows[name][:, None]
        done = rows[self._done]
        trunc = None if self._truncated is None else rows[self._truncated]
        # count_nonzero: the cheapest "any" numpy has for a few flags.
        if self._steady and not np.count_nonzero(done) and (trunc is None or not np.count_nonzero(trunc)):
            # Every environment holds n-1 pending steps and none ends: each emits its oldest.
            return self._rows(slice(None), (cur + 1) % n, self._full_fold, truncate=False)
        ends = done != 0 if trunc is None else np.logical_or(done, trunc)
        count = self._count + 1
        emit = np.where(ends, count, count == n)
        self._set_count(np.where(ends, 0, np.minimum(count, n - 1)))
        return self._flush(emit, count, truncate=False)

    def on_episode_end(self, env: int | None = None) -> dict[str, np.ndarray]:
        """End the current episode of every environment, or of environment ``env``, without a flag.

        Emits the pending steps as if the last step added had been flagged truncated: folded up
        to it, ``done`` 0 (the target still bootstraps from its next observation) and
        ``truncated`` 1 when the env_dict has that field.  The next add starts a new episode.
        """
        chosen = np.ones(len(self._count), bool) if env is None else self._envs == self._env_index(env)
        emit = np.where(chosen, self._count, 0)
        self._set_count(np.where(chosen, 0, self._count))
        return self._flush(emit, emit, truncate=True)

    # -- bookkeeping ------------------------------------------------------------
    def _set_count(self, count: np.ndarray) -> None:
        self._count = count
        # Cached because add() checks it on every call.
        self._steady = bool((count == self._n - 1).all())

    def _env_index(self, env: Any) -> int:
        return checks.integer("env", env, low=0, high=len(self._count) - 1)

    def _flush(self, emit: np.ndarray, count: np.ndarray, *, truncate: bool) -> dict[str, np.ndarray]:
        """Emit the ``emit[e]`` oldest of the ``count[e]`` pending steps of each environment ``e``."""
        total = int(emit.sum())
        envs = np.repeat(self._envs, emit)
        # j: position of a row among its environment's emitted rows, oldest first.
        j = np.arange(total) - np.repeat(np.cumsum(emit) - emit, emit)
        pending = count[envs]
        cols = (self._cur - pending + 1 + j) % self._n
        return self._rows(envs, cols, pending - j, truncate=truncate)

    def _rows(self, envs: Any, cols: Any, m: np.ndarray, *, truncate: bool) -> dict[str, np.ndarray]:
        """Transitions starting at ``(envs, cols)``, folded over ``m`` steps up to column ``_cur``."""
        out = {}
        for name, spec in self._out_specs.items():
            if name == _DISCOUNT:
                out[name] = self._discounts[m]
            elif name in self._acc:
                out[name] = self._acc[name][envs, cols].astype(spec.dtype)
            elif name == self._truncated and truncate:
                out[name] = np.ones(len(m), spec.dtype)
            elif name in self._last_step_fields:
                out[name] = _take(self._ring[name], envs, self._cur)
            else:
                out[name] = _take(self._ring[name], envs, cols)
        return out

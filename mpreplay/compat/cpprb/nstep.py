"""cpprb's ``NstepBuffer``: n-step folding with cpprb's timing.

Row ``t`` (the transition that starts at step ``t``) is emitted by the ``add``
of step ``t + n - 1``, whatever ``done`` says, and :meth:`NstepBuffer.on_episode_end`
emits the rows still pending.  A row holds, over the steps ``t .. t + m - 1`` it
folds (``m = n``, or fewer for rows emitted by ``on_episode_end``):

* each ``Nstep["rew"]`` field: ``sum_k gamma**k * prod_{j<k} (1 - done_{t+j}) * rew_{t+k}``
  (cpprb's fold: nothing after a terminal step is added);
* each ``Nstep["next"]`` field: its value at the last folded step;
* ``done``: the largest ``done`` of the folded steps, so a row that runs into a
  terminal step says so (cpprb leaves out the last folded step when ``add`` emits
  the row, and bootstraps through it);
* every other field: its value at step ``t``.

Unlike mpreplay's :class:`mpreplay.NstepBuffer` there is no ``discount`` field:
as in cpprb, every row stored by ``add`` folds ``n`` rewards.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any

import numpy as np

from ... import checks
from .fields import Fields, option_names

__all__ = ["NstepBuffer"]

_NSTEP_KEYS = {"size", "gamma", "rew", "next"}


class NstepBuffer:
    """Local buffer folding the rewards of ``Nstep["size"]`` consecutive steps (cpprb's signature).

    Parameters
    ----------
    env_dict : dict of dict
        cpprb field specs of one step; must have a ``done`` field.
    Nstep : dict
        ``{"size": n, "gamma": 0.99, "rew": name or names, "next": name or names}``;
        only ``size`` is required.
    stack_compress : str or list of str, optional
        Accepted for cpprb's signature; stacks are folded as they are.
    default_dtype : numpy dtype, optional
        dtype of fields that name none (float32 when None).
    next_of : str or list of str, optional
        Also fold ``next_<key>`` for each key, as cpprb does.
    """

    def __init__(
        self,
        env_dict: Mapping[str, object] | None = None,
        Nstep: Mapping[str, Any] | None = None,
        *,
        stack_compress: Any = None,
        default_dtype: Any = None,
        next_of: Any = None,
    ):
        if not isinstance(Nstep, Mapping) or "size" not in Nstep:
            raise TypeError(
                f"Nstep: expected a mapping with at least 'size' (keys {sorted(_NSTEP_KEYS)}), got {Nstep!r}"
            )
        unknown = set(Nstep) - _NSTEP_KEYS
        if unknown:
            raise ValueError(f"Nstep: unknown keys {sorted(unknown)}; expected {sorted(_NSTEP_KEYS)}")
        self._fields = Fields.parse(env_dict, default_dtype, next_of)
        option_names("stack_compress", stack_compress)
        specs = self._fields.specs
        if "done" not in specs or specs["done"].shape not in ((), (1,)):
            raise ValueError(f"env_dict: Nstep needs a scalar 'done' field (fields {list(specs)})")
        self._n = checks.integer("Nstep['size']", Nstep["size"], low=1)
        self._gamma = checks.number("Nstep['gamma']", Nstep.get("gamma", 0.99), low=0.0, high=1.0)
        self._rews = option_names("Nstep['rew']", Nstep.get("rew"))
        self._nexts = option_names("Nstep['next']", Nstep.get("next"))
        for option, names in (("Nstep['rew']", self._rews), ("Nstep['next']", self._nexts)):
            for name in names:
                if name not in specs or name == "done":
                    raise ValueError(
                        f"{option}: {name!r} is not a field of env_dict other than 'done' (fields {list(specs)})"
                    )
        # Pending rows, oldest first: [fields of the first step, folded rewards, coefficient of
        # the next reward, largest done so far].
        self._pending: deque[list] = deque()

    @property
    def fields(self) -> Fields:
        """The fields folded (mpreplay's specs of cpprb's env_dict)."""
        return self._fields

    @property
    def gamma(self) -> float:
        """The discount factor."""
        return self._gamma

    def get_Nstep_size(self) -> int:
        """``n``, the number of steps folded into one row."""
        return self._n

    def add(self, **kwargs: Any) -> dict[str, np.ndarray] | None:
        """Add one step or consecutive steps; returns the rows they complete (cpprb's shapes),
        or None when none is complete yet."""
        rows = self.fold(self._fields.pick(kwargs))
        return rows

    def fold(self, values: Mapping[str, Any]) -> dict[str, np.ndarray] | None:
        """As :meth:`add`, for one value per field (the fields picked already)."""
        k, steps = self._fields.rows(values)
        emitted = []
        for i in range(k):
            # Copied: pending steps outlive the call, and the caller may reuse its arrays.
            step = {name: arr[i].copy() for name, arr in steps.items()}
            emitted += self._push(step)
        return self._stack(emitted) if emitted else None

    def _push(self, step: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
        done = float(step["done"].reshape(-1)[0])
        for row in self._pending:
            for name in self._rews:
                row[1][name] += row[2] * step[name]
            row[2] *= self._gamma * (1.0 - done)
            row[3] = np.maximum(row[3], step["done"])
        self._pending.append(
            [
                step,
                {name: step[name].astype(np.float64) for name in self._rews},
                self._gamma * (1.0 - done),
                step["done"],
            ]
        )
        if len(self._pending) < self._n:
            return []
        return [self._row(self._pending.popleft(), step)]

    def _row(self, pending: list, last: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        first, folded, _, done = pending
        row = dict(first)
        for name in self._rews:
            row[name] = folded[name].astype(self._fields.specs[name].dtype)
        for name in self._nexts:
            row[name] = last[name]
        row["done"] = done
        return row

    def _stack(self, rows: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {
            name: np.stack([r[name] for r in rows]).astype(spec.dtype, copy=False)
            for name, spec in self._fields.specs.items()
        }

    def on_episode_end(self) -> dict[str, np.ndarray]:
        """Emit every pending row, folded up to the last step added (cpprb's shapes)."""
        return self.flush()

    def flush(self) -> dict[str, np.ndarray]:
        """Emit every pending row (what :meth:`on_episode_end` returns)."""
        if not self._pending:
            return {name: np.empty((0,) + s.shape, s.dtype) for name, s in self._fields.specs.items()}
        last = self._pending[-1][0]
        rows = [self._row(p, last) for p in self._pending]
        self._pending.clear()
        return self._stack(rows)

    def clear(self) -> None:
        """Drop the pending steps."""
        self._pending.clear()

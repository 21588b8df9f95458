"""Actors on gymnasium vector environments: a vector env's steps in, a per-env loop's transitions out.

A vector env steps ``E`` sub-environments at once and resets a finished one by
itself, in one of three autoreset modes (gymnasium >= 1.0 names the mode in
``env.metadata["autoreset_mode"]``):

* ``NextStep`` (gymnasium's default): the step that ends an episode returns
  its last observation; the *next* step of that sub-environment ignores its
  action and returns the new episode's first observation with reward 0.  That
  step is not a transition: stored, it would join two episodes.
* ``SameStep``: the step that ends an episode returns the new episode's first
  observation; the last one is in ``info["final_obs"]``.
* ``Disabled``: the caller resets finished sub-environments,
  ``env.reset(options={"reset_mask": mask})``.

:class:`VectorTransitions` takes every ``step``'s results as they come and
returns exactly the transitions a loop over each sub-environment alone would
produce: no step across two episodes, the true last observation of every
episode, ``done`` set by termination only (a truncated episode still
bootstraps), optional n-step folding per sub-environment, and the
sub-environments whose episode ended.  :class:`VectorWriter` stores them in a
buffer and passes the episode ends on, so that n-step folding and compressed
observations (``next_of``, ``stack_compress``) close each episode where it
ended.  Dict and Tuple spaces become one field per leaf (:func:`env_dict`).

The actor loop::

    env = gymnasium.make_vec("CartPole-v1", num_envs=8)
    steps = VectorTransitions(env, nstep=3, gamma=0.99)
    buffer = ReplayBuffer(100_000, steps.env_dict())
    writer = VectorWriter(buffer, env.num_envs)
    obs, info = env.reset(seed=0)
    steps.reset(obs)
    while True:
        act = policy(obs)
        obs, rew, terminated, truncated, info = env.step(act)
        writer.add(steps.step(act, obs, rew, terminated, truncated, info))

gymnasium is imported only to read spaces.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from . import checks
from ._ext.gate import deadline
from ._ext.nstep_fold import RowArena, c_order
from .nstep import NstepBuffer
from .spec import FieldOptions, convert_batch, parse_env_dict
from .vector_spaces import env_dict, leaf_value, per_env_numbers, space_batch, space_leaves

__all__ = ["NEXT_STEP", "SAME_STEP", "DISABLED", "TransitionBatch", "VectorTransitions", "VectorWriter", "env_dict"]

NEXT_STEP, SAME_STEP, DISABLED = "NextStep", "SameStep", "Disabled"  # the values of gymnasium's AutoresetMode
_MODES = (NEXT_STEP, SAME_STEP, DISABLED)

# The folder takes a sub-environment's index with each step: it comes back with every row folded.
_ENV = "env"
# The entries of a state_dict(): per sub-environment its flags, its current observation's fields,
# and the n-step folder's entries.
_STARTED, _SKIP, _NEEDS_RESET, _OBS, _FOLDER = "started", "skip", "needs_reset", "obs.", "nstep."


# ------------------------------------------------------------------- transitions


@dataclass(frozen=True)
class TransitionBatch:
    """Transitions completed by one call of :class:`VectorTransitions`.

    ``rows`` holds the fields of :meth:`VectorTransitions.env_dict`, one row per
    transition, ordered by sub-environment, then by time; ``envs`` the
    sub-environment of each row; ``ended`` the sub-environments whose episode
    ended in the call (their rows are the last of that episode).
    """

    rows: dict[str, np.ndarray]
    envs: np.ndarray
    ended: np.ndarray

    def __len__(self) -> int:
        return len(self.envs)


def _mode(value: Any) -> str:
    mode = getattr(value, "value", value)  # gymnasium's AutoresetMode, or its value
    if mode not in _MODES:
        raise ValueError(
            f"autoreset_mode: expected one of {list(_MODES)} (or gymnasium's AutoresetMode), got {value!r}"
        )
    return mode


class VectorTransitions:
    """Turns the results of a vector env's ``reset`` and ``step`` into the transitions of each sub-environment.

    Parameters
    ----------
    env : gymnasium vector env
        Read for ``num_envs``, ``single_observation_space``, ``single_action_space`` and
        ``metadata["autoreset_mode"]``; never stepped.
    nstep : int, optional
        Fold the rewards of ``nstep`` consecutive steps of each sub-environment into one
        transition (:class:`~mpreplay.NstepBuffer`); rows then carry ``discount`` = gamma ** m.
        None: one transition per step, no ``discount`` field.
    gamma : float
        Discount factor of the folding.
    truncated : bool
        Give every row a ``truncated`` flag (1 on the last transition of an episode cut by a
        time limit).  Either way, truncation never sets ``done``.
    autoreset_mode : str or gymnasium AutoresetMode, optional
        ``"NextStep"``, ``"SameStep"`` or ``"Disabled"``; by default the env's metadata says.

    Call :meth:`reset` with the observations of ``env.reset()``, then :meth:`step` with the
    actions passed to every ``env.step`` and what it returned.  In ``Disabled`` mode, after
    a step that ended episodes, reset those sub-environments
    (``env.reset(options={"reset_mask": mask})``, ``mask`` = :attr:`needs_reset`) and pass
    the observations to ``reset(obs, mask=mask)``.  Each call returns a
    :class:`TransitionBatch`; bad input raises before anything changes.
    """

    def __init__(
        self,
        env: Any,
        *,
        nstep: int | None = None,
        gamma: float = 0.99,
        truncated: bool = False,
        autoreset_mode: Any = None,
    ):
        self._num_envs = checks.integer("env.num_envs", getattr(env, "num_envs", None), low=1)
        if autoreset_mode is None:
            metadata = getattr(env, "metadata", None) or {}
            if "autoreset_mode" not in metadata:
                raise ValueError(
                    "autoreset_mode: env.metadata has no 'autoreset_mode' (a vector env older than "
                    f"gymnasium 1.0, or not gymnasium's): pass one of {list(_MODES)}"
                )
            autoreset_mode = metadata["autoreset_mode"]
        self._mode = _mode(autoreset_mode)
        self._truncated = checks.flag("truncated", truncated)
        self._obs_leaves = space_leaves(env.single_observation_space, "obs", "observation_space")
        self._act_leaves = space_leaves(env.single_action_space, "act", "action_space")
        folded = nstep is not None
        self._env_dict = env_dict(
            env.single_observation_space, env.single_action_space, truncated=self._truncated, discount=folded
        )
        self._next = {f"next_{leaf.name}": leaf.name for leaf in self._obs_leaves}
        self._folder = None
        if folded:
            # Every row's next observation is its last step's, that of the step which emits it:
            # the folder takes the other fields, and the sub-environment of each step.
            fields = {name: spec for name, spec in self._env_dict.items() if name not in self._next}
            fields[_ENV] = {"dtype": np.int64}
            self._folder = NstepBuffer(
                fields,
                checks.integer("nstep", nstep, low=1),
                gamma,
                next=_ENV,
                truncated="truncated" if self._truncated else None,
                num_envs=self._num_envs,
            )
        self._envs = np.arange(self._num_envs)
        self._arena = RowArena()  # the observations' copies and the rows' next observations
        self._obs: dict[str, np.ndarray] | None = None  # each sub-environment's current observation
        self._started = np.zeros(self._num_envs, bool)  # its current episode has steps
        self._skip = np.zeros(self._num_envs, bool)  # NextStep: its next step is a reset step
        self._needs_reset = np.zeros(self._num_envs, bool)  # Disabled: ended, not reset yet

    # -- what it produces ---------------------------------------------------------
    @property
    def num_envs(self) -> int:
        return self._num_envs

    @property
    def autoreset_mode(self) -> str:
        """``"NextStep"``, ``"SameStep"`` or ``"Disabled"``."""
        return self._mode

    @property
    def needs_reset(self) -> np.ndarray:
        """In Disabled mode, the sub-environments whose episode ended and that were not reset yet (a bool mask)."""
        return self._needs_reset.copy()

    def env_dict(self) -> dict[str, FieldOptions]:
        """The env_dict of the rows it returns: build the replay buffer on it."""
        return {name: spec.copy() for name, spec in self._env_dict.items()}

    # -- restarting an actor -----------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """What it holds between calls -- each sub-environment's current observation (once
        reset), which episodes have steps or await a reset, and the n-step folder's pending
        steps -- as copies of plain arrays by name: save them (``np.savez(file, **state)``),
        and :meth:`load_state_dict` them into a new one for the same env after a restart, so
        that no step is lost or emitted twice."""
        out = {_STARTED: self._started.copy(), _SKIP: self._skip.copy(), _NEEDS_RESET: self._needs_reset.copy()}
        if self._obs is not None:
            out.update({f"{_OBS}{name}": value.copy() for name, value in self._obs.items()})
        if self._folder is not None:
            out.update({f"{_FOLDER}{name}": value for name, value in self._folder.state_dict().items()})
        return out

    def load_state_dict(self, state_dict: Mapping[str, np.ndarray]) -> None:
        """Take what ``state_dict`` (from :meth:`state_dict` of one for the same env and options)
        holds; ValueError naming the first entry that differs, changing nothing."""
        flags = ((self._num_envs,), np.dtype(bool))
        expected: dict[str, tuple[tuple[int, ...], np.dtype | None]] = dict.fromkeys(
            (_STARTED, _SKIP, _NEEDS_RESET), flags
        )
        if isinstance(state_dict, Mapping) and any(str(key).startswith(_OBS) for key in state_dict):
            expected.update({f"{_OBS}{leaf.name}": ((self._num_envs,) + leaf.shape, None) for leaf in self._obs_leaves})
        if self._folder is not None:
            expected.update(
                {f"{_FOLDER}{name}": (value.shape, value.dtype) for name, value in self._folder.state_dict().items()}
            )
        arrays = checks.state_arrays("state_dict", state_dict, expected)
        if self._folder is not None:
            n = len(_FOLDER)
            self._folder.load_state_dict({key[n:]: value for key, value in arrays.items() if key.startswith(_FOLDER)})
        obs = {key[len(_OBS) :]: value for key, value in arrays.items() if key.startswith(_OBS)}
        self._obs = obs or None
        self._started, self._skip, self._needs_reset = arrays[_STARTED], arrays[_SKIP], arrays[_NEEDS_RESET]

    # -- the calls ------------------------------------------------------------------
    def reset(self, obs: Any, *, mask: Any = None) -> TransitionBatch:
        """Start new episodes with ``obs``, the observations ``env.reset`` returned.

        ``mask`` (a bool per sub-environment) names the sub-environments reset; None: all.
        An episode a reset cuts short ends as if truncated: its pending folded steps are
        returned, bootstrapping from its last observation.
        """
        new = space_batch(obs, self._obs_leaves, self._num_envs, "obs")
        chosen = np.ones(self._num_envs, bool) if mask is None else self._mask(mask)
        batch = self._cut(chosen & self._started)
        if self._obs is None:
            self._obs = {name: self._copy(value) for name, value in new.items()}
        else:
            for name, value in new.items():
                self._obs[name][chosen] = value[chosen]
        self._started &= ~chosen
        self._skip &= ~chosen
        self._needs_reset &= ~chosen
        return batch

    def step(
        self,
        actions: Any,
        obs: Any,
        rewards: Any,
        terminated: Any,
        truncated: Any,
        infos: Mapping[str, Any] | None = None,
    ) -> TransitionBatch:
        """The transitions completed by one ``env.step(actions)`` that returned the rest.

        ``infos`` is needed in SameStep mode only (its ``final_obs``).
        """
        if self._obs is None:
            raise RuntimeError("step: call reset(obs) with the observations of env.reset() first")
        if self._needs_reset.any():
            raise RuntimeError(
                f"step: sub-environments {np.flatnonzero(self._needs_reset).tolist()} ended their "
                "episode (Disabled autoreset): reset them, env.reset(options={'reset_mask': mask}), "
                "and pass the observations to reset(obs, mask=mask) first"
            )
        num_envs = self._num_envs
        act = space_batch(actions, self._act_leaves, num_envs, "actions")
        nxt = space_batch(obs, self._obs_leaves, num_envs, "obs")
        rew = per_env_numbers("rewards", rewards, num_envs)
        term = per_env_numbers("terminated", terminated, num_envs) != 0
        trunc = per_env_numbers("truncated", truncated, num_envs) != 0
        real = ~self._skip
        ended = (term | trunc) & real
        # The observations copied once, in C order (the caller may reuse its arrays, and a
        # transposed view's rows are copied faster once than strided at every use): the next
        # step's, and the rows' next observations, gathered from them.
        nxt = {name: self._copy(value) for name, value in nxt.items()}
        last = nxt
        if self._mode == SAME_STEP and ended.any():
            last = self._final_obs(nxt, infos, ended)
        rows = {**self._obs, **act, "rew": rew, "done": term, **{name: last[key] for name, key in self._next.items()}}
        if self._truncated:
            rows["truncated"] = trunc
        batch = self._emit(rows, real, term, trunc, ended)
        self._obs = nxt
        self._started = (self._started | real) & ~ended
        if self._mode == NEXT_STEP:
            self._skip = ended
        elif self._mode == DISABLED:
            self._needs_reset = ended
        return batch

    # -- bookkeeping --------------------------------------------------------------------
    def _copy(self, value: np.ndarray) -> np.ndarray:
        return c_order(value, self._arena.empty(value.shape, value.dtype))

    def _mask(self, mask: Any) -> np.ndarray:
        arr = np.asarray(mask)
        if arr.shape != (self._num_envs,) or arr.dtype != np.bool_:
            raise ValueError(
                f"mask: expected {self._num_envs} bools (one per sub-environment), got {arr.dtype} of shape {arr.shape}"
            )
        return arr

    def _final_obs(
        self, nxt: dict[str, np.ndarray], infos: Mapping[str, Any] | None, ended: np.ndarray
    ) -> dict[str, np.ndarray]:
        """The next observations with each ended sub-environment's ``info["final_obs"]`` in place."""
        final = None if infos is None else infos.get("final_obs")
        if final is None or len(final) != self._num_envs:
            raise ValueError(
                "infos: SameStep autoreset mode gives an ended episode's last observation in "
                f"infos['final_obs'] (one entry per sub-environment); got infos={infos!r:.200}"
            )
        last = {name: value.copy() for name, value in nxt.items()}
        for e in np.flatnonzero(ended):
            if final[e] is None:
                raise ValueError(
                    f"infos['final_obs'][{e}]: sub-environment {e} ended its episode but has no final observation"
                )
            for leaf in self._obs_leaves:
                value = np.asarray(leaf_value(final[e], leaf, f"infos['final_obs'][{e}]"))
                if value.shape != leaf.shape:
                    raise ValueError(
                        f"infos['final_obs'][{e}]: field {leaf.name!r} expected shape {leaf.shape}, got {value.shape}"
                    )
                last[leaf.name][e] = value
        return last

    def _emit(
        self, rows: dict[str, Any], real: np.ndarray, term: np.ndarray, trunc: np.ndarray, ended: np.ndarray
    ) -> TransitionBatch:
        if self._folder is None:
            keep = np.flatnonzero(real)
            out = {name: np.asarray(value)[keep] for name, value in rows.items()}
            return TransitionBatch(out, keep, np.flatnonzero(ended))
        step = {name: value for name, value in rows.items() if name not in self._next}
        step[_ENV] = self._envs
        if not real.all():
            # A reset step goes through the folder flagged terminal, so that it comes straight
            # back out (its sub-environment has nothing pending) and is dropped below.
            step["done"] = term | ~real
        parts = [self._folder.add(**step)]
        if not self._truncated:
            # Without a truncated field only an explicit episode end flushes a truncated episode.
            parts += [self._folder.on_episode_end(int(e)) for e in np.flatnonzero(trunc & ~term & real)]
        return self._batch(parts, rows, real, np.flatnonzero(ended))

    def _cut(self, cut: np.ndarray) -> TransitionBatch:
        """End the episodes of the ``cut`` sub-environments now, as if truncated."""
        envs = np.flatnonzero(cut)
        if self._folder is None or not len(envs):
            return self._empty(envs)
        obs = self._obs
        assert obs is not None  # a started sub-environment was given its observations by reset()
        parts = [self._folder.on_episode_end(int(e)) for e in envs]
        last = {name: obs[key] for name, key in self._next.items()}
        return self._batch(parts, last, np.ones(self._num_envs, bool), envs)

    def _batch(
        self, parts: list[dict[str, np.ndarray]], last: Mapping[str, np.ndarray], real: np.ndarray, ended: np.ndarray
    ) -> TransitionBatch:
        folded = parts[0] if len(parts) == 1 else {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        envs = folded.pop(_ENV)
        order = None  # the folder's rows as they are: one part, every row real
        if len(parts) > 1 or not real[envs].all():
            order = np.flatnonzero(real[envs])
            if len(parts) > 1:
                order = order[np.argsort(envs[order], kind="stable")]
            envs = envs[order]
        out = {}
        for name in self._env_dict:
            key = self._next.get(name)
            if key is not None:
                value = np.asarray(last[name])
                out[name] = np.take(value, envs, 0, self._arena.empty((len(envs), *value.shape[1:]), value.dtype))
            else:
                out[name] = folded[name] if order is None else folded[name][order]
        return TransitionBatch(out, envs, ended)

    def _empty(self, ended: np.ndarray) -> TransitionBatch:
        rows = {name: np.empty((0, *spec.shape), spec.dtype) for name, spec in parse_env_dict(self._env_dict).items()}
        return TransitionBatch(rows, np.empty(0, np.int64), ended)


# ---------------------------------------------------------------------- writing


def _left(until: float) -> float | None:
    """The seconds from now to the monotonic deadline ``until`` (None: no limit), at least 0."""
    return None if until == np.inf else max(0.0, until - time.monotonic())


class VectorWriter:
    """Stores :class:`TransitionBatch` es in a replay buffer, each sub-environment's episodes in order.

    A buffer that takes interleaved episodes as they come gets each batch in one ``add``.
    One that keeps state between an episode's steps (``nstep``, ``next_of``,
    ``stack_compress``) gets every sub-environment's rows through a writer of its own
    (:meth:`~mpreplay.ReplayBuffer.episode_writer`), and ``on_episode_end`` where its
    episode ended; a compressed buffer then needs ``lanes=`` at least the number of
    sub-environments of all its writing processes.  :meth:`close` gives the lanes back.
    """

    def __init__(self, buffer: Any, num_envs: int):
        num_envs = checks.integer("num_envs", num_envs, low=1)
        self._buffer = buffer
        self._writers = [buffer.episode_writer() for _ in range(num_envs)]
        self._batched = all(w is buffer for w in self._writers)
        # A batch an exception interrupted, and its steps done before (see add); another drops it.
        self._partial: tuple[TransitionBatch, int] | None = None

    def add(self, batch: TransitionBatch, priorities: ArrayLike | None = None, *, timeout: float | None = None) -> None:
        """Store ``batch`` (with one priority per row, for a prioritized buffer).

        Priorities and values are checked for the whole batch before anything is stored;
        ``timeout`` is one deadline for the whole call, every wait inside it included.

        A buffer that takes the batch in one ``add`` stores all of it or, raising, none.  Through
        per-sub-environment writers it is stored in steps, each all or nothing: every
        sub-environment's rows, then its episode's end.  When one raises (TimeoutError; ValueError
        from a compressed buffer that cannot rebuild the observations), the steps before it stay
        done and the writer notes how far the batch got: ``add`` called again with the same batch
        (object) goes on from the step that raised, so each transition is stored once.
        """
        if not isinstance(batch, TransitionBatch):
            raise TypeError(f"batch: expected a TransitionBatch, got {type(batch).__name__}")
        until = deadline(checks.seconds("timeout", timeout))
        if priorities is not None:
            limit = getattr(self._buffer, "max_priority", None)
            if limit is None:
                raise TypeError(f"priorities: a {type(self._buffer).__name__} takes no priorities")
            priorities = checks.priorities("priorities", priorities, len(batch), max_priority=limit)
        if len(batch.envs) and batch.envs.max() >= len(self._writers):
            raise ValueError(
                f"batch: rows of sub-environment {int(batch.envs.max())}, but this writer has {len(self._writers)}"
            )
        if self._batched:
            if len(batch):
                self._store(self._buffer, batch.rows, priorities, timeout)
            return
        # Values are converted for the whole batch first: a bad one stops it before any is stored.
        specs = {name: spec for name, spec in parse_env_dict(self._buffer.get_env_dict()).items() if name in batch.rows}
        rows = convert_batch(specs, {name: batch.rows[name] for name in specs})[1] if len(batch) else {}
        rows = {**batch.rows, **rows}
        bounds = np.searchsorted(batch.envs, np.arange(len(self._writers) + 1))
        ended = np.zeros(len(self._writers), bool)
        ended[batch.ended] = True
        first = self._partial[1] if self._partial is not None and self._partial[0] is batch else 0
        self._partial = None
        for step in range(first, 2 * len(self._writers)):
            e, end = divmod(step, 2)
            lo, hi = bounds[e], bounds[e + 1]
            try:
                if end and ended[e]:
                    self._writers[e].on_episode_end(timeout=_left(until))
                elif not end and hi > lo:
                    self._store(
                        self._writers[e],
                        {k: v[lo:hi] for k, v in rows.items()},
                        None if priorities is None else priorities[lo:hi],
                        _left(until),
                    )
            except BaseException:
                self._partial = (batch, step)
                raise

    @staticmethod
    def _store(writer: Any, rows: dict[str, np.ndarray], priorities: np.ndarray | None, timeout: float | None) -> None:
        if priorities is None:
            writer.add(timeout=timeout, **rows)
        else:
            writer.add(priorities=priorities, timeout=timeout, **rows)

    def close(self) -> None:
        """Close the per-sub-environment writers (never the buffer)."""
        for w in self._writers:
            if w is not self._buffer:
                w.close()
        self._writers = []

    def __enter__(self) -> VectorWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

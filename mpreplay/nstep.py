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
from typing import Any, NamedTuple

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from . import checks
from ._ext.nstep_fold import FoldKernel, Source
from .spec import EnvDict, FieldOptions, FieldSpec, convert_batch, parse_env_dict

__all__ = ["Folding", "NstepBuffer"]

_DISCOUNT = "discount"


def _concat(parts: list[dict[str, np.ndarray]], specs: Mapping[str, FieldSpec]) -> dict[str, np.ndarray]:
    """The rows of several emitted dicts, in order (no rows when there are none)."""
    if not parts:
        return {name: np.empty((0,) + s.shape, s.dtype) for name, s in specs.items()}
    return {name: np.concatenate([p[name] for p in parts]) for name in specs}


# The entries of a folder's state_dict(): the newest step's column, each environment's pending
# steps, and per field its ring of steps (or, a reward, of running folded rewards).
_CURSOR, _PENDING, _RING, _ACC = "cursor", "pending", "ring.", "folded."


class Folding(NamedTuple):
    """What an :class:`NstepBuffer` holds between steps: returned by its ``preview_*``
    methods, made the folder's own by :meth:`NstepBuffer.commit`.  Opaque to callers."""

    ring: dict[str, np.ndarray]  # per non-reward field, (num_envs, n, ...): the steps of the last n adds
    acc: dict[str, np.ndarray]  # per reward field, (num_envs, n, ...): the running folded reward of each column
    cur: int  # the column of the newest step
    pending: np.ndarray  # per environment (int64), its pending steps: its newest `pending` columns, ending at `cur`


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

    A caller that stores the rows somewhere that may refuse them (a replay buffer whose
    ``add`` times out) folds in two steps: :meth:`preview_add` (or :meth:`preview_episode_end`)
    returns the rows and the folder's next state without changing the folder, and
    :meth:`commit` makes that state the folder's once the rows are stored.  Uncommitted,
    the step was never added: the same step can be folded again.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import NstepBuffer
    >>> fields = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    >>> folder = NstepBuffer(fields, size=2, gamma=0.5)
    >>> folder.add(obs=0.0, rew=1.0, next_obs=1.0, done=0.0)["rew"]  # waits for a second step
    array([], dtype=float32)
    >>> rows = folder.add(obs=1.0, rew=1.0, next_obs=2.0, done=0.0)
    >>> rows["rew"], rows["next_obs"], rows["discount"]  # 1 + 0.5 * 1, two steps ahead
    (array([1.5], dtype=float32), array([2.], dtype=float32), array([0.25], dtype=float32))
    >>> folder.on_episode_end()["rew"]  # the last step, folded alone
    array([1.], dtype=float32)
    """

    def __init__(
        self,
        env_dict: EnvDict,
        size: int,
        gamma: float = 0.99,
        *,
        rew: str | Sequence[str] | None = "rew",
        next: str | Sequence[str] | None = "next_obs",
        done: str = "done",
        truncated: str | None = None,
        num_envs: int | None = None,
        default_dtype: DTypeLike | None = None,
    ):
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
            raise ValueError(
                f"env_dict[{_DISCOUNT!r}]: the output discount is a float scalar, "
                f"got shape {declared.shape} and dtype {declared.dtype}"
            )
        return specs

    def _names(self, arg: str, value: Any, default: str) -> tuple[str, ...]:
        """The fields ``rew=`` or ``next=`` names: one, a list, or none.  The default name
        applies only when the env_dict has such a field."""
        if value is None:
            return ()
        if isinstance(value, str) and value == default and default not in self._specs:
            return ()
        names = (value,) if isinstance(value, str) else value
        if (
            isinstance(names, (bytes, Mapping))
            or not hasattr(names, "__iter__")
            or not all(isinstance(n, str) for n in names)
        ):
            raise TypeError(f"{arg}: expected a field name, a list of field names or None, got {value!r}")
        return tuple(names)

    def _check_keys(
        self, rew: Any, next: Any, done: str, truncated: str | None
    ) -> tuple[tuple[str, ...], tuple[str, ...], str, str | None]:
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
                raise TypeError(
                    f"rew: field {key!r} must have a float dtype to hold discounted sums, got {self._specs[key].dtype}"
                )
        for arg, key in keys:
            if arg in ("done", "truncated") and self._specs[key].shape != ():
                raise ValueError(f"{arg}: field {key!r} must be a scalar flag, got shape {self._specs[key].shape}")
        return rews, nexts, done, truncated

    def _init_arrays(self, num_envs: int) -> None:
        n = self._n
        # Column c of every ring holds the step of the add() call whose number is c modulo n, in
        # every environment at once: a write is one slice assignment, and an environment's
        # pending steps are always its newest `count` columns, ending at column `cur`.
        ring = {
            name: np.zeros((num_envs, n) + s.shape, s.dtype)
            for name, s in self._specs.items()
            if name not in self._rews
        }
        # Running folded reward of the pending step in each column (float64 whatever rew's dtype).
        acc = {name: np.zeros((num_envs, n) + self._specs[name].shape, np.float64) for name in self._rews}
        sources = dict.fromkeys(self._out_specs, Source.FIRST_STEP)
        sources.update(dict.fromkeys(self._last_step_fields, Source.LAST_STEP))
        sources.update(dict.fromkeys(self._rews, Source.FOLDED))
        sources[_DISCOUNT] = Source.DISCOUNT
        if self._truncated is not None:
            sources[self._truncated] = Source.FLAG
        self._kernel = FoldKernel(
            n,
            self._gamma,
            num_envs,
            {name: (s.shape, s.dtype) for name, s in self._out_specs.items()},
            sources,
            self._done,
            self._truncated,
        )
        self._envs = np.arange(num_envs)
        self._state = Folding(ring, acc, n - 1, np.zeros(num_envs, np.int64))
        self._preview: Folding | None = None  # the one state commit() accepts

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
        """Number of environments folded side by side (None for a single-step add)."""
        return self._num_envs

    def output_env_dict(self) -> dict[str, FieldOptions]:
        """The env_dict of emitted transitions: the input fields plus the float ``discount``.

        A replay buffer built on it stores the dicts returned by :meth:`add` and
        :meth:`on_episode_end` as they are.
        """
        return {name: {"shape": s.shape, "dtype": s.dtype} for name, s in self._out_specs.items()}

    def get_pending_count(self, env: int | None = None) -> int:
        """Steps added but not emitted yet, in all environments or in environment ``env``."""
        count = self._state.pending
        return int(count.sum() if env is None else count[self._env_index(env)])

    def clear(self) -> None:
        """Drop every pending step without emitting it."""
        s = self._state
        self._state = Folding(s.ring, s.acc, s.cur, np.zeros_like(s.pending))
        self._preview = None

    def state_dict(self) -> dict[str, np.ndarray]:
        """The pending steps, as copies of plain arrays by name (what :meth:`load_state_dict`
        takes): an actor that saves them -- ``np.savez(file, **folder.state_dict())``, nothing
        pickled -- and loads them into a new folder of the same ``env_dict``, ``size``, ``gamma``
        and ``num_envs`` after a restart emits every pending step once, as this one would have."""
        s = self._state
        out = {_CURSOR: np.array(s.cur, dtype=np.int64), _PENDING: s.pending.copy()}
        out.update({f"{_RING}{name}": ring.copy() for name, ring in s.ring.items()})
        out.update({f"{_ACC}{name}": acc.copy() for name, acc in s.acc.items()})
        return out

    def load_state_dict(self, state_dict: Mapping[str, np.ndarray]) -> None:
        """Take the pending steps of ``state_dict`` (from :meth:`state_dict` of a folder of the same
        fields, ``size`` and ``num_envs``; ``dict(np.load(file))`` of a saved one), dropping the
        ones held now.  A state of another folder is refused with ValueError naming the first
        entry that differs, changing nothing."""
        s = self._state
        arrays = checks.state_arrays(
            "state_dict", state_dict, {key: (value.shape, value.dtype) for key, value in self.state_dict().items()}
        )
        cur, pending = int(arrays[_CURSOR]), arrays[_PENDING]
        if not 0 <= cur < self._n or ((pending < 0) | (pending > self._n - 1)).any():
            raise ValueError(
                f"state_dict: expected a cursor in [0, {self._n}) and 0..{self._n - 1} pending steps per environment"
            )
        ring = {name: arrays[f"{_RING}{name}"] for name in s.ring}
        acc = {name: arrays[f"{_ACC}{name}"] for name in s.acc}
        self._state, self._preview = Folding(ring, acc, cur, pending), None

    def add(self, **step: ArrayLike) -> dict[str, np.ndarray]:
        """Add one step (one per environment with ``num_envs``) and return what it completes.

        ``step`` holds every env_dict field except ``discount``.  Without ``num_envs`` it may also
        hold ``k`` consecutive steps of the environment (a leading dimension ``k`` on every
        field), folded as ``k`` single adds.  The whole call is checked and converted first; on
        error nothing changes.  The returned rows are the steps this call completed (see the
        class docstring); the values are copied, so later adds never alter them and the caller
        may reuse its own arrays.
        """
        rows, after = self.preview_add(**step)
        self.commit(after)
        return rows

    def on_episode_end(self, env: int | None = None) -> dict[str, np.ndarray]:
        """End the current episode of every environment, or of environment ``env``, without a flag.

        Emits the pending steps as if the last step added had been flagged truncated: folded up
        to it, ``done`` 0 (the target still bootstraps from its next observation) and
        ``truncated`` 1 when the env_dict has that field.  The next add starts a new episode.
        """
        rows, after = self.preview_episode_end(env)
        self.commit(after)
        return rows

    def preview_add(self, **step: ArrayLike) -> tuple[dict[str, np.ndarray], Folding]:
        """What :meth:`add` would return, and the folder's state after it, without changing the
        folder; :meth:`commit` the state to add the step.  Raises on bad input as ``add`` does."""
        k, rows = convert_batch(self._specs, step)
        s = self._state
        if self._num_envs is None and k != 1:
            # Consecutive steps write columns that hold pending steps of the folder's state:
            # they fold into a ring of their own.
            s = s._replace(ring={name: ring.copy() for name, ring in s.ring.items()})
            parts = []
            for i in range(k):
                out, s = self._add_step(s, {name: r[i : i + 1] for name, r in rows.items()})
                parts.append(out)
            out = _concat(parts, self._out_specs)
        elif k != len(s.pending):
            raise ValueError(
                f"add: expected a leading dimension num_envs={len(s.pending)} on every field, got a batch of {k}"
            )
        else:
            out, s = self._add_step(s, rows)
        self._preview = s
        return out, s

    def preview_episode_end(self, env: int | None = None) -> tuple[dict[str, np.ndarray], Folding]:
        """What :meth:`on_episode_end` would return, and the folder's state after it, without
        changing the folder; :meth:`commit` the state to end the episode."""
        s = self._state
        chosen = np.ones(len(s.pending), bool) if env is None else self._envs == self._env_index(env)
        emit = np.where(chosen, s.pending, 0)
        after = Folding(s.ring, s.acc, s.cur, np.where(chosen, 0, s.pending))
        self._preview = after
        return self._kernel.flush(s.ring, s.acc, s.cur, emit, emit, True), after

    def commit(self, state: Folding) -> None:
        """Make ``state``, from the latest ``preview_*`` call, the folder's: the previewed step is
        added (or the episode ended).  Any other state -- an older preview's, one committed
        already -- raises ValueError, changing nothing."""
        if state is not self._preview:
            raise ValueError("commit: expected the state of this folder's latest preview, not committed yet")
        self._state, self._preview = state, None

    def check(self, **step: ArrayLike) -> int:
        """How many steps ``add(**step)`` would take, raising as it would on bad input;
        changes nothing."""
        k, _ = convert_batch(self._specs, step)
        if self._num_envs is not None and k != self._num_envs:
            raise ValueError(
                f"add: expected a leading dimension num_envs={self._num_envs} on every field, got a batch of {k}"
            )
        return k

    def _add_step(self, s: Folding, rows: dict[str, np.ndarray]) -> tuple[dict[str, np.ndarray], Folding]:
        """Fold one converted step of every environment into ``s``: the rows it emits and the state after.

        The step is written into column ``s.cur + 1`` of ``s.ring``, which holds no pending step
        of ``s`` (at most n - 1 are pending), and its rewards folded into new accumulators, so
        ``s`` itself stays valid."""
        out, acc, cur, pending = self._kernel.step(s.ring, s.acc, rows, s.cur, s.pending)
        return out, Folding(s.ring, acc, cur, pending)

    def _env_index(self, env: Any) -> int:
        return checks.integer("env", env, low=0, high=len(self._state.pending) - 1)


# A buffer's n-step settings, as a handle carries them: (env_dict, default_dtype, settings).
NstepArgs = tuple[dict[str, Any], Any, dict[str, Any]]

_NSTEP_KEYS = {"size", "gamma", "rew", "next", "done", "truncated"}


def nstep_args(env_dict: Mapping[str, Any], default_dtype: Any, options: Any, cpprb_nstep: Any) -> NstepArgs | None:
    """A buffer's ``nstep=`` checked, as the n-step folder's arguments (picklable, so shared
    handles can rebuild it); None without folding.  ``cpprb_nstep``: what was passed as cpprb's
    ``Nstep=``, refused."""
    if cpprb_nstep is not None:
        raise TypeError(
            "Nstep: mpreplay's buffers take nstep= (cpprb's spelling, with cpprb's timing, is mpreplay.compat.cpprb's)"
        )
    if options is None:
        return None
    if not isinstance(options, Mapping) or "size" not in options:
        raise TypeError(f"nstep: expected a mapping with at least 'size' (keys {sorted(_NSTEP_KEYS)}), got {options!r}")
    unknown = set(options) - _NSTEP_KEYS
    if unknown:
        raise ValueError(f"nstep: unknown keys {sorted(unknown)}; expected {sorted(_NSTEP_KEYS)}")
    settings = {"gamma": 0.99, "rew": "rew", "next": "next_obs", "done": "done", "truncated": None, **options}
    return (dict(env_dict), default_dtype, settings)

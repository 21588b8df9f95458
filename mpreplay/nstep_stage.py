"""The n-step stage of a buffer's write path (``nstep=``): steps in, folded rows out.

A :class:`NstepStage` folds each add's steps into the rows that start ``n`` steps back
(:class:`~mpreplay.nstep.NstepBuffer`) and, for a prioritized buffer, moves each step's
initial priority to the row that starts at that step with a second folder driven by the
same flags.  It only previews: the write path commits the folders' new state once the
rows they emitted are stored, so an add that raises can be made again (see
:mod:`mpreplay.write_path`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from . import checks
from .nstep import NstepArgs, NstepBuffer
from .spec import parse_env_dict

__all__ = ["NstepStage"]

# What a preview returns: the folded rows, their priorities (NaN: the largest stored
# when they are stored; None: a buffer without priorities) and what makes it final.
Preview = tuple[dict[str, np.ndarray], "np.ndarray | None", Callable[[], None]]
# The entries of a stage's state_dict(): each folder's, prefixed.
_ROWS, _PRIORITIES = "rows.", "priorities."


class NstepStage:
    """One writer's n-step folders: the rows', and (``prioritized``) the initial priorities'."""

    def __init__(self, args: NstepArgs, prioritized: bool):
        env_dict, default_dtype, settings = args
        settings = dict(settings)
        self.rows = NstepBuffer(
            env_dict, settings.pop("size"), settings.pop("gamma"), default_dtype=default_dtype, **settings
        )
        flags = {flag: settings[flag] for flag in ("done", "truncated")}
        self._flags = [name for name in flags.values() if name is not None]
        self._priorities: NstepBuffer | None = None
        if prioritized:
            spec: dict[str, dict[str, Any]] = {"priority": {"dtype": np.float64}}
            for name in self._flags:
                spec[name] = {"dtype": parse_env_dict({name: env_dict[name]}, default_dtype)[name].dtype}
            self._priorities = NstepBuffer(spec, self.rows.size, self.rows.gamma, rew=None, next=None, **flags)

    @property
    def settings(self) -> tuple[int, float]:
        """``(n, gamma)`` of the folding (what a saved file records)."""
        return int(self.rows.size), float(self.rows.gamma)

    def preview_add(
        self, fields: dict[str, Any], priorities: Any, check_priorities: Callable[[np.ndarray], None]
    ) -> Preview:
        """The rows (and priorities) the steps of ``fields`` complete, with ``priorities`` given
        per step (None: the largest stored); raises, changing nothing, on a bad step."""
        if self._priorities is None:
            rows, after = self.rows.preview_add(**fields)
            return rows, None, lambda: self.rows.commit(after)
        k = self.rows.check(**fields)  # before either folder is asked
        if priorities is None:
            priorities = np.full(k, np.nan)  # see Preview
        else:
            priorities = checks.priorities("priorities", priorities, k, max_priority=None)
            check_priorities(priorities)
        rows, after = self.rows.preview_add(**fields)
        folded, priorities_after = self._priorities.preview_add(
            priority=priorities, **{name: fields[name] for name in self._flags}
        )
        return rows, folded["priority"], lambda: self._commit(after, priorities_after)

    def preview_episode_end(self) -> Preview:
        """The rows the pending steps fold into when the episode ends (as if truncated: they bootstrap)."""
        rows, after = self.rows.preview_episode_end()
        if self._priorities is None:
            return rows, None, lambda: self.rows.commit(after)
        folded, priorities_after = self._priorities.preview_episode_end()
        return rows, folded["priority"], lambda: self._commit(after, priorities_after)

    def _commit(self, rows_after: Any, priorities_after: Any) -> None:
        self.rows.commit(rows_after)
        assert self._priorities is not None
        self._priorities.commit(priorities_after)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The pending steps of both folders (see :meth:`NstepBuffer.state_dict`)."""
        out = {f"{_ROWS}{key}": value for key, value in self.rows.state_dict().items()}
        if self._priorities is not None:
            out.update({f"{_PRIORITIES}{key}": value for key, value in self._priorities.state_dict().items()})
        return out

    def load_state_dict(self, state_dict: Any) -> None:
        """Take the pending steps of ``state_dict`` (from :meth:`state_dict` of a stage of the same
        settings); ValueError naming the first entry that differs, changing nothing."""
        expected = {key: (value.shape, value.dtype) for key, value in self.state_dict().items()}
        arrays = checks.state_arrays("state_dict", state_dict, expected)
        rows = {key[len(_ROWS) :]: value for key, value in arrays.items() if key.startswith(_ROWS)}
        priorities = {key[len(_PRIORITIES) :]: value for key, value in arrays.items() if key.startswith(_PRIORITIES)}
        if self._priorities is None:
            self.rows.load_state_dict(rows)
            return
        before = self._priorities.state_dict()
        self._priorities.load_state_dict(priorities)
        try:
            self.rows.load_state_dict(rows)
        except ValueError:
            self._priorities.load_state_dict(before)  # a refused state changes nothing
            raise

    def clear(self) -> None:
        """Drop the pending steps."""
        self.rows.clear()
        if self._priorities is not None:
            self._priorities.clear()

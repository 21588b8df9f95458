"""The buffers with cpprb's names: each a :class:`~mpreplay.Table` with its defaults.

Every option of :class:`~mpreplay.Table` works with every class here (a shared, compressed
buffer with a max-heap selector and a Queue is ``MPReplayBuffer(..., selector="max_heap",
rate_limiter=Queue(n), next_of="obs")``); a class only chooses the defaults: the selector
(uniform, or proportional prioritized with ``alpha``, ``eps``, ``new_priority``), whether the
table is shared (``MP...``), and whether it stores steps and samples sequences (``...Sequence...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .limiter import ExactlyOnce
from .selectors import SelectorSpec
from .sequences import SequenceSpec
from .table import Table

__all__ = [
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "SequenceReplayBuffer",
    "PrioritizedSequenceReplayBuffer",
    "MPSequenceReplayBuffer",
    "MPPrioritizedSequenceReplayBuffer",
]

_PRIORITIZED_DEFAULTS = {"alpha": 0.6, "eps": 1e-4, "new_priority": "max_stored"}


def _prioritized(given: dict[str, Any], options: dict[str, Any], sequences: bool = False) -> dict[str, Any]:
    """``options`` with the prioritized selector made of ``given`` (alpha, eps, new_priority)
    unless ``selector=`` names another: then those must stay at their defaults (TypeError).  A
    Queue or Stack, which draws by no priority, is refused naming ``rate_limiter``."""
    if isinstance(options.get("rate_limiter"), ExactlyOnce):
        options["rate_limiter"].buffer_options(None, None, None, prioritized=True, sequences=sequences)
    if options.get("selector") is None:
        return {**options, "selector": SelectorSpec("prioritized", **given)}
    for name, default in _PRIORITIZED_DEFAULTS.items():
        if not (type(given[name]) is type(default) and given[name] == default):
            raise TypeError(
                f"{name}: an option of the prioritized selector; with selector= give it there: "
                f"SelectorSpec('prioritized', {name}=...)"
            )
    return options


class ReplayBuffer(Table):
    """Experience replay, uniform unless another selector is given (cpprb's ``ReplayBuffer``).

    A :class:`~mpreplay.Table` in this process's memory; every option of ``Table`` applies.
    """

    def __init__(self, size: int, env_dict: Mapping[str, Mapping[str, Any]], **options: Any):
        super().__init__(size, env_dict, shared=self._SHARED, **options)


class PrioritizedReplayBuffer(Table):
    """Proportional prioritized replay (Schaul et al. 2016), stratified as in Ape-X.

    An item is drawn with probability ``(p_i + eps)**alpha / sum_j (p_j + eps)**alpha``; items
    added without priorities get the largest priority stored now (``new_priority="max_stored"``,
    1.0 in an empty buffer) or the largest ever set (``"max_ever"``, cpprb's rule).  ``alpha``,
    ``eps`` and ``new_priority`` are the prioritized selector's options; with ``selector=``
    (``"max_heap"``, ``"min_heap"``, or a ``SelectorSpec``) they stay at their defaults.  Every
    other option of :class:`~mpreplay.Table` applies.
    """

    def __init__(
        self,
        size: int,
        env_dict: Mapping[str, Mapping[str, Any]],
        *,
        alpha: float = 0.6,
        eps: float = 1e-4,
        new_priority: str = "max_stored",
        **options: Any,
    ):
        options = _prioritized({"alpha": alpha, "eps": eps, "new_priority": new_priority}, options)
        super().__init__(size, env_dict, shared=self._SHARED, **options)


class SequenceReplayBuffer(Table):
    """Sequence replay (R2D2): steps stored once, sequences of them sampled uniformly.

    Every ``period`` steps (``length`` when None) of an episode a sequence of ``length`` steps
    starts, and it becomes sampleable once its last step is stored; with ``pad_end`` an
    episode's end keeps a shorter final sequence, padded.  ``sample`` returns every field as
    ``(batch, length, ...)`` with a boolean ``mask`` (False on padding, whose values are
    zeros), ``episode_step`` (each step's index in its episode), the sequences' ``indexes``
    and, prioritized, their importance ``weights``.  Every writer (process, episode writer)
    fills a lane of ``size // lanes`` steps of its own.  Inserts count steps and samples
    count sequences; ``stats()["sequences"]`` counts the sampleable ones.  ``eta`` weighs a
    sequence's largest per-step priority in its initial priority (prioritized).  Every other
    option of :class:`~mpreplay.Table` applies but ``nstep`` (targets over n steps are the
    learner's, inside each sequence).
    """

    def __init__(
        self,
        size: int,
        env_dict: Mapping[str, Mapping[str, Any]],
        *,
        length: int,
        period: int | None = None,
        pad_end: bool = True,
        eta: float = 0.9,
        **options: Any,
    ):
        sequence = SequenceSpec.build(length, period, pad_end, eta)
        super().__init__(size, env_dict, shared=self._SHARED, sequence=sequence, **options)


class PrioritizedSequenceReplayBuffer(Table):
    """Prioritized sequence replay (R2D2): a sequence is drawn with probability
    ``(p + eps) ** alpha / sum (p_j + eps) ** alpha``.

    ``add(..., priorities=)`` takes one priority per step (e.g. the actor's ``|TD|`` errors): a
    sequence's initial priority is R2D2's ``eta * max + (1 - eta) * mean`` over its real steps
    (:func:`~mpreplay.sequence_priority`); without them, the largest stored.
    ``update_priorities(indexes, p)`` sets a sequence's priority.  Options as for
    :class:`SequenceReplayBuffer` and :class:`PrioritizedReplayBuffer`.
    """

    def __init__(
        self,
        size: int,
        env_dict: Mapping[str, Mapping[str, Any]],
        *,
        length: int,
        period: int | None = None,
        pad_end: bool = True,
        eta: float = 0.9,
        alpha: float = 0.6,
        eps: float = 1e-4,
        new_priority: str = "max_stored",
        **options: Any,
    ):
        options = _prioritized({"alpha": alpha, "eps": eps, "new_priority": new_priority}, options, sequences=True)
        sequence = SequenceSpec.build(length, period, pad_end, eta)
        super().__init__(size, env_dict, shared=self._SHARED, sequence=sequence, **options)


class MPReplayBuffer(ReplayBuffer):
    """:class:`ReplayBuffer` in shared memory, written and sampled by many processes: it pickles
    to a handle that attaches to the same segment in another process."""

    _SHARED = True


class MPPrioritizedReplayBuffer(PrioritizedReplayBuffer):
    """:class:`PrioritizedReplayBuffer` in shared memory, written and sampled by many processes."""

    _SHARED = True


class MPSequenceReplayBuffer(SequenceReplayBuffer):
    """:class:`SequenceReplayBuffer` in shared memory, written and sampled by many processes."""

    _SHARED = True


class MPPrioritizedSequenceReplayBuffer(PrioritizedSequenceReplayBuffer):
    """:class:`PrioritizedSequenceReplayBuffer` in shared memory, written and sampled by many processes."""

    _SHARED = True

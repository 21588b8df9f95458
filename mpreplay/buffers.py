"""The buffers with cpprb's names: each a :class:`~mpreplay.Table` with its defaults.

Every option of :class:`~mpreplay.Table` works with every class here (a shared, compressed
buffer with a max-heap selector and a Queue is ``MPReplayBuffer(..., selector="max_heap",
rate_limiter=Queue(n), next_of="obs")``); a class only chooses the defaults: the selector
(uniform, or proportional prioritized with ``alpha``, ``eps``, ``new_priority``), whether the
table is shared (``MP...``), and whether it stores steps and samples sequences (``...Sequence...``).

Each constructor lists every parameter it takes, so that a reader, ``help()`` and a type
checker see them all; the table's own parameters are forwarded to ``Table.__init__`` as they
came (:func:`_table_arguments`), and ``tests/test_buffer_signatures.py`` checks that each
class lists exactly the table's parameters (less the ones the class decides) with the same
defaults and types.
"""

from __future__ import annotations

import inspect
import os
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypeVar

from . import selectors
from .limiter import ExactlyOnce, RateLimiter
from .selectors import SelectorSpec
from .sequences import SequenceSpec
from .spec import EnvDict
from .table import Table

if TYPE_CHECKING:  # numpy's union, shown by name in signatures and the reference
    from numpy.typing import DTypeLike

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
# Table.__init__'s parameters, the ones a named class forwards as the caller gave them.
_TABLE_PARAMETERS = tuple(inspect.signature(Table.__init__).parameters)[1:]


def _table_arguments(given: Mapping[str, Any], **decided: Any) -> dict[str, Any]:
    """The arguments of ``Table.__init__`` among a named class's ``given`` ones (its
    ``locals()``), with the ones the class ``decided`` in their place."""
    return {name: given[name] for name in _TABLE_PARAMETERS if name in given} | decided


def _prioritized(
    given: Mapping[str, Any], selector: str | SelectorSpec | None, rate_limiter: RateLimiter | None, sequences: bool
) -> str | SelectorSpec:
    """The selector of a prioritized class: the prioritized one made of ``given`` (alpha, eps,
    new_priority) unless ``selector`` names another, when those must stay at their defaults
    (TypeError).  A Queue or Stack, which draws by no priority, is refused naming ``rate_limiter``."""
    if isinstance(rate_limiter, ExactlyOnce):
        rate_limiter.buffer_options(None, None, None, prioritized=True, sequences=sequences)
    if selector is None:
        options = {name: given[name] for name in _PRIORITIZED_DEFAULTS}
        selectors.entry("prioritized").options(**options)  # checked here: SelectorSpec takes None for "not given"
        return SelectorSpec("prioritized", **options)
    for name, default in _PRIORITIZED_DEFAULTS.items():
        if not (type(given[name]) is type(default) and given[name] == default):
            raise TypeError(
                f"{name}: an option of the prioritized selector; with selector= give it there: "
                f"SelectorSpec('prioritized', {name}=...)"
            )
    return selector


_T = TypeVar("_T", bound=type)


def _own_init(cls: _T) -> _T:
    """Give an MP class its local twin's ``__init__`` under its own name: the signature stays
    one (the twin's), and a misspelt keyword is reported against the class the user called."""
    init: types.FunctionType = vars(cls.__mro__[1])["__init__"]
    copy = types.FunctionType(init.__code__, init.__globals__, init.__name__, init.__defaults__, init.__closure__)
    copy.__kwdefaults__ = init.__kwdefaults__
    copy.__annotations__ = init.__annotations__
    copy.__doc__ = init.__doc__
    copy.__qualname__ = f"{cls.__qualname__}.__init__"
    type.__setattr__(cls, "__init__", copy)
    return cls


class ReplayBuffer(Table):
    """Experience replay, uniform unless another selector is given (cpprb's ``ReplayBuffer``).

    A :class:`~mpreplay.Table` in this process's memory: ``size`` slots of the fields of
    ``env_dict``, the oldest replaced once full.  Every parameter is the table's (see
    :class:`~mpreplay.Table` for each); :class:`MPReplayBuffer` is the same buffer in shared
    memory.  ``add`` takes one transition or a batch, ``sample(batch_size)`` returns a dict of
    arrays: every field and the ``indexes`` of the slots drawn.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import ReplayBuffer
    >>> rb = ReplayBuffer(1000, {"obs": {"shape": (4,)}, "act": {"dtype": np.int64}, "rew": {}}, seed=0)
    >>> rb.add(obs=np.zeros(4), act=1, rew=0.5)  # one transition: the slot it went to
    0
    >>> rb.add(obs=np.ones((3, 4)), act=[0, 1, 0], rew=[1.0, 0.0, 1.0])  # a batch: the first slot
    1
    >>> batch = rb.sample(2)
    >>> sorted(batch), batch["obs"].shape, batch["obs"].dtype
    (['act', 'indexes', 'obs', 'rew'], (2, 4), dtype('float32'))
    >>> rb.get_stored_size()
    4
    >>> rb.close()
    """

    def __init__(
        self,
        size: int,
        env_dict: EnvDict,
        *,
        selector: str | SelectorSpec | None = None,
        remover: str | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        name: str | None = None,
        persist: bool = False,
        nstep: Mapping[str, object] | None = None,
        next_of: str | list[str] | None = None,
        stack_compress: str | list[str] | None = None,
        lanes: int = 1,
        sequence: SequenceSpec | None = None,
        default_dtype: DTypeLike | None = None,
        seed: int | None = None,
        mmap_prefix: str | os.PathLike[str] | None = None,
        weights_dtype: DTypeLike = "float64",
        indexes_dtype: DTypeLike = "int64",
        Nstep: None = None,  # noqa: N803 -- cpprb's spelling, refused naming nstep=
    ) -> None:
        super().__init__(**_table_arguments(locals()))


class PrioritizedReplayBuffer(Table):
    """Proportional prioritized replay (Schaul et al. 2016), stratified as in Ape-X.

    An item is drawn with probability ``(p_i + eps)**alpha / sum_j (p_j + eps)**alpha``; items
    added without priorities get the largest priority stored now (``new_priority="max_stored"``,
    1.0 in an empty buffer) or the largest ever set (``"max_ever"``, cpprb's rule).  ``alpha``,
    ``eps`` and ``new_priority`` are the prioritized selector's options; with ``selector=``
    (``"max_heap"``, ``"min_heap"``, or a ``SelectorSpec``) they stay at their defaults.  Every
    other parameter is the table's (see :class:`~mpreplay.Table`).

    ``sample(batch_size, beta)`` adds importance ``weights`` (``beta`` in [0, 1], 0.4 unless
    given) to the fields and ``indexes``; ``update_priorities(indexes, priorities)`` sets the
    priorities of the items drawn.  :class:`MPPrioritizedReplayBuffer` is the same buffer in
    shared memory, for actors and a learner in separate processes.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import PrioritizedReplayBuffer
    >>> rb = PrioritizedReplayBuffer(1000, {"obs": {"shape": (4,)}, "rew": {}}, alpha=0.6, seed=0)
    >>> rb.add(obs=np.zeros((8, 4)), rew=np.arange(8.0), priorities=np.linspace(0.1, 0.8, 8))
    0
    >>> batch = rb.sample(4, beta=0.4)
    >>> sorted(batch)
    ['indexes', 'obs', 'rew', 'weights']
    >>> bool((batch["weights"] <= 1.0).all())  # 1 for the least likely item stored, drawn or not
    True
    >>> rb.update_priorities(batch["indexes"], np.full(4, 2.0))
    >>> rb.get_max_priority()
    2.0
    >>> rb.close()
    """

    def __init__(
        self,
        size: int,
        env_dict: EnvDict,
        *,
        alpha: float = 0.6,
        eps: float = 1e-4,
        new_priority: str = "max_stored",
        selector: str | SelectorSpec | None = None,
        remover: str | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        name: str | None = None,
        persist: bool = False,
        nstep: Mapping[str, object] | None = None,
        next_of: str | list[str] | None = None,
        stack_compress: str | list[str] | None = None,
        lanes: int = 1,
        sequence: SequenceSpec | None = None,
        default_dtype: DTypeLike | None = None,
        seed: int | None = None,
        mmap_prefix: str | os.PathLike[str] | None = None,
        weights_dtype: DTypeLike = "float64",
        indexes_dtype: DTypeLike = "int64",
        Nstep: None = None,  # noqa: N803 -- cpprb's spelling, refused naming nstep=
    ) -> None:
        selector = _prioritized(locals(), selector, rate_limiter, sequences=False)
        super().__init__(**_table_arguments(locals()))


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
    parameter is the table's (see :class:`~mpreplay.Table`), but ``nstep`` is refused
    (targets over n steps are the learner's, inside each sequence).

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import SequenceReplayBuffer
    >>> rb = SequenceReplayBuffer(1000, {"obs": {"shape": (2,)}, "done": {}}, length=4, period=2, seed=0)
    >>> for t in range(7):  # one episode of 7 steps: sequences start at steps 0, 2 and 4
    ...     _ = rb.add(obs=np.full(2, t), done=float(t == 6))
    >>> rb.on_episode_end()
    >>> int(rb.stats()["sequences"])  # steps 0-3, 2-5, and 4-6 padded to 4
    3
    >>> batch = rb.sample(2)
    >>> batch["obs"].shape, batch["mask"].shape
    ((2, 4, 2), (2, 4))
    >>> rb.close()
    """

    def __init__(
        self,
        size: int,
        env_dict: EnvDict,
        *,
        length: int,
        period: int | None = None,
        pad_end: bool = True,
        eta: float = 0.9,
        selector: str | SelectorSpec | None = None,
        remover: str | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        name: str | None = None,
        persist: bool = False,
        nstep: Mapping[str, object] | None = None,
        next_of: str | list[str] | None = None,
        stack_compress: str | list[str] | None = None,
        lanes: int = 1,
        default_dtype: DTypeLike | None = None,
        seed: int | None = None,
        mmap_prefix: str | os.PathLike[str] | None = None,
        weights_dtype: DTypeLike = "float64",
        indexes_dtype: DTypeLike = "int64",
        Nstep: None = None,  # noqa: N803 -- cpprb's spelling, refused naming nstep=
    ) -> None:
        sequence = SequenceSpec.build(length, period, pad_end, eta)
        super().__init__(**_table_arguments(locals(), sequence=sequence))


class PrioritizedSequenceReplayBuffer(Table):
    """Prioritized sequence replay (R2D2): a sequence is drawn with probability
    ``(p + eps) ** alpha / sum (p_j + eps) ** alpha``.

    ``add(..., priorities=)`` takes one priority per step (e.g. the actor's ``|TD|`` errors): a
    sequence's initial priority is R2D2's ``eta * max + (1 - eta) * mean`` over its real steps
    (:func:`~mpreplay.sequence_priority`); without them, the largest stored.
    ``update_priorities(indexes, p)`` sets a sequence's priority.  Parameters as for
    :class:`SequenceReplayBuffer` and :class:`PrioritizedReplayBuffer`.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import PrioritizedSequenceReplayBuffer
    >>> rb = PrioritizedSequenceReplayBuffer(1000, {"obs": {"shape": (2,)}}, length=3, seed=0)
    >>> rb.add(obs=np.zeros((6, 2)), priorities=[1.0, 1.0, 4.0, 0.5, 0.5, 0.5])  # 6 steps: 2 sequences
    0
    >>> batch = rb.sample(2, beta=0.4)
    >>> batch["obs"].shape, batch["weights"].shape
    ((2, 3, 2), (2,))
    >>> rb.update_priorities(batch["indexes"], [0.1, 0.1])
    >>> rb.close()
    """

    def __init__(
        self,
        size: int,
        env_dict: EnvDict,
        *,
        length: int,
        period: int | None = None,
        pad_end: bool = True,
        eta: float = 0.9,
        alpha: float = 0.6,
        eps: float = 1e-4,
        new_priority: str = "max_stored",
        selector: str | SelectorSpec | None = None,
        remover: str | None = None,
        rate_limiter: RateLimiter | None = None,
        max_times_sampled: int | None = None,
        name: str | None = None,
        persist: bool = False,
        nstep: Mapping[str, object] | None = None,
        next_of: str | list[str] | None = None,
        stack_compress: str | list[str] | None = None,
        lanes: int = 1,
        default_dtype: DTypeLike | None = None,
        seed: int | None = None,
        mmap_prefix: str | os.PathLike[str] | None = None,
        weights_dtype: DTypeLike = "float64",
        indexes_dtype: DTypeLike = "int64",
        Nstep: None = None,  # noqa: N803 -- cpprb's spelling, refused naming nstep=
    ) -> None:
        selector = _prioritized(locals(), selector, rate_limiter, sequences=True)
        sequence = SequenceSpec.build(length, period, pad_end, eta)
        super().__init__(**_table_arguments(locals(), sequence=sequence))


_HANDLE_MODEL = """

    The buffer lives in a shared-memory segment that this object created and owns.  Pickled
    (``pickle``, a ``multiprocessing`` argument, a Ray object), it becomes a small handle --
    the segment's name and the buffer's configuration -- which attaches to the same segment in
    the process that unpickles it, after checking the segment's manifest
    (:class:`~mpreplay.IncompatibleSegmentError` when it is not the buffer the handle
    describes).  Every handle adds to and samples the same rows; each has its own random
    stream, record of what it sampled and, compressed or folding n steps, its own episode in
    progress.  Use one handle per process (or per thread).  ``close()`` on a handle releases
    its mapping; on the creating object it also unlinks the segment and wakes every blocked
    call elsewhere with :class:`~mpreplay.BufferClosed`.  The creator's process unlinks the
    segment however it ends, short of SIGKILL.
"""


@_own_init
class MPReplayBuffer(ReplayBuffer):
    """:class:`ReplayBuffer` in shared memory, written and sampled by many processes."""

    __doc__ = (
        (__doc__ or "")
        + _HANDLE_MODEL
        + """
    Examples
    --------
    A spawned process receives the buffer (here as the bound method ``buffer.add``: the handle
    and the method's name), attaches and adds a row, which this process then samples:

    >>> import multiprocessing as mp
    >>> import numpy as np
    >>> from mpreplay import MPReplayBuffer
    >>> rb = MPReplayBuffer(1000, {"obs": {"shape": (4,)}, "rew": {}})
    >>> writer = mp.get_context("spawn").Process(target=rb.add, kwargs={"obs": np.ones(4), "rew": 1.0})
    >>> writer.start(); writer.join(60); writer.exitcode
    0
    >>> rb.get_stored_size(), rb.sample(1)["rew"]
    (1, array([1.], dtype=float32))
    >>> rb.close()  # the creator: the segment is unlinked
    """
    )

    _SHARED = True


@_own_init
class MPPrioritizedReplayBuffer(PrioritizedReplayBuffer):
    """:class:`PrioritizedReplayBuffer` in shared memory: actors add, a learner samples and
    updates priorities, each in its own process."""

    __doc__ = (
        (__doc__ or "")
        + _HANDLE_MODEL
        + """
    Examples
    --------
    The handle another process gets is what ``pickle`` makes of the buffer; here it attaches
    in this process (another one's would do the same):

    >>> import pickle
    >>> import numpy as np
    >>> from mpreplay import MPPrioritizedReplayBuffer
    >>> learner_side = MPPrioritizedReplayBuffer(1000, {"obs": {"shape": (4,)}, "rew": {}}, alpha=0.6)
    >>> actor_side = pickle.loads(pickle.dumps(learner_side))  # an actor's handle
    >>> actor_side.name == learner_side.name  # the same segment
    True
    >>> actor_side.add(obs=np.ones((4, 4)), rew=np.ones(4), priorities=[1.0, 2.0, 3.0, 4.0])
    0
    >>> batch = learner_side.sample(2, beta=0.4)
    >>> learner_side.update_priorities(batch["indexes"], [0.5, 0.5])
    >>> actor_side.close()  # a handle: its mapping only
    >>> learner_side.close()  # the creator: the segment is unlinked
    """
    )

    _SHARED = True


@_own_init
class MPSequenceReplayBuffer(SequenceReplayBuffer):
    """:class:`SequenceReplayBuffer` in shared memory: each actor process writes its
    episodes into a lane of its own, a learner samples sequences."""

    __doc__ = (
        (__doc__ or "")
        + _HANDLE_MODEL
        + """
    Examples
    --------
    >>> import pickle
    >>> import numpy as np
    >>> from mpreplay import MPSequenceReplayBuffer
    >>> rb = MPSequenceReplayBuffer(1000, {"obs": {"shape": (2,)}}, length=4, lanes=4)
    >>> actor = pickle.loads(pickle.dumps(rb))  # an actor's handle: it claims a lane of its own
    >>> actor.add(obs=np.zeros((8, 2)))
    0
    >>> rb.sample(1)["obs"].shape
    (1, 4, 2)
    >>> actor.close(); rb.close()
    """
    )

    _SHARED = True


@_own_init
class MPPrioritizedSequenceReplayBuffer(PrioritizedSequenceReplayBuffer):
    """:class:`PrioritizedSequenceReplayBuffer` in shared memory: actors write episodes with
    per-step priorities, a learner samples sequences and updates their priorities."""

    __doc__ = (
        (__doc__ or "")
        + _HANDLE_MODEL
        + """
    Examples
    --------
    >>> import pickle
    >>> import numpy as np
    >>> from mpreplay import MPPrioritizedSequenceReplayBuffer
    >>> rb = MPPrioritizedSequenceReplayBuffer(1000, {"obs": {"shape": (2,)}}, length=4, lanes=4)
    >>> actor = pickle.loads(pickle.dumps(rb))
    >>> actor.add(obs=np.zeros((8, 2)), priorities=np.ones(8))
    0
    >>> batch = rb.sample(2, beta=0.4)
    >>> rb.update_priorities(batch["indexes"], [3.0, 1.0])
    >>> actor.close(); rb.close()
    """
    )

    _SHARED = True

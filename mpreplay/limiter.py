"""Rate limiters: keep actors and the learner in step (Reverb's semantics).

A limiter watches a cursor ``inserts * samples_per_insert - samples`` (every
sampled row counts as one sample):

* below ``min_size_to_sample`` stored transitions, inserts always go and
  samples wait;
* above it, an insert waits while it would push the cursor past
  ``max_diff``, and a sample of ``b`` rows waits while it would push the
  cursor below ``min_diff``.

The settings live in the buffer's memory, so every process of a shared buffer
obeys the same limiter.  Blocked callers sleep on a futex in the segment;
they do not spin a core.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from . import checks
from ._ext.schema import LIMIT_MAX_DIFF, LIMIT_MIN_DIFF, LIMIT_MIN_SIZE, LIMIT_ON, LIMIT_SPI, LIMITS_LEN

__all__ = ["RateLimiter", "MinSize", "SampleToInsertRatio", "ExactlyOnce", "Queue", "Stack"]


@dataclass(frozen=True)
class RateLimiter:
    """The general limiter: ``samples_per_insert``, ``min_size_to_sample`` and
    the cursor's window ``[min_diff, max_diff]``."""

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float

    def __post_init__(self) -> None:
        checks.number("samples_per_insert", self.samples_per_insert, low=0.0)
        checks.integer("min_size_to_sample", self.min_size_to_sample, low=1)
        lo = checks.number("min_diff", self.min_diff, finite=False)
        hi = checks.number("max_diff", self.max_diff, finite=False)
        if lo > hi:
            raise ValueError(f"min_diff ({lo}) > max_diff ({hi}): nothing could ever be inserted and sampled")

    def check(self, capacity: int) -> None:
        """Reject settings that would deadlock a buffer of ``capacity`` transitions.

        :meta private:
        """
        if self.min_size_to_sample > capacity:
            raise ValueError(
                f"min_size_to_sample={self.min_size_to_sample} exceeds the buffer's capacity {capacity}: "
                "the buffer could never hold enough to sample"
            )
        window = self.max_diff - self.min_diff
        if window < 2 * max(1.0, self.samples_per_insert):
            raise ValueError(
                f"the window max_diff - min_diff = {window} is below 2 * max(1, samples_per_insert) = "
                f"{2 * max(1.0, self.samples_per_insert)}: an insert and a sample could each wait for the "
                "other forever; widen error_buffer"
            )

    def to_array(self) -> np.ndarray:
        """The settings as the buffer stores them (the "limits" array of the segment schema).

        :meta private:
        """
        limits = np.zeros(LIMITS_LEN)
        limits[[LIMIT_ON, LIMIT_SPI, LIMIT_MIN_SIZE, LIMIT_MIN_DIFF, LIMIT_MAX_DIFF]] = (
            1.0,
            self.samples_per_insert,
            self.min_size_to_sample,
            self.min_diff,
            self.max_diff,
        )
        return limits


class MinSize(RateLimiter):
    """Block sampling until ``min_size_to_sample`` transitions are stored; inserts never wait.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import MinSize, ReplayBuffer
    >>> rb = ReplayBuffer(100, {"obs": {}}, rate_limiter=MinSize(4))
    >>> rb.add(obs=np.zeros(3))
    0
    >>> rb.sample(2, timeout=0.01)  # three stored, four needed
    Traceback (most recent call last):
    ...
    TimeoutError: ...
    >>> rb.add(obs=1.0)
    3
    >>> rb.sample(2)["obs"].shape
    (2,)
    >>> rb.close()
    """

    def __init__(self, min_size_to_sample: int):
        super().__init__(1.0, min_size_to_sample, -math.inf, math.inf)

    def check(self, capacity: int) -> None:
        if self.min_size_to_sample > capacity:
            super().check(capacity)

    def __repr__(self) -> str:
        return f"MinSize({self.min_size_to_sample})"


class SampleToInsertRatio(RateLimiter):
    """Keep ``samples / inserts`` near ``samples_per_insert``.

    ``error_buffer`` is how far the cursor may stray either way from
    ``samples_per_insert * min_size_to_sample`` (a number), or the explicit
    ``(min_diff, max_diff)`` pair.

    Examples
    --------
    Two sampled items per insert, within 8 of that rate, once 4 rows are stored: a learner that
    runs ahead waits until actors add more (a local buffer, which no other process can fill,
    raises TimeoutError at once).

    >>> import numpy as np
    >>> from mpreplay import ReplayBuffer, SampleToInsertRatio
    >>> limiter = SampleToInsertRatio(2.0, 4, error_buffer=8.0)
    >>> rb = ReplayBuffer(100, {"obs": {}}, rate_limiter=limiter)
    >>> rb.add(obs=np.zeros(4))
    0
    >>> for _ in range(4):  # 4 inserts allow 2 * 4 = 8 sampled items: 4 batches of 2
    ...     _ = rb.sample(2)
    >>> rb.sample(2)
    Traceback (most recent call last):
    ...
    TimeoutError: sample: the rate limiter holds samples back until more is inserted; ...
    >>> rb.add(obs=1.0)  # one more insert: one more batch of 2
    4
    >>> rb.sample(2)["obs"].shape
    (2,)
    >>> rb.close()
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int, error_buffer: float | tuple[float, float]):
        spi = checks.number("samples_per_insert", samples_per_insert, low=0.0, low_open=True)
        min_size = checks.integer("min_size_to_sample", min_size_to_sample, low=1)
        if isinstance(error_buffer, tuple):
            lo, hi = (checks.number("error_buffer", e, finite=False) for e in error_buffer)
        else:
            e = checks.number("error_buffer", error_buffer, low=0.0, finite=False)
            lo, hi = spi * min_size - e, spi * min_size + e
        super().__init__(spi, min_size_to_sample, lo, hi)

    def __repr__(self) -> str:
        return (
            f"SampleToInsertRatio(samples_per_insert={self.samples_per_insert}, "
            f"min_size_to_sample={self.min_size_to_sample}, error_buffer=({self.min_diff}, {self.max_diff}))"
        )


class ExactlyOnce(RateLimiter):
    """A trajectory queue for on-policy learners: every item is sampled exactly once.

    The buffer holds ``size`` items (its capacity must be ``size``), draws them in
    the order of its ``selector`` and retires each at its draw (``max_times_sampled=1``).
    A write of ``k`` rows waits (``timeout=``; a ``TimeoutError`` changes nothing) until
    ``k`` slots hold no item not yet sampled or being written, wherever they lie, instead
    of overwriting one; with ``next_of`` / ``stack_compress`` an episode's frames lie
    consecutive in the writer's lane, so a write waits for the next slots of that lane (no
    unread item there, nor a frame one reads).  A sample of ``k`` waits until ``k`` items
    are stored.  The count a write waits on is the slot states themselves, so a writer
    killed after reserving holds its slots only until the next writer finds it dead.
    Snapshots and files list the items in their order.  Build it through :class:`Queue`
    or :class:`Stack`.
    """

    selector: str = "fifo"
    size: int

    def __init__(self, size: int):
        size = checks.integer("size", size, low=1)
        # Neither cursor bound applies: the slots, not the counters, hold writes back.
        super().__init__(1.0, 1, -math.inf, math.inf)
        object.__setattr__(self, "size", size)

    def check(self, capacity: int) -> None:
        if capacity != self.size:
            raise ValueError(
                f"size: a {type(self).__name__}({self.size}) needs a buffer of exactly {self.size} slots, "
                f"got {capacity}"
            )

    def buffer_options(
        self,
        selector: object,
        max_times_sampled: int | None,
        remover: str | None,
        *,
        prioritized: bool,
        sequences: bool,
    ) -> tuple[str, int, str]:
        """The buffer's ``selector``, ``max_times_sampled`` and ``remover`` for this limiter (Reverb's
        Queue and Stack: the fifo or lifo selector, each item retired at its first draw, and a
        remover that keeps unread items, so a write waits for room).  ValueError naming
        ``rate_limiter`` when the buffer cannot be such a queue (``prioritized``: its class draws by
        priority; ``sequences``: its items are sequences), or naming the argument given that
        contradicts it (None: not given) -- never one the caller left to the limiter.

        :meta private:
        """
        if sequences:
            raise ValueError(
                f"rate_limiter: a sequence buffer takes no {self!r}: its items are sequences, which it never "
                f"retires once sampled, and a {type(self).__name__} samples every item exactly once; give it "
                f"MinSize or SampleToInsertRatio"
            )
        if prioritized:
            raise ValueError(
                f"rate_limiter: a prioritized buffer takes no {self!r}: a {type(self).__name__} draws with "
                f"selector {self.selector!r}, by no priority; build a ReplayBuffer (or MPReplayBuffer) with it"
            )
        name = getattr(selector, "name", selector)
        if selector is not None and (name != self.selector or getattr(selector, "options", None)):
            raise ValueError(f"selector: a {self!r} draws with selector {self.selector!r}, got {selector!r}")
        if max_times_sampled not in (None, 1):
            raise ValueError(
                f"max_times_sampled: a {self!r} samples every item exactly once (1), got {max_times_sampled!r}"
            )
        if remover not in (None, "keep_unread"):
            raise ValueError(f"remover: a {self!r} keeps its unread items ('keep_unread'), got {remover!r}")
        return self.selector, 1, "keep_unread"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.size})"


class Queue(ExactlyOnce):
    """Reverb's ``Queue(size)``: items sampled exactly once, the oldest first (selector ``"fifo"``).

    ``ReplayBuffer(size, env_dict, rate_limiter=Queue(size))`` (or ``MPReplayBuffer``)
    builds it; see :class:`ExactlyOnce` for what waits.  Shared (``MPReplayBuffer``), it hands
    rollouts from actor processes to a learner, each rollout to one ``sample`` exactly once.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import Queue, ReplayBuffer
    >>> q = ReplayBuffer(4, {"step": {"dtype": np.int64}}, rate_limiter=Queue(4))
    >>> q.add(step=[0, 1, 2])
    0
    >>> q.sample(2)["step"]  # the oldest first
    array([0, 1])
    >>> q.sample(1)["step"]
    array([2])
    >>> q.sample(1, timeout=0.01)  # each item once: nothing is left
    Traceback (most recent call last):
    ...
    TimeoutError: ...
    >>> q.add(step=np.arange(3, 7))  # four free slots: a write of four does not wait
    3
    >>> q.add(step=7, timeout=0.01)  # full of unread items: a write waits for room
    Traceback (most recent call last):
    ...
    TimeoutError: ...
    >>> q.close()
    """


class Stack(ExactlyOnce):
    """Reverb's ``Stack(size)``: items sampled exactly once, the newest first (selector ``"lifo"``).

    ``ReplayBuffer(size, env_dict, rate_limiter=Stack(size))`` (or ``MPReplayBuffer``)
    builds it; see :class:`ExactlyOnce` for what waits.

    Examples
    --------
    >>> import numpy as np
    >>> from mpreplay import ReplayBuffer, Stack
    >>> s = ReplayBuffer(4, {"step": {"dtype": np.int64}}, rate_limiter=Stack(4))
    >>> s.add(step=[0, 1, 2])
    0
    >>> s.sample(2)["step"]  # the newest first
    array([2, 1])
    >>> s.sample(1)["step"]
    array([0])
    >>> s.close()
    """

    selector = "lifo"

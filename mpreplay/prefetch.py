"""Batches sampled ahead on a background thread, so that a learner never waits for ``sample``.

A learner step is ``sample`` then train.  The sampling kernels copy rows and walk the priority
tree without holding the GIL, and so does PyTorch's arithmetic: with the next batches drawn on
another thread while the current one trains, a step costs about the longer of the two instead
of their sum.  ``ReplayBuffer.batches`` returns a :class:`Prefetcher`::

    with buffer.batches(256, beta=0.4, prefetch=2) as batches:
        for batch in batches:
            loss = train(batch)                                        # the next batches are drawn meanwhile
            buffer.update_priorities(batch["indexes"], new_priorities)  # from this thread: allowed

Each batch is drawn into arrays the prefetcher reuses (no allocation once the first
``prefetch + 1`` batches exist): a batch stays valid until the next one is asked for.  A
prefetched batch was drawn before the updates of the batches handed out after it was drawn
(at most ``prefetch`` learner steps old), the price of drawing ahead.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from .spec import Batch, TensorBatch

__all__ = ["Prefetcher", "as_drawn", "as_tensors"]

_B = TypeVar("_B")  # what a Prefetcher yields: a Batch, or a TensorBatch of tensors over its arrays

# How long one wait of the drawing thread lasts before it looks whether it was stopped.
_POLL_S = 0.05
# Arrays the buffer allocates for every batch: they are never handed back for refilling.
_FRESH = ("indexes", "weights")


class _Failure:
    """What ended the drawing thread, for ``__next__`` to raise."""

    def __init__(self, error: BaseException):
        self.error = error


class _Stop:
    """Put in the queue of free arrays: the drawing thread ends."""


def _draw_loop(
    draw: Callable[[Batch | None, float | None], Batch],
    timeout: float | None,
    free: queue.Queue,
    ready: queue.Queue,
    stop: threading.Event,
) -> None:
    # A function of the queues, not a method: the thread must not keep the Prefetcher alive.
    while True:
        out = free.get()
        if isinstance(out, _Stop):
            return
        try:
            batch = _draw_within(draw, out, timeout, stop)
        except BaseException as error:  # every error reaches the learner, through __next__
            ready.put(_Failure(error))
            return
        if batch is None:
            return
        ready.put(batch)


def _draw_within(
    draw: Callable[[Batch | None, float | None], Batch],
    out: Batch | None,
    timeout: float | None,
    stop: threading.Event,
) -> Batch | None:
    """One batch, waiting at most ``timeout`` for the rate limiter; None once stopped.  The
    wait is cut in short slices so that ``close()`` is never held up by a long one."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not stop.is_set():
        left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
        try:
            return draw(out, max(left, 0.0))
        except TimeoutError:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"batches: no batch could be sampled within timeout={timeout} s "
                    "(the rate limiter held samples back)"
                ) from None
    return None


class Prefetcher(Iterator[_B], Generic[_B]):
    """An endless iterator of batches that a background thread samples ``prefetch`` ahead.

    Made by ``ReplayBuffer.batches`` / ``PrioritizedReplayBuffer.batches``.  ``next()`` raises
    whatever stopped the thread (``TimeoutError`` when the rate limiter held samples back longer
    than ``timeout``, ``BufferClosed`` once the buffer is closed); :meth:`close` (or leaving the
    ``with`` block) stops the thread.  Each batch drawn is handed out through ``convert``: as
    drawn (a :data:`~mpreplay.Batch`), or, with :func:`as_tensors`, every array as a CPU tensor
    over the same memory (a :data:`~mpreplay.TensorBatch`).
    """

    def __init__(
        self,
        draw: Callable[[Batch | None, float | None], Batch],
        prefetch: int,
        timeout: float | None,
        convert: Callable[[Batch], _B],
    ):
        self._free: queue.Queue = queue.Queue()
        self._ready: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._held: Batch | None = None
        self._error: BaseException | None = None
        self._convert = convert
        for _ in range(prefetch + 1):  # prefetch ahead while the learner holds one
            self._free.put(None)  # None: let the buffer allocate the arrays
        self._thread = threading.Thread(
            target=_draw_loop,
            args=(draw, timeout, self._free, self._ready, self._stop),
            name="mpreplay-prefetch",
            daemon=True,
        )
        self._thread.start()

    def __iter__(self) -> Prefetcher[_B]:
        return self

    @property
    def ready(self) -> int:
        """Batches drawn and not handed out yet (at most ``prefetch + 1``): while it is above
        zero, ``next()`` returns without waiting for the drawing thread."""
        return self._ready.qsize()

    def __next__(self) -> _B:
        if self._error is not None:
            raise self._error
        if self._stop.is_set():
            raise StopIteration
        if self._held is not None:
            # The learner asks for the next batch: it is done with the arrays of this one.
            self._free.put({name: a for name, a in self._held.items() if name not in _FRESH})
            self._held = None
        item = self._ready.get()
        if isinstance(item, _Failure):
            self._error = item.error
            self.close()
            raise item.error
        self._held = item
        return self._convert(item)

    def close(self) -> None:
        """Stop drawing and wait for the thread to end (idempotent).  Iteration then stops."""
        if "_thread" not in self.__dict__:  # __init__ failed before starting it
            return
        self._stop.set()
        self._free.put(_Stop())
        if self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Prefetcher[_B]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        self.close()


def as_drawn(batch: Batch) -> Batch:
    """The ``convert`` of a :class:`Prefetcher` of arrays: each batch as drawn."""
    return batch


def as_tensors() -> Callable[[Batch], TensorBatch]:
    """A ``convert`` of :class:`Prefetcher` handing each array out as a CPU tensor over the same
    memory (``torch.from_numpy``, no copy); ImportError, saying what to install, without torch."""
    try:
        import torch
    except ImportError:
        raise ImportError("as_torch=True needs PyTorch: pip install torch") from None
    return lambda batch: {name: torch.from_numpy(a) for name, a in batch.items()}

"""Snapshots of a shared buffer while writer processes write: whole rows, oldest first, nothing missing."""

from __future__ import annotations

import io
import multiprocessing as mp

import numpy as np
import pytest
from helpers import EACH_START_METHOD, rows_of

from mpreplay import MPPrioritizedReplayBuffer, MPReplayBuffer, ReplayBuffer

# Every field of a row encodes the same id, so a row mixed from two writes is visible.
ENV = {"obs": {"shape": (64,), "dtype": np.int64}, "id": {"dtype": np.int64}}
CAPACITY, WRITERS, BATCH = 4096, 2, 64
RANK = 10**9  # writer r writes ids r * RANK + 0, 1, 2, ...


def _write_until_stopped(buffer, rank: int, stop, started) -> None:
    i = rank * RANK
    while not stop.is_set():
        buffer.add(**rows_of(ENV, np.arange(i, i + BATCH, dtype=np.int64)))
        i += BATCH
        started.set()


def _assert_whole_and_oldest_first(rows: dict[str, np.ndarray]) -> None:
    ids = rows["id"]
    assert (rows["obs"] == ids[:, None]).all(), "a row mixes two writes"
    for rank in set((ids // RANK).tolist()):
        own = ids[ids // RANK == rank]
        # Each writer's ids grow with time: oldest first means they grow along the snapshot.
        assert (np.diff(own) > 0).all(), f"writer {rank}'s rows are not oldest first"


class _Writers:
    """``WRITERS`` processes adding batches to ``buffer`` until the block ends."""

    def __init__(self, method: str, buffer):
        ctx = mp.get_context(method)
        self._stop = ctx.Event()
        started = [ctx.Event() for _ in range(WRITERS)]
        self._procs = [
            ctx.Process(target=_write_until_stopped, args=(buffer, r + 1, self._stop, started[r]))
            for r in range(WRITERS)
        ]
        for p in self._procs:
            p.start()
        for e in started:
            assert e.wait(60), "a writer did not start"

    def __enter__(self) -> _Writers:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for p in self._procs:
            p.join(30)
            assert p.exitcode == 0


@pytest.fixture(params=[MPReplayBuffer, MPPrioritizedReplayBuffer], ids=["uniform", "prioritized"])
def full_buffer(request):
    with request.param(CAPACITY, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.arange(CAPACITY, dtype=np.int64)))
        yield buffer


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_get_all_transitions_under_concurrent_writes_holds_whole_rows_oldest_first(full_buffer, method):
    with _Writers(method, full_buffer):
        for _ in range(150):
            _assert_whole_and_oldest_first(full_buffer.get_all_transitions())


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_a_snapshot_misses_only_rows_overwritten_while_it_was_taken(full_buffer, method):
    # Every row complete at the start is in the snapshot unless a writer took its
    # slot before the copy ended: at most the rows inserted meanwhile plus the
    # batches the writers had reserved when it started.
    with _Writers(method, full_buffer):
        for _ in range(150):
            before = full_buffer.stats()["inserts"]
            count = len(full_buffer.get_all_transitions()["id"])
            inserted = full_buffer.stats()["inserts"] - before
            assert count >= CAPACITY - inserted - 2 * WRITERS * BATCH, (count, inserted)


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_save_transitions_under_concurrent_writes_saves_whole_rows_oldest_first(full_buffer, method):
    with _Writers(method, full_buffer):
        for _ in range(30):
            f = io.BytesIO()
            full_buffer.save_transitions(f, compress=False)
            f.seek(0)
            copy = ReplayBuffer(CAPACITY, ENV)
            copy.load_transitions(f)
            _assert_whole_and_oldest_first(copy.get_all_transitions())


@pytest.mark.timeout(60)
def test_saved_priorities_are_the_saved_rows_own():
    with MPPrioritizedReplayBuffer(8, ENV) as buffer:
        buffer.add(**rows_of(ENV, np.arange(8, dtype=np.int64)), priorities=np.arange(8) + 1.0)
        f = io.BytesIO()
        buffer.save_transitions(f, priorities=True)
        f.seek(0)
        from mpreplay import PrioritizedReplayBuffer

        copy = PrioritizedReplayBuffer(8, ENV)
        copy.load_transitions(f)
        rows = copy.get_all_transitions(indexes=True)
        np.testing.assert_array_equal(copy.inspection().priorities(rows["indexes"])[1], rows["id"] + 1.0)

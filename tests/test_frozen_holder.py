"""A process frozen while it holds the lock (SIGSTOP, a debugger, a descheduled container).

Every call with a timeout returns within it, naming the holder; ``close()``
never hangs; ``stats()`` shows who holds the lock and for how long.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, OBS_OF_4, START_METHODS, run_in_child, start_lock_holder

from mpreplay import MPPrioritizedReplayBuffer

ENV = OBS_OF_4
TIMEOUT = 0.5
# Generous: the point is that the call returns at all instead of waiting for the holder.
RETURNS_WITHIN = 10.0


def _sample_with_timeout(buffer, queue) -> None:
    start = time.monotonic()
    try:
        buffer.sample(4, timeout=TIMEOUT)
        queue.put(("returned", time.monotonic() - start))
    except TimeoutError as exc:
        queue.put((str(exc), time.monotonic() - start))


@pytest.fixture
def frozen(request):
    """``(buffer, holder pid)``: a buffer whose lock is held by a SIGSTOPped child."""
    method = request.param
    ctx = mp.get_context(method)
    buffer = MPPrioritizedReplayBuffer(64, ENV)
    buffer.add(obs=np.ones((8, 4)))
    holder = start_lock_holder(ctx, buffer)
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        yield buffer, holder.pid, ctx
    finally:
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        buffer.close()


FROZEN = pytest.mark.parametrize("frozen", START_METHODS, indirect=True)


@FROZEN
@pytest.mark.timeout(60)
def test_sample_with_a_timeout_returns_and_names_the_stopped_holder(frozen):
    buffer, pid, _ = frozen
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"process {pid} \(stopped\)"):
        buffer.sample(4, timeout=TIMEOUT)
    assert time.monotonic() - start < RETURNS_WITHIN


@FROZEN
@pytest.mark.timeout(60)
def test_add_with_a_timeout_returns_and_names_the_stopped_holder(frozen):
    buffer, pid, _ = frozen
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=rf"process {pid} \(stopped\)"):
        buffer.add(obs=np.ones(4), timeout=TIMEOUT)
    with pytest.raises(TimeoutError, match=rf"process {pid} \(stopped\)"):
        buffer.add(obs=np.ones((3, 4)), timeout=TIMEOUT)
    assert time.monotonic() - start < RETURNS_WITHIN


@FROZEN
@pytest.mark.timeout(60)
def test_a_call_in_another_process_honours_its_timeout(frozen):
    buffer, pid, ctx = frozen
    queue = ctx.Queue()
    caller = ctx.Process(target=_sample_with_timeout, args=(buffer, queue))
    caller.start()
    message, seconds = queue.get(timeout=30)
    caller.join(10)
    assert f"process {pid} (stopped)" in message
    assert seconds < RETURNS_WITHIN


@FROZEN
@pytest.mark.timeout(60)
def test_stats_name_the_holder_and_how_long_it_has_held_the_lock(frozen):
    buffer, pid, _ = frozen
    time.sleep(0.3)
    stats = buffer.stats()
    assert stats["lock_holder_pid"] == pid
    assert stats["lock_held_seconds"] >= 0.2  # the holder's stamp comes from a coarse (ms) clock


@FROZEN
@pytest.mark.timeout(60)
def test_close_does_not_hang_on_a_frozen_holder(frozen):
    buffer, _, _ = frozen
    start = time.monotonic()
    buffer.close()
    assert time.monotonic() - start < RETURNS_WITHIN


def test_stats_name_no_holder_when_the_lock_is_free():
    with MPPrioritizedReplayBuffer(8, ENV) as buffer:
        buffer.add(obs=np.ones(4))
        stats = buffer.stats()
        assert stats["lock_holder_pid"] is None and stats["lock_held_seconds"] is None


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_an_add_that_timed_out_after_reserving_leaves_its_slots_to_the_next_writer(method):
    # The holder freezes after this process reserved and copied: the add gives
    # its slots up, and once the holder is gone other writers use them.
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(4, ENV) as buffer:
        buffer.add(obs=np.zeros((4, 4)))
        reservation = buffer.inspection().reserve(2)
        holder = start_lock_holder(ctx, buffer)
        os.kill(holder.pid, signal.SIGSTOP)
        with pytest.raises(TimeoutError):
            reservation.publish(timeout=TIMEOUT)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(10)
        exitcode = run_in_child(method, _add_nines, buffer)
        assert exitcode == 0, "the writer waited for slots this live process had given up"
        assert (buffer.get_all_transitions()["obs"] == 9.0).all()


def _add_nines(buffer) -> None:
    buffer.add(obs=np.full((4, 4), 9.0), timeout=5)

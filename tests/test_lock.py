"""SharedLock: a robust process-shared mutex inside a shared-memory segment."""

import contextlib
import gc
import multiprocessing
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest
from helpers import START_METHODS, segment_exists

from mpreplay._ext.lock import LOCK_NBYTES, SharedLock
from mpreplay.memory import Layout, SharedMemory

_LAYOUT = Layout()
_LAYOUT.add("lock", (LOCK_NBYTES,), np.uint8)
_LAYOUT.add("counters", (2,), np.int64)
_LAYOUT.add("value", (1,), np.int64)

requires_robust = pytest.mark.skipif(
    not SharedLock.robust, reason="no robust mutexes here: a dead owner blocks the lock by design"
)


@pytest.fixture(params=START_METHODS)
def ctx(request):
    return multiprocessing.get_context(request.param)


@pytest.fixture
def segment():
    mem = SharedMemory(_LAYOUT)
    SharedLock(mem.arrays["lock"], True)
    yield mem
    name = mem.name
    mem.close()
    assert not segment_exists(name)


def _attach(mem, on_recover=None):
    return SharedLock(mem.arrays["lock"], False, on_recover=on_recover, counters=mem.arrays["counters"])


def _heap_lock(**kwargs):
    return SharedLock(np.zeros(LOCK_NBYTES, np.uint8), True, **kwargs)


# Child process targets: module level so that spawn can pickle them.


def _increment(name, times):
    mem = SharedMemory(_LAYOUT, name=name)
    lock = _attach(mem)
    value = mem.arrays["value"]
    for _ in range(times):
        with lock:
            seen = value[0]  # a read-modify-write that races without the lock
            value[0] = seen + 1


def _hold(name, acquired, seconds):
    """Take the lock, say so, keep it ``seconds`` (None: until killed), release."""
    mem = SharedMemory(_LAYOUT, name=name)
    lock = _attach(mem)
    lock.acquire()
    acquired.set()
    time.sleep(3600 if seconds is None else seconds)
    lock.release()


@contextlib.contextmanager
def _held_by_child(ctx, mem, seconds=None):
    acquired = ctx.Event()
    child = ctx.Process(target=_hold, args=(mem.name, acquired, seconds))
    child.start()
    try:
        assert acquired.wait(30), "the child never acquired the lock"
        yield child
    finally:
        if child.is_alive() and seconds is None:
            child.kill()
        child.join(30)


def _kill_holder(ctx, mem):
    with _held_by_child(ctx, mem) as child:
        os.kill(child.pid, signal.SIGKILL)


@pytest.mark.timeout(60)
def test_counter_incremented_by_three_processes_under_the_lock_is_exact(segment, ctx):
    procs = [ctx.Process(target=_increment, args=(segment.name, 10_000)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(50)
    assert [p.exitcode for p in procs] == [0, 0, 0]
    assert segment.arrays["value"][0] == 30_000


@requires_robust
@pytest.mark.timeout(60)
def test_lock_of_a_killed_holder_is_recovered_once_per_death_and_works_after(segment, ctx):
    calls = []
    lock = _attach(segment, on_recover=lambda: calls.append(lock.recoveries))
    for death in range(1, 4):
        _kill_holder(ctx, segment)
        assert lock.acquire(timeout=30)
        lock.release()
        assert calls == list(range(1, death + 1))
        assert lock.recoveries == death
        assert lock.acquire(timeout=0)
        lock.release()
        assert len(calls) == death


@requires_robust
@pytest.mark.timeout(60)
def test_failing_on_recover_propagates_and_the_next_acquirer_repairs(segment, ctx):
    def fail():
        raise OSError("repair failed")

    repairs = []
    failing = _attach(segment, on_recover=fail)
    repairing = _attach(segment, on_recover=lambda: repairs.append(1))
    _kill_holder(ctx, segment)
    with pytest.raises(OSError, match="repair failed"):
        failing.acquire(timeout=30)
    assert repairing.acquire(timeout=0)
    repairing.release()
    assert repairing.acquire(timeout=0)
    repairing.release()
    assert repairs == [1]
    assert repairing.recoveries == 1


@requires_robust
def test_thread_that_ends_holding_the_lock_is_recovered():
    calls = []
    lock = _heap_lock(on_recover=lambda: calls.append(1))
    holder = threading.Thread(target=lock.acquire)
    holder.start()
    holder.join()
    assert lock.acquire(timeout=30)
    lock.release()
    assert calls == [1]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("timeout", [0, 0.1])
def test_acquire_returns_false_at_timeout_while_another_process_holds_it(segment, ctx, timeout):
    lock = _attach(segment)
    with _held_by_child(ctx, segment):
        assert lock.acquire(timeout=timeout) is False
        with pytest.raises(RuntimeError, match="does not hold"):
            lock.release()


class _Interrupted(Exception):
    pass


def _interrupt(signum, frame):
    raise _Interrupted


@pytest.mark.timeout(60)
def test_signal_handler_exception_ends_a_blocked_acquire(segment, ctx):
    lock = _attach(segment)
    previous = signal.signal(signal.SIGUSR1, _interrupt)
    sender = threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1))
    try:
        with _held_by_child(ctx, segment):
            sender.start()
            with pytest.raises(_Interrupted):
                lock.acquire()
    finally:
        sender.cancel()
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.timeout(60)
def test_counters_record_acquisitions_and_contended_wait(segment, ctx):
    lock = _attach(segment)
    counters = segment.arrays["counters"]
    with _held_by_child(ctx, segment, seconds=0.5):
        lock.acquire()  # blocks until the child lets go
    lock.release()
    assert counters[1] == 2
    assert counters[0] > 0


def test_uncontended_acquisitions_are_counted_without_wait():
    counters = np.zeros(2, np.int64)
    lock = _heap_lock(counters=counters)
    for _ in range(5):
        with lock:
            pass
    assert counters.tolist() == [0, 5]


@pytest.mark.timeout(60)
def test_release_by_a_process_that_does_not_hold_the_lock_raises_and_leaves_it_held(segment, ctx):
    lock = _attach(segment)
    with _held_by_child(ctx, segment):
        with pytest.raises(RuntimeError, match="does not hold"):
            lock.release()
        assert lock.acquire(timeout=0) is False


def test_release_of_an_unheld_lock_raises():
    lock = _heap_lock()
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()
    assert lock.acquire(timeout=0)
    lock.release()


def test_acquire_by_the_holding_thread_raises_instead_of_deadlocking():
    lock = _heap_lock()
    lock.acquire()
    with pytest.raises(RuntimeError, match="already holds"):
        lock.acquire()
    lock.release()


def test_with_block_releases_the_lock_when_it_raises():
    lock = _heap_lock()
    with pytest.raises(KeyError), lock:
        raise KeyError("boom")
    assert lock.acquire(timeout=0)
    lock.release()


def test_attach_to_a_region_without_a_lock_raises():
    with pytest.raises(ValueError, match="holds no lock"):
        SharedLock(np.zeros(LOCK_NBYTES, np.uint8), False)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"region": np.zeros(LOCK_NBYTES - 1, np.uint8)}, ValueError, "region: expected at least"),
        ({"region": np.zeros(LOCK_NBYTES + 8, np.uint8)[1:]}, ValueError, "region: expected a start address"),
        ({"on_recover": "rebuild"}, TypeError, "on_recover: expected a callable"),
        ({"counters": np.zeros(1, np.int64)}, ValueError, "counters: expected at least 2"),
    ],
)
def test_bad_constructor_argument_raises_naming_it(kwargs, error, match):
    kwargs = {"region": np.zeros(LOCK_NBYTES, np.uint8), "create": True, **kwargs}
    with pytest.raises(error, match=match):
        SharedLock(**kwargs)


@pytest.mark.parametrize("timeout", [-1, float("nan")])
def test_bad_timeout_raises_naming_it(timeout):
    with pytest.raises(ValueError, match="timeout: expected"):
        _heap_lock().acquire(timeout=timeout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="robust mutexes are a Linux promise")
def test_lock_is_robust_on_linux():
    assert SharedLock.robust


def test_a_lock_object_dropped_while_held_lets_go_of_its_memory():
    # A held robust mutex sits in its thread's robust list; memory freed while
    # held would leave the C library writing through a dangling pointer.
    region = np.zeros(LOCK_NBYTES, np.uint8)
    lock = SharedLock(region, True)
    lock.acquire()
    del lock
    gc.collect()
    other = SharedLock(region, False)
    assert other.acquire(timeout=0)
    other.release()

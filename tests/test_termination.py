"""A process that owns a buffer, told to end (SIGTERM, SIGHUP), unlinks its segments and ends, whatever it is doing."""

from __future__ import annotations

import itertools
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing import resource_tracker

import pytest
from helpers import EACH_START_METHOD, own_a_buffer, segment_exists, start_buffer_owner

from mpreplay import MPReplayBuffer
from mpreplay._ext import termination

pytestmark = pytest.mark.usefixtures("default_termination_signals")


def _stop(child: mp.Process) -> None:
    child.kill()
    child.join()


# -- child-process bodies (module level: spawn pickles them by name) ---------


def _sleep_and_signal_from_a_helper_thread(queue, sig: int) -> None:
    buffer = own_a_buffer(queue)  # noqa: F841 (alive while the child sleeps)

    # A signal sent to the process may land on any thread that does not block it; here it lands
    # on a helper thread for sure, while the main thread sleeps.
    def signal_this_thread():
        time.sleep(0.5)
        signal.pthread_kill(threading.get_ident(), sig)

    threading.Thread(target=signal_this_thread).start()
    time.sleep(60)


def _busy_in_c(queue) -> None:
    buffer = own_a_buffer(queue)  # noqa: F841
    queue.close()
    queue.join_thread()  # the name is sent before the GIL is taken for good
    # sum() over an iterator that never ends runs in C with the GIL held: no Python handler can run.
    sum(itertools.repeat(1))


def _handle_sigterm_itself(queue) -> None:
    def leave(signum, frame):
        buffer.close()
        os._exit(7)

    signal.signal(signal.SIGTERM, leave)
    buffer = own_a_buffer(queue)
    while True:  # short sleeps: this handler is not guarded, and a signal just before a sleep waits for its end
        time.sleep(0.05)


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


# -- behaviour ---------------------------------------------------------------


@EACH_START_METHOD
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
@pytest.mark.timeout(60)
def test_a_signal_on_another_thread_ends_the_child_while_its_main_thread_sleeps(method, sig):
    child, name = start_buffer_owner(method, _sleep_and_signal_from_a_helper_thread, sig)
    try:
        child.join(20)
        assert child.exitcode == -sig
        assert not segment_exists(name)
    finally:
        _stop(child)


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_child_stuck_in_c_with_the_gil_is_still_unlinked_and_ended_by_sigterm(method):
    child, name = start_buffer_owner(method, _busy_in_c)
    try:
        time.sleep(0.5)  # into the endless sum by then
        child.terminate()
        child.join(20)
        assert child.exitcode == -signal.SIGTERM
        assert not segment_exists(name)
    finally:
        _stop(child)
        # Its Python handler never ran, so the resource tracker still lists the segment and
        # would report it as leaked at its exit.
        resource_tracker.unregister(f"/{name}", "shared_memory")


@EACH_START_METHOD
@pytest.mark.timeout(60)
def test_a_sigterm_handler_the_program_set_itself_is_kept(method):
    child, name = start_buffer_owner(method, _handle_sigterm_itself)
    try:
        child.terminate()
        child.join(20)
        assert child.exitcode == 7
        assert not segment_exists(name)
    finally:
        _stop(child)


def _terminate_a_forked_child_of_an_owner(target, *args) -> tuple[int | None, bool]:
    """Fork ``target(*args)`` from a process that owns a buffer, terminate it half a second later,
    and return its exit code and whether the parent's segment is still there."""
    with MPReplayBuffer(8, {"obs": {}}) as buffer:
        child = mp.get_context("fork").Process(target=target, args=args)
        child.start()
        try:
            time.sleep(0.5)
            child.terminate()
            child.join(20)
            return child.exitcode, segment_exists(buffer.name)
        finally:
            _stop(child)


@pytest.mark.timeout(60)
def test_a_forked_child_that_is_terminated_leaves_its_parents_segment_alone():
    assert _terminate_a_forked_child_of_an_owner(_sleep, 60) == (-signal.SIGTERM, True)


@pytest.mark.timeout(60)
def test_a_forked_child_stuck_in_c_is_still_ended_by_sigterm():
    assert _terminate_a_forked_child_of_an_owner(sum, itertools.repeat(1)) == (-signal.SIGTERM, True)


def test_owned_lists_what_this_process_created_until_it_closes_it():
    buffer = MPReplayBuffer(8, {"obs": {}})
    path = f"/{buffer.name}"
    assert path in termination.owned()
    buffer.close()
    assert path not in termination.owned()


def test_a_process_owning_the_most_segments_is_refused_another_with_a_clear_error():
    free = termination.OWNED_MAX - len(termination.owned())
    names = [f"/mpreplay-test-{i}" for i in range(free)]
    try:
        for name in names:
            termination.own(name)
        with pytest.raises(OSError, match=f"already owns {termination.OWNED_MAX} shared-memory segments"):
            termination.own("/mpreplay-test-one-more")
    finally:
        for name in names:
            termination.disown(name)


def _own_as_many_as_fit(queue) -> None:
    count = 0
    try:
        while True:
            termination.own(f"/mpreplay-test-{count}")
            count += 1
    except OSError:
        queue.put(count)


@pytest.mark.timeout(60)
def test_a_forked_child_has_room_for_as_many_segments_as_any_process():
    with MPReplayBuffer(8, {"obs": {}}):  # the parent's entries are copied into the child's table
        ctx = mp.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_own_as_many_as_fit, args=(queue,))
        child.start()
        try:
            assert queue.get(timeout=30) == termination.OWNED_MAX
        finally:
            _stop(child)


@pytest.mark.parametrize("name", ["", "/" + "x" * 63], ids=["empty", "too long"])
def test_a_name_that_does_not_fit_is_refused(name):
    with pytest.raises(ValueError, match=r"name: expected a segment name of 1\.\.63 bytes"):
        termination.own(name)


@pytest.mark.parametrize("sig", [0, -1, 65])
def test_a_number_that_is_no_signal_is_refused(sig):
    with pytest.raises(ValueError, match=r"sig: expected a signal number in 1\.\.64"):
        termination.guard(sig)


@pytest.mark.parametrize("action", [signal.SIG_DFL, signal.SIG_IGN], ids=["default", "ignored"])
def test_a_signal_without_a_python_handler_is_not_guarded(action):
    previous = signal.signal(signal.SIGUSR2, action)
    try:
        assert not termination.guard(signal.SIGUSR2)
    finally:
        signal.signal(signal.SIGUSR2, previous)

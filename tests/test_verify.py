"""``verify()``: every buffer checks its derived state against its slot states, and names
what disagrees."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import threading
from collections.abc import Iterator

import numpy as np
import pytest
from helpers import EACH_START_METHOD, EPISODE_STEP_FIELDS, assert_child_dies_at, start_lock_holder

from mpreplay import (
    CorruptBufferError,
    MPPrioritizedReplayBuffer,
    MPPrioritizedSequenceReplayBuffer,
    MPReplayBuffer,
    PrioritizedReplayBuffer,
    PrioritizedSequenceReplayBuffer,
    ReplayBuffer,
    SampleToInsertRatio,
    SequenceReplayBuffer,
)
from mpreplay._ext.schema import (
    LANE_CURSOR,
    PENDING_COUNT,
    PENDING_LANE,
    PENDING_START,
    RESERVED,
    STORED,
    TREE_ARRAY,
)
from mpreplay.cli import main

ENV = EPISODE_STEP_FIELDS
CAPACITY = 64


def _uniform():
    return ReplayBuffer(CAPACITY, ENV)


def _prioritized():
    return PrioritizedReplayBuffer(CAPACITY, ENV)


def _next_of():
    return PrioritizedReplayBuffer(CAPACITY, ENV, next_of="obs", lanes=2)


def _sequences():
    return SequenceReplayBuffer(CAPACITY, ENV, length=4, lanes=2)


def _prioritized_sequences():
    return PrioritizedSequenceReplayBuffer(CAPACITY, ENV, length=4, lanes=2)


def _shared_uniform():
    return MPReplayBuffer(CAPACITY, ENV)


def _shared_prioritized():
    return MPPrioritizedReplayBuffer(CAPACITY, ENV)


def _rate_limited():
    return MPPrioritizedReplayBuffer(CAPACITY, ENV, rate_limiter=SampleToInsertRatio(1.0, 8, 1000.0))


def _shared_sequences():
    return MPPrioritizedSequenceReplayBuffer(CAPACITY, ENV, length=4, lanes=2)


KINDS = pytest.mark.parametrize(
    "make",
    [
        _uniform,
        _prioritized,
        _next_of,
        _sequences,
        _prioritized_sequences,
        _shared_uniform,
        _shared_prioritized,
        _rate_limited,
        _shared_sequences,
    ],
    ids=lambda make: make.__name__.strip("_"),
)


def _add_episode(buffer, steps: int, first: int = 0) -> None:
    """One episode of ``steps`` steps, ended; observations count up from ``first``."""
    obs = np.repeat(np.arange(first, first + steps, dtype=np.float32)[:, None], 2, axis=1)
    done = np.zeros(steps)
    done[-1] = 1.0
    rows = {"obs": obs, "done": done}
    if "next_obs" in buffer.get_env_dict():
        rows["next_obs"] = obs + 1
    buffer.add(**rows)


@KINDS
def test_a_fresh_buffer_verifies(make):
    with make() as buffer:
        report = buffer.verify()
        assert report["slots"] == CAPACITY and report["complete"] == report["drawable"] == 0


@KINDS
def test_a_buffer_filled_once_verifies(make):
    with make() as buffer:
        _add_episode(buffer, 20)
        report = buffer.verify()
        assert report["complete"] == buffer.get_stored_size() > 0
        assert report["being_written"] == 0


@KINDS
def test_a_buffer_wrapped_many_times_and_updated_verifies(make):
    with make() as buffer:
        for lap in range(12):
            _add_episode(buffer, 25, first=100 * lap)
            if buffer.config.by_priority:
                batch = buffer.sample(8)
                buffer.update_priorities(batch["indexes"], np.arange(1.0, 9.0))
        assert buffer.verify()["complete"] == buffer.get_stored_size()


def test_a_write_in_progress_verifies_and_is_reported():
    with MPPrioritizedReplayBuffer(CAPACITY, ENV) as buffer:
        _add_episode(buffer, 10)
        reservation = buffer.inspection().reserve(3)
        assert buffer.verify()["being_written"] == 3
        stats = buffer.stats()
        assert stats["reserved"] - stats["inserts"] == 3
        reservation.publish()
        assert buffer.verify()["being_written"] == 0


def test_a_reservation_is_refused_where_writers_have_lanes_of_their_own():
    with pytest.raises(TypeError, match="reserve: only the writers of an uncompressed transition buffer"):
        _next_of().inspection().reserve(1)


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_a_buffer_whose_holder_died_verifies_once_recovered(method):
    with MPPrioritizedReplayBuffer(CAPACITY, ENV) as buffer:
        _add_episode(buffer, 30)
        assert_child_dies_at(method, "publish", _add_episode, buffer, 8, 1000, timeout=60)
        report = buffer.verify()  # its lock acquisition repairs the buffer
        assert buffer.stats()["lock_recoveries"] == 1
        assert report["complete"] == buffer.get_stored_size()


# -- each kind of damage is found and named -----------------------------------------------------


def _damaged(damage) -> CorruptBufferError:
    buffer = PrioritizedReplayBuffer(CAPACITY, ENV)
    _add_episode(buffer, 40)
    damage(buffer.inspection())
    with pytest.raises(CorruptBufferError) as caught:
        buffer.verify()
    return caught.value


def test_a_wrong_stored_count_is_named():
    error = _damaged(lambda view: view.writable("header").__setitem__(STORED, 7))
    assert any("STORED: 7, but 40 slots are COMPLETE" in p for p in error.problems)


def test_more_inserts_than_reservations_are_named():
    error = _damaged(lambda view: view.writable("header").__setitem__(RESERVED, 3))
    assert any("INSERTS" in p and "RESERVED" in p for p in error.problems)


def test_a_slot_state_out_of_range_is_named():
    error = _damaged(lambda view: view.writable("state").__setitem__(5, 9))
    assert any(p.startswith("state: not EMPTY, COMPLETE or WAITING at slots [5]") for p in error.problems)


def test_a_slot_emptied_under_its_weight_is_named():
    error = _damaged(lambda view: view.writable("state").__setitem__(5, 0))
    assert any("a slot that may not be drawn has a weight at slots [5]" in p for p in error.problems)
    assert any("STORED" in p for p in error.problems)


def test_a_tree_node_that_disagrees_with_its_children_is_named():
    def damage(view):
        tree = view.writable(TREE_ARRAY)
        tree[8] += 1.0  # the first entry of the sum tree's root node

    error = _damaged(damage)
    assert (
        error.problems == [error.problems[0]]
        and "inner entries differ from their children's, first at entry 8" in error.problems[0]
    )


def test_a_reservation_left_half_made_is_named():
    # Only a reservation under way writes the pending run, and verify holds the lock: a run left
    # there means its holder died and the repair that ends it never ran.
    def damage(view):
        view.writable("header")[[PENDING_LANE, PENDING_START, PENDING_COUNT]] = 0, 5, 3

    error = _damaged(damage)
    assert any("a reservation of 3 slots from slot 5 of lane 0 was left half made" in p for p in error.problems)


def test_a_cursor_outside_its_lane_is_named():
    error = _damaged(lambda view: view.writable("lanes").__setitem__((0, LANE_CURSOR), CAPACITY + 3))
    assert any("cursor 67 is outside its slots [0, 64)" in p for p in error.problems)


def test_a_uniform_selector_missing_a_member_is_named():
    buffer = ReplayBuffer(CAPACITY, ENV)
    _add_episode(buffer, 10)
    members = buffer.inspection().writable("members")
    members[1 + CAPACITY + 4] = -1  # slot 4 loses its place among the members
    with pytest.raises(CorruptBufferError, match=r"drawable slots and the selector's members differ at slots \[4\]"):
        buffer.verify()


def test_a_sequence_over_a_step_not_stored_is_named():
    buffer = PrioritizedSequenceReplayBuffer(CAPACITY, ENV, length=4, lanes=2)
    buffer.inspection().writable("sequence_steps")[40] = 2
    with pytest.raises(CorruptBufferError, match=r"a sequence starts at a slot not COMPLETE at slots \[40\]"):
        buffer.verify()


def test_a_sequence_missing_a_later_step_is_named():
    buffer = PrioritizedSequenceReplayBuffer(CAPACITY, ENV, length=4, lanes=2)
    _add_episode(buffer, 4)  # one sequence, at slot 0, of four real steps
    buffer.inspection().writable("state")[2] = 0  # its third step is no longer stored
    with pytest.raises(CorruptBufferError, match=r"a sequence holds a step that is not stored at slots \[0\]"):
        buffer.verify()


def _compressed_with_an_episode():
    buffer = PrioritizedReplayBuffer(CAPACITY, ENV, next_of="obs", lanes=2)
    _add_episode(buffer, 10)  # slots 0..9, the last next frame at 10, in lane 0 = [0, 32)
    return buffer


def test_a_row_whose_next_observation_lies_in_another_lane_is_named():
    buffer = _compressed_with_an_episode()
    buffer.inspection().writable("nxt")[3] = 40
    with pytest.raises(CorruptBufferError, match=r"nxt: a row's next observation lies outside its lane at slots \[3\]"):
        buffer.verify()


def test_a_row_reading_a_frame_being_written_is_named():
    buffer = _compressed_with_an_episode()
    buffer.inspection().writable("generation")[10] += 1  # the episode's last next frame: odd, "being written"
    with pytest.raises(CorruptBufferError, match=r"frames: a complete row reads a slot being written at slots \[9\]"):
        buffer.verify()


def test_the_error_lists_every_problem_in_its_message():
    error = _damaged(
        lambda view: (view.writable("header").__setitem__(STORED, 7), view.writable("state").__setitem__(5, 9))
    )
    assert len(error.problems) >= 2
    assert all(p in str(error) for p in error.problems)


@contextlib.contextmanager
def _lock_held_by_another_thread(buffer) -> Iterator[None]:
    """Inside the block, another thread of this process holds the buffer's lock."""
    held, done = threading.Event(), threading.Event()

    def hold() -> None:
        with buffer.inspection().holding_lock():
            held.set()
            done.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(30)
        yield
    finally:
        done.set()
        holder.join(30)


@pytest.mark.timeout(60)
def test_verify_waits_for_the_lock_no_longer_than_its_timeout():
    with MPReplayBuffer(CAPACITY, ENV) as buffer:
        with _lock_held_by_another_thread(buffer), pytest.raises(TimeoutError, match="lock"):
            buffer.verify(timeout=0.05)
        assert buffer.verify()["complete"] == 0


# -- mpreplay verify NAME: the same check from any shell --------------------------------------


def test_mpreplay_verify_reports_a_consistent_buffer(capsys):
    with MPPrioritizedReplayBuffer(CAPACITY, ENV) as buffer:
        _add_episode(buffer, 40)
        assert main(["verify", buffer.name]) == 0
    assert f"{buffer.name}: consistent: slots 64, complete 40" in capsys.readouterr().out


def test_mpreplay_verify_names_each_disagreement_and_exits_1(capsys):
    with MPReplayBuffer(CAPACITY, ENV) as buffer:
        _add_episode(buffer, 40)
        buffer.inspection().writable("header")[STORED] = 3
        assert main(["verify", buffer.name]) == 1
    assert "header STORED: 3, but 40 slots are COMPLETE" in capsys.readouterr().out


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_mpreplay_verify_leaves_a_dead_holders_repair_to_the_buffer(method, capsys):
    ctx = mp.get_context(method)
    with MPPrioritizedReplayBuffer(CAPACITY, ENV) as buffer:
        _add_episode(buffer, 40)
        holder = start_lock_holder(ctx, buffer)
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(30)
        assert main(["verify", buffer.name]) == 1
        assert "died holding the lock" in capsys.readouterr().err
        assert buffer.verify()["complete"] == 40  # the buffer's own call repairs it
        assert buffer.stats()["lock_recoveries"] == 1
        assert main(["verify", buffer.name]) == 0


@pytest.mark.timeout(60)
def test_mpreplay_verify_gives_up_on_a_held_lock_after_its_timeout(capsys):
    with MPReplayBuffer(CAPACITY, ENV) as buffer, _lock_held_by_another_thread(buffer):
        assert main(["verify", buffer.name, "--timeout", "0.05"]) == 1
    assert "timed out waiting for the lock, held by" in capsys.readouterr().err

"""Queue(size) and Stack(size): a shared trajectory queue whose every item is sampled exactly once."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import random
import re
import signal
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, ID_FIELD

from mpreplay import (
    MPPrioritizedReplayBuffer,
    MPPrioritizedSequenceReplayBuffer,
    MPReplayBuffer,
    MPSequenceReplayBuffer,
    PrioritizedReplayBuffer,
    PrioritizedSequenceReplayBuffer,
    Queue,
    ReplayBuffer,
    SelectorSpec,
    SequenceReplayBuffer,
    Stack,
)
from mpreplay._ext.schema import EPOCH, LOCK_HOLDS, LOCK_WAIT_NS
from mpreplay.inspect import arm_fault

ENV = ID_FIELD
# A tagged item: its writer, its number, and a payload every element of which repeats both.
ITEM = {"writer": {"dtype": np.int64}, "seq": {"dtype": np.int64}, "payload": {"shape": (64,), "dtype": np.int64}}


def _memory(buffer: MPReplayBuffer) -> dict[str, bytes]:
    """Every array of the buffer's memory but the lock's own bookkeeping: its mutex, the time
    and holds counted for it, and the wake-up word a wait bumps."""
    arrays = dict(buffer.inspection().arrays)
    arrays.pop("lock")
    header = arrays.pop("header").copy()
    header[[LOCK_WAIT_NS, LOCK_HOLDS, EPOCH]] = 0
    return {"header": header.tobytes(), **{name: a.tobytes() for name, a in arrays.items()}}


def test_a_full_queue_refuses_a_write_by_its_timeout_and_changes_nothing():
    queue = MPReplayBuffer(4, ENV, rate_limiter=Queue(4))
    queue.add(id=np.arange(4))
    before = _memory(queue)
    with pytest.raises(TimeoutError, match="not yet sampled"):
        queue.add(id=9, timeout=0.05)
    with pytest.raises(TimeoutError, match="not yet sampled"):
        queue.add(id=np.arange(2), timeout=0.05)
    assert _memory(queue) == before
    queue.close()


def test_a_write_goes_once_an_item_was_sampled():
    queue = MPReplayBuffer(2, ENV, rate_limiter=Queue(2))
    queue.add(id=np.arange(2))
    assert queue.sample(1)["id"].tolist() == [0]
    queue.add(id=2, timeout=0)
    assert queue.sample(2)["id"].tolist() == [1, 2]
    queue.close()


def test_a_sample_waits_until_k_items_are_there():
    queue = MPReplayBuffer(4, ENV, rate_limiter=Queue(4))
    queue.add(id=np.arange(2))
    with pytest.raises(TimeoutError, match="until more is inserted"):
        queue.sample(3, timeout=0.05)
    queue.add(id=2)
    assert queue.sample(3, timeout=0)["id"].tolist() == [0, 1, 2]
    queue.close()


def test_a_queue_keeps_the_order_items_were_written_in():
    queue = MPReplayBuffer(4, ENV, rate_limiter=Queue(4))
    queue.add(id=np.arange(3))
    delivered = []
    for start in range(3, 11, 2):  # the ring wraps twice
        delivered += queue.sample(2)["id"].tolist()
        queue.add(id=np.arange(start, start + 2), timeout=0)
    delivered += queue.sample(queue.get_stored_size())["id"].tolist()
    assert delivered == list(range(11))
    queue.close()


def test_a_stack_hands_out_the_newest_first_and_never_overwrites_the_oldest():
    stack = MPReplayBuffer(4, ENV, rate_limiter=Stack(4))
    stack.add(id=np.arange(4))
    assert stack.sample(2)["id"].tolist() == [3, 2]
    stack.add(id=np.array([4, 5]), timeout=0)  # into the two sampled slots, not over 0 and 1
    assert stack.sample(4)["id"].tolist() == [5, 4, 1, 0]
    assert stack.verify()["complete"] == 0
    stack.close()


def test_a_stack_whose_oldest_item_stays_unread_still_takes_writes():
    # The ring's next slot holds the oldest, unread item: the write goes to a free slot after it.
    stack = MPReplayBuffer(3, ENV, rate_limiter=Stack(3))
    stack.add(id=np.arange(3))
    for i in range(3, 10):
        assert stack.sample(1)["id"].tolist() == [i - 1]
        stack.add(id=i, timeout=0)
    assert stack.sample(3)["id"].tolist() == [9, 1, 0]
    stack.close()


def test_a_stack_write_of_k_rows_goes_into_any_k_free_slots():
    stack = MPReplayBuffer(4, ENV, rate_limiter=Stack(4))
    stack.add(id=np.array([0, 1]))
    assert stack.sample(1)["id"].tolist() == [1]
    stack.add(id=2)  # the free slots are now apart: the one 1 left, and the last
    stack.add(id=np.array([3, 4]), timeout=0)
    assert stack.sample(4)["id"].tolist() == [4, 3, 2, 0]
    stack.close()


def _take(buffer: MPReplayBuffer, k: int, got) -> None:
    got.value = len(buffer.sample(k, timeout=30)["id"])


@EACH_START_METHOD
@pytest.mark.timeout(60, method="thread")
def test_a_stack_write_into_free_slots_apart_reaches_a_learner_waiting_for_it(method):
    ctx = mp.get_context(method)
    stack = MPReplayBuffer(4, ENV, rate_limiter=Stack(4))
    stack.add(id=np.array([0, 1]))
    stack.sample(1)
    stack.add(id=2)
    got = ctx.Value("i", 0)
    learner = ctx.Process(target=_take, args=(stack, 3, got))
    learner.start()
    stack.add(id=np.array([3, 4]), timeout=10)
    learner.join(30)
    assert learner.exitcode == 0 and got.value == 3
    assert stack.sample(1)["id"].tolist() == [0]
    stack.close()


@pytest.mark.parametrize(
    ("limiter", "items", "order"), [(Queue, [11, 20, 21, 22], [0, 1, 2, 3]), (Stack, [10, 20, 21, 22], [3, 2, 1, 0])]
)
def test_a_snapshot_lists_the_items_oldest_first_wherever_they_lie(limiter, items, order, tmp_path):
    # The last item lands in the slot the sample freed, wherever that is; the file keeps the
    # items' order, so the buffer loaded from it hands them out in the same order.
    queue = MPReplayBuffer(4, ENV, rate_limiter=limiter(4))
    queue.add(id=np.array([10, 11]))
    queue.sample(1)
    for i in (20, 21, 22):
        queue.add(id=i)
    assert queue.get_all_transitions()["id"].tolist() == items
    queue.save_transitions(tmp_path / "queue.npz")
    loaded = MPReplayBuffer(4, ENV, rate_limiter=limiter(4))
    loaded.load_transitions(tmp_path / "queue.npz")
    assert loaded.get_all_transitions()["id"].tolist() == items
    assert loaded.sample(4)["id"].tolist() == queue.sample(4)["id"].tolist() == [items[i] for i in order]
    queue.close()
    loaded.close()


def test_a_queue_snapshot_follows_the_order_items_were_published_in():
    # A writer that reserved first and published last: its item comes last, as the queue draws it.
    queue = MPReplayBuffer(4, ENV, rate_limiter=Queue(4))
    view = queue.inspection()
    early = view.reserve(1)
    view.writable("field:id")[early.slots] = 9
    queue.add(id=1)
    early.publish()
    assert queue.get_all_transitions()["id"].tolist() == [1, 9]
    assert queue.sample(2)["id"].tolist() == [1, 9]
    queue.close()


@pytest.mark.parametrize("limiter", [Queue(4), Stack(4)])
def test_more_rows_at_once_than_the_size_are_refused(limiter):
    queue = MPReplayBuffer(4, ENV, rate_limiter=limiter)
    before = _memory(queue)
    with pytest.raises(ValueError, match="exceed the queue's size 4"):
        queue.add(id=np.arange(5))
    with pytest.raises(ValueError, match="batch_size: 5"):
        queue.sample(5)
    assert _memory(queue) == before
    queue.close()


def test_a_queue_configures_its_buffer():
    queue = ReplayBuffer(8, ENV, rate_limiter=Queue(8))
    queue.add(id=np.arange(3))
    assert queue.sample(3)["id"].tolist() == [0, 1, 2]
    assert queue.get_stored_size() == 0
    assert repr(Queue(8)) == "Queue(8)" and repr(Stack(2)) == "Stack(2)"


@pytest.mark.parametrize(
    ("size", "options", "message"),
    [
        (5, {}, "size: a Queue\\(4\\) needs a buffer of exactly 4 slots, got 5"),
        (4, {"selector": "uniform"}, "selector: a Queue\\(4\\) draws with selector 'fifo'"),
        (4, {"selector": "lifo"}, "selector: a Queue\\(4\\) draws with selector 'fifo'"),
        (4, {"max_times_sampled": 2}, "max_times_sampled: a Queue\\(4\\) samples every item exactly once"),
    ],
)
def test_a_conflicting_configuration_is_refused_by_name(size, options, message):
    with pytest.raises(ValueError, match=message):
        ReplayBuffer(size, ENV, rate_limiter=Queue(4), **options)


@pytest.mark.parametrize(
    "options",
    [
        {"selector": "fifo", "max_times_sampled": 1},
        {"selector": SelectorSpec("fifo")},
        {"remover": "keep_unread"},
    ],
    ids=["names", "selector-spec", "remover"],
)
def test_a_queue_agrees_with_the_options_it_sets_itself(options):
    queue = ReplayBuffer(4, ENV, rate_limiter=Queue(4), **options)
    queue.add(id=np.arange(2))
    assert queue.sample(2)["id"].tolist() == [0, 1]


@pytest.mark.parametrize("limiter", [Queue, Stack])
def test_a_queue_of_one_slot_hands_out_its_one_item(limiter):
    with ReplayBuffer(1, ENV, rate_limiter=limiter(1)) as queue:
        queue.add(id=7, timeout=0)
        assert queue.sample(1, timeout=0)["id"].tolist() == [7]


LIMITERS = pytest.mark.parametrize("limiter", [Queue(4), Stack(4)], ids=repr)


@LIMITERS
@pytest.mark.parametrize("cls", [PrioritizedReplayBuffer, MPPrioritizedReplayBuffer])
def test_a_prioritized_buffer_refuses_a_queue_naming_the_rate_limiter(cls, limiter):
    refusal = rf"^rate_limiter: a prioritized buffer takes no {re.escape(repr(limiter))}: .* by no priority"
    with pytest.raises(ValueError, match=refusal):
        cls(4, ENV, rate_limiter=limiter)


@LIMITERS
@pytest.mark.parametrize(
    "cls",
    [SequenceReplayBuffer, PrioritizedSequenceReplayBuffer, MPSequenceReplayBuffer, MPPrioritizedSequenceReplayBuffer],
)
def test_a_sequence_buffer_refuses_a_queue_naming_the_rate_limiter(cls, limiter):
    # Not max_times_sampled or selector, which the caller never wrote: the limiter sets them.
    refusal = rf"^rate_limiter: a sequence buffer takes no {re.escape(repr(limiter))}: its items are sequences"
    with pytest.raises(ValueError, match=refusal):
        cls(4, ENV, length=2, rate_limiter=limiter)


@pytest.mark.parametrize("size", [0, -1, 1.5])
def test_a_queue_of_no_size_is_refused(size):
    with pytest.raises((TypeError, ValueError), match="size"):
        Queue(size)


def _item(writer: int, seq: int) -> dict[str, np.ndarray]:
    return {
        "writer": np.array([writer]),
        "seq": np.array([seq]),
        "payload": np.full((1, 64), writer * 1_000_000 + seq),
    }


def _writer(buffer: MPReplayBuffer, writer: int, items: int) -> None:
    for seq in range(items):
        buffer.add(**_item(writer, seq), timeout=60)


def _consume(buffer: MPReplayBuffer, seen: list[tuple[int, int]], batch: int, timeout: float = 60) -> None:
    out = buffer.sample(batch, timeout=timeout)
    tags = out["writer"] * 1_000_000 + out["seq"]
    assert (out["payload"] == tags[:, None]).all(), "a torn item"
    seen += list(zip(out["writer"].tolist(), out["seq"].tolist(), strict=True))


def _victim(buffer: MPReplayBuffer, writer: int, site: str | None, after: int) -> None:
    """A writer that never finishes: killed by the test, or by itself inside a critical section."""
    if site is not None:
        arm_fault(site, after)
    _writer(buffer, writer, 10**9)


@EACH_START_METHOD
@pytest.mark.parametrize(
    ("limiter", "site"),
    [(Queue, None), (Stack, None), (Queue, "reserve"), (Queue, "publish"), (Stack, "publish")],
    ids=[
        "Queue-SIGKILL",
        "Stack-SIGKILL",
        "Queue-killed-reserving",
        "Queue-killed-publishing",
        "Stack-killed-publishing",
    ],
)
@pytest.mark.timeout(240, method="thread")
def test_every_surviving_writers_item_is_delivered_exactly_once(method, limiter, site):
    # Three writers of 60 tagged items and a fourth killed at a random moment (SIGKILL from here,
    # or its own fault site inside the lock); a learner samples pairs until the three writers'
    # items all arrived and the fourth died (pairs, one when one is stored: it is the only sampler),
    # then takes what is left.
    ctx = mp.get_context(method)
    buffer = MPReplayBuffer(8, ITEM, rate_limiter=limiter(8))
    writers, items = 3, 60
    moment = random.Random(os.getpid()).randrange(5, 40)
    procs = [ctx.Process(target=_writer, args=(buffer, w, items)) for w in range(writers)]
    victim = ctx.Process(target=_victim, args=(buffer, writers, site, moment))
    for p in [*procs, victim]:
        p.start()
    seen: list[tuple[int, int]] = []
    deadline = time.monotonic() + 200
    while sum(w < writers for w, _ in seen) < writers * items or victim.is_alive():
        assert time.monotonic() < deadline, "the surviving writers' items never all arrived"
        if site is None and victim.is_alive() and len(seen) >= moment:
            os.kill(victim.pid, signal.SIGKILL)
            victim.join()
        with contextlib.suppress(TimeoutError):  # nothing stored: look at the writers again
            _consume(buffer, seen, 2 if buffer.get_stored_size() >= 2 else 1, timeout=0.5)
    victim.join(30)
    assert victim.exitcode == -signal.SIGKILL
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    while buffer.get_stored_size():  # what the killed writer published before it died
        _consume(buffer, seen, 1, timeout=0)
    survivors = sorted(item for item in seen if item[0] < writers)
    assert survivors == [(w, s) for w in range(writers) for s in range(items)]
    killed = [s for w, s in seen if w == writers]
    assert len(killed) == len(set(killed))
    assert buffer.verify()["complete"] == 0
    buffer.close()

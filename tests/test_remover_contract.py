"""What every registered remover does (mpreplay.removers): where a write goes, and what it replaces.

Each test runs over every entry of the registry, so a new remover is held to all of them by adding
its entry -- and its rule to RULES below.
"""

from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest
from helpers import EACH_START_METHOD

from mpreplay import MPReplayBuffer, ReplayBuffer, monitor, removers

NAMES = pytest.mark.parametrize("name", removers.names())
ENV = {"id": {"dtype": np.int64}}
FRAMES = {"obs": {"shape": (2, 3), "dtype": np.uint8}, "done": {}}
# What a full table of rows 0..3 holds after a write of row 4 (None: the write waits for room).
RULES = {
    "fifo": [1, 2, 3, 4],
    "keep_unread": None,
    "lifo": [0, 1, 2, 4],
}
# What a table of 4 holding rows 0..2 holds after a write of rows 10 and 11 (None: it waits).
OVERFLOW_RULES = {
    "fifo": [1, 2, 10, 11],
    "keep_unread": None,
    "lifo": [0, 1, 10, 11],
}


def _options(name: str) -> dict:
    """What a table with remover ``name`` needs besides: one that never replaces an unread item
    needs samples that retire items."""
    return {} if removers.entry(name).overwrites else {"max_times_sampled": 1}


def test_every_remover_of_the_registry_has_its_rules_here():
    assert set(removers.names()) == set(RULES) == set(OVERFLOW_RULES)


def test_an_unknown_remover_is_refused_naming_the_registered_ones():
    with pytest.raises(ValueError, match=r"remover: expected one of \['fifo'"):
        ReplayBuffer(4, ENV, remover="newest")


@NAMES
def test_writes_into_an_empty_table_fill_its_slots_in_order(name):
    buffer = ReplayBuffer(4, ENV, remover=name, **_options(name))
    assert [buffer.add(id=i) for i in range(4)] == [0, 1, 2, 3]
    assert buffer.get_all_transitions()["id"].tolist() == [0, 1, 2, 3]


@NAMES
def test_a_write_into_a_full_table_replaces_what_the_rule_says_or_waits_changing_nothing(name):
    buffer = ReplayBuffer(4, ENV, remover=name, **_options(name))
    buffer.add(id=np.arange(4))
    if RULES[name] is None:
        with pytest.raises(TimeoutError, match="no room for 1 rows"):
            buffer.add(id=4, timeout=0)
        assert buffer.get_all_transitions()["id"].tolist() == [0, 1, 2, 3]
    else:
        buffer.add(id=4)
        assert sorted(buffer.get_all_transitions()["id"].tolist()) == RULES[name]
    buffer.verify()


@NAMES
def test_a_write_of_more_rows_than_free_slots_uses_them_and_replaces_what_the_rule_says(name):
    buffer = ReplayBuffer(4, ENV, remover=name, **_options(name))
    buffer.add(id=np.arange(3))
    if OVERFLOW_RULES[name] is None:
        with pytest.raises(TimeoutError, match="no room for 2 rows"):
            buffer.add(id=np.array([10, 11]), timeout=0)
        assert buffer.get_all_transitions()["id"].tolist() == [0, 1, 2]
    else:
        buffer.add(id=np.array([10, 11]))
        assert sorted(buffer.get_all_transitions()["id"].tolist()) == OVERFLOW_RULES[name]
    buffer.verify()


@NAMES
def test_a_table_whose_items_retire_at_their_draw_takes_writes_again(name):
    buffer = ReplayBuffer(4, ENV, remover=name, selector="fifo", max_times_sampled=1)
    buffer.add(id=np.arange(4))
    assert buffer.sample(2)["id"].tolist() == [0, 1]
    buffer.add(id=np.array([4, 5]), timeout=0)
    assert buffer.sample(4)["id"].tolist() == [2, 3, 4, 5]


@NAMES
def test_a_buffer_names_its_remover_in_its_manifest(name):
    with MPReplayBuffer(4, ENV, remover=name, **_options(name)) as buffer:
        (segment,) = [s for s in monitor.list_segments() if s.name == buffer.name]
        assert segment.document["remover"] == name


def _write(buffer, start: int) -> None:
    buffer.add(id=np.arange(start, start + 2), timeout=30)


@EACH_START_METHOD
@NAMES
@pytest.mark.timeout(60, method="thread")
def test_another_process_writes_where_the_remover_places_its_rows(name, method):
    with MPReplayBuffer(8, ENV, remover=name, **_options(name)) as buffer:
        buffer.add(id=np.arange(6))
        child = mp.get_context(method).Process(target=_write, args=(buffer, 6))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert buffer.get_all_transitions()["id"].tolist() == list(range(8))
        buffer.verify()


def _episode(buffer, steps: int) -> None:
    frames = np.arange(steps + 1, dtype=np.uint8)[:, None, None] * np.ones((1, 2, 3), np.uint8)
    for t in range(steps):
        buffer.add(obs=frames[t], next_obs=frames[t + 1], done=float(t == steps - 1), timeout=0)


@pytest.mark.parametrize("name", [n for n in removers.names() if removers.entry(n).frames])
def test_a_compressed_table_keeps_an_episodes_frames_whole(name):
    buffer = ReplayBuffer(64, FRAMES, remover=name, next_of="obs", **_options(name))
    _episode(buffer, 20)
    rows = buffer.get_all_transitions()
    assert (rows["next_obs"][:, 0, 0] == rows["obs"][:, 0, 0] + 1).all() and len(rows["obs"]) == 20
    buffer.verify()


@NAMES
def test_a_compressed_table_takes_a_remover_only_if_it_keeps_an_episodes_frames_in_order(name):
    if removers.entry(name).frames:
        ReplayBuffer(64, FRAMES, remover=name, next_of="obs", **_options(name)).close()
    else:
        with pytest.raises(ValueError, match=f"remover: '{name}' replaces"):
            ReplayBuffer(64, FRAMES, remover=name, next_of="obs", **_options(name))


@pytest.mark.parametrize("name", [n for n in removers.names() if not removers.entry(n).overwrites])
def test_a_sequence_buffer_refuses_a_remover_that_waits_for_samples(name):
    from mpreplay import SequenceReplayBuffer

    with pytest.raises(ValueError, match=f"remover: a sequence buffer takes no '{name}' remover"):
        SequenceReplayBuffer(8, ENV, length=2, remover=name)

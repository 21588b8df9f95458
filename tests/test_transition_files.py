"""Compressed transition buffers' files (next_of, stack_compress): a save/load round trip gives back
every transition, in its lane and episode, for every lane count and wrap position."""

from __future__ import annotations

import io
import multiprocessing as mp
from typing import Any

import damage  # tests/damage.py: transitions files taken apart and put together
import numpy as np
import pytest
from helpers import EACH_START_METHOD, TAGGED_STACK_FIELDS, reloaded, saved_file, tagged_episode

from mpreplay import MPPrioritizedReplayBuffer, MPReplayBuffer, Queue, ReplayBuffer, Table
from mpreplay.fileformat import TransitionFileError

ENV = TAGGED_STACK_FIELDS
WIDTH = 40  # slots per lane of every buffer here
LENGTHS = [9, 13, 7, 11]  # episode lengths, in turn
COMPRESSIONS = pytest.mark.parametrize(
    "options",
    [{"stack_compress": "obs"}, {"next_of": "obs"}, {"stack_compress": "obs", "next_of": "obs"}],
    ids=["stack", "next_of", "stack+next_of"],
)
BOTH_STACKED = {"stack_compress": "obs", "next_of": "obs"}


def _episode(writer: int, episode: int, n: int, *, ended: bool = True) -> dict[str, np.ndarray]:
    """n steps of one episode, with stacks of frames drawn from a generator seeded by (writer, episode, n)."""
    return tagged_episode(writer, episode, n, ended=ended, rng=np.random.default_rng([writer, episode, n]))


def _fill(writer: Any, w: int, steps: int) -> None:
    """Writer ``w`` stores ``steps`` steps in episodes of 9, 13, 7, 11, ... steps, each ended by its
    done flag but every third by on_episode_end(); the last one, cut short, stays open."""
    e = stored = 0
    while stored < steps:
        n = min(LENGTHS[e % 4], steps - stored)
        whole = n == LENGTHS[e % 4]
        writer.add(**_episode(w, e, n, ended=whole and e % 3 != 2))
        if whole and e % 3 == 2:
            writer.on_episode_end()
        stored, e = stored + n, e + 1


def _listed(rb: Any, lanes: bool) -> dict[str, np.ndarray]:
    """Every stored transition as listed (lane by lane, oldest first), with its lane if ``lanes``."""
    t = rb.get_all_transitions(indexes=lanes)
    if lanes:
        t["lane"] = t.pop("indexes") // WIDTH
    return t


def _assert_same(loaded: Any, saved: Any, *, lanes: bool = True) -> None:
    a, b = _listed(loaded, lanes), _listed(saved, lanes)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def _tags(rb: Any) -> list[tuple[int, int, int]]:
    return [tuple(tag) for tag in rb.get_all_transitions()["tag"].tolist()]


def _members(rb: Any) -> dict[str, Any]:
    """The arrays of ``rb``'s file, its metadata record decoded."""
    return damage.file_members(saved_file(rb))


# -- every transition, in its lane and episode ---------------------------------------------------------
@COMPRESSIONS
def test_a_buffer_loads_back_its_own_file_wherever_its_lane_wrapped(options):
    def make():
        return ReplayBuffer(WIDTH, ENV, **options)

    for extra in range(WIDTH):
        # The oldest episode kept is cut at every offset of its steps.
        rb = make()
        _fill(rb, 0, WIDTH + extra)
        _assert_same(reloaded(rb, make), rb)


@pytest.mark.parametrize("lanes", [1, 2, 3])
@pytest.mark.parametrize("cls", [ReplayBuffer, MPReplayBuffer], ids=["local", "shared"])
@COMPRESSIONS
def test_a_round_trip_gives_back_every_transition_in_its_lane_and_episode(cls, lanes, options):
    def make():
        return cls(WIDTH * lanes, ENV, lanes=lanes, **options)

    for extra in range(0, WIDTH, 7):
        with make() as rb:
            writers = [rb] + [rb.episode_writer() for _ in range(lanes - 1)]
            for w, writer in enumerate(writers):
                _fill(writer, w, WIDTH + extra + 5 * w)  # each lane wrapped at another offset
            with reloaded(rb, make) as loaded:
                _assert_same(loaded, rb)
            for writer in writers[1:]:
                writer.close()


def _write_lane(buffer: Any, w: int) -> None:
    _fill(buffer, w, WIDTH + 6 * w)
    buffer.close()


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_lanes_written_by_other_processes_load_back(method):
    def make():
        return MPReplayBuffer(WIDTH * 3, ENV, lanes=3, **BOTH_STACKED)

    ctx = mp.get_context(method)
    with make() as rb:
        children = [ctx.Process(target=_write_lane, args=(rb, w)) for w in (1, 2)]
        for child in children:
            child.start()
        for child in children:
            child.join(60)
            assert child.exitcode == 0
        _fill(rb, 0, WIDTH + 3)
        assert sorted({tag[0] for tag in _tags(rb)}) == [0, 1, 2]
        with reloaded(rb, make) as loaded:
            _assert_same(loaded, rb)


def test_saved_priorities_come_back_with_their_transitions():
    def make():
        return MPPrioritizedReplayBuffer(WIDTH * 2, ENV, lanes=2, **BOTH_STACKED)

    with make() as rb:
        other = rb.episode_writer()
        for w, writer in enumerate([rb, other]):
            for e, n in enumerate([14, 30]):
                writer.add(**_episode(w, e, n), priorities=np.arange(n) + 10.0 * e + 100.0 * w + 1)
        saved = io.BytesIO()
        rb.save_transitions(saved, priorities=True)
        saved.seek(0)
        with make() as loaded:
            loaded.load_transitions(saved)
            again = io.BytesIO()
            loaded.save_transitions(again, priorities=True)
            saved.seek(0)
            again.seek(0)
            np.testing.assert_array_equal(np.load(again)["priorities"], np.load(saved)["priorities"])
            _assert_same(loaded, rb)
        other.close()


# -- episodes -------------------------------------------------------------------------------------------
def test_the_file_numbers_each_transitions_episode_and_names_its_lane():
    rb = ReplayBuffer(WIDTH * 2, ENV, lanes=2, **BOTH_STACKED)
    other = rb.episode_writer()
    rb.add(**_episode(0, 0, 5))
    rb.add(**_episode(0, 1, 4, ended=False))
    rb.on_episode_end()
    rb.add(**_episode(0, 2, 3, ended=False))  # open: its last transition waits for its next observation
    other.add(**_episode(1, 0, 6))
    f = io.BytesIO()
    rb.save_transitions(f)
    f.seek(0)
    data = np.load(f, allow_pickle=False)
    assert data["episode.id"].tolist() == [0] * 5 + [1] * 4 + [2] * 2 + [3] * 6
    assert data["episode.lane"].tolist() == [0] * 11 + [1] * 6


@COMPRESSIONS
def test_an_episode_open_at_save_time_loads_back_ended(options):
    def make():
        return ReplayBuffer(WIDTH, ENV, **options)

    rb = make()
    rb.add(**_episode(0, 0, 6))
    rb.add(**_episode(0, 1, 5, ended=False))
    loaded = reloaded(rb, make)
    _assert_same(loaded, rb)
    loaded.add(**_episode(0, 2, 3))  # a new episode: its first stack repeats its first frame
    assert _tags(loaded) == _tags(rb) + [(0, 2, s) for s in range(3)]


def test_loading_ends_the_episode_the_buffer_was_writing():
    source = ReplayBuffer(WIDTH, ENV, **BOTH_STACKED)
    source.add(**_episode(1, 0, 4))
    f = io.BytesIO()
    source.save_transitions(f)
    f.seek(0)
    rb = ReplayBuffer(WIDTH, ENV, **BOTH_STACKED)
    rb.add(**_episode(0, 0, 3, ended=False))
    rb.load_transitions(f)
    rb.add(**_episode(0, 1, 2))
    assert _tags(rb) == [(0, 0, s) for s in range(3)] + [(1, 0, s) for s in range(4)] + [(0, 1, 0), (0, 1, 1)]


# -- fewer lanes, less room ----------------------------------------------------------------------------
def _three_lanes(steps: int, options: dict[str, str] = BOTH_STACKED) -> ReplayBuffer:
    """A buffer of three lanes, writer w given ``steps + 5 * w`` steps."""
    rb = ReplayBuffer(WIDTH * 3, ENV, lanes=3, **options)
    for w, writer in enumerate([rb, rb.episode_writer(), rb.episode_writer()]):
        _fill(writer, w, steps + 5 * w)
    return rb


def test_a_file_of_three_lanes_loads_its_episodes_one_after_another_into_one():
    rb = _three_lanes(20)
    loaded = reloaded(rb, lambda: ReplayBuffer(WIDTH * 3, ENV, **BOTH_STACKED))
    _assert_same(loaded, rb, lanes=False)


@COMPRESSIONS
def test_episodes_loaded_one_after_another_into_a_lane_stay_apart_in_its_next_file(options):
    def make():
        return ReplayBuffer(WIDTH * 3, ENV, **options)  # one lane

    rb = _three_lanes(WIDTH + 3, options)  # every lane wrapped: each starts with an episode cut short
    twice = reloaded(reloaded(rb, make), make)
    _assert_same(twice, rb, lanes=False)


def test_an_episode_cut_short_stays_apart_from_the_one_before_it_in_its_lane():
    def make(lanes: int = 1):
        return ReplayBuffer(WIDTH * 2, ENV, lanes=lanes, stack_compress="obs")

    rb = make(2)
    rb.add(**_episode(0, 0, 6))
    other = rb.episode_writer()
    other.add(**_episode(1, 0, 8))
    members = _members(rb)
    # Lane 0 keeps steps 1 and 2 of its episode, lane 1 steps 3 to 7 of its own: loaded into one lane,
    # the second's depths (3, 4, ...) go on from the first's (1, 2), its older frames between them.
    keep = np.r_[1:3, 9:14]
    for name, value in members.items():
        if name != "metadata.json":
            members[name] = value[keep]
    members["metadata.json"]["count"] = len(keep)
    members["episode.id"] = np.array([0, 0, 1, 1, 1, 1, 1])
    once = make()
    once.load_transitions(damage.file_archive(members))
    twice = reloaded(once, make)
    _assert_same(twice, once)
    assert _tags(twice) == [(0, 0, 1), (0, 0, 2)] + [(1, 0, s) for s in range(3, 8)]


@pytest.mark.parametrize("written", [False, True], ids=["empty", "written"])
def test_a_file_the_free_lanes_cannot_hold_is_refused_and_changes_nothing(written, unchanged):
    f = io.BytesIO()
    _three_lanes(20).save_transitions(f)
    target = ReplayBuffer(WIDTH * 2, ENV, lanes=2, **BOTH_STACKED)
    if written:
        target.add(**_episode(5, 0, 6))
    f.seek(0)
    with unchanged(target), pytest.raises(ValueError, match="no room for the file's episode"):
        target.load_transitions(f)


# -- bad files change nothing ------------------------------------------------------------------------
def _target() -> ReplayBuffer:
    target = ReplayBuffer(WIDTH * 2, ENV, lanes=2, **BOTH_STACKED)
    target.add(**_episode(9, 0, 4, ended=False))
    return target


def _two_episodes() -> ReplayBuffer:
    rb = ReplayBuffer(WIDTH, ENV, **BOTH_STACKED)
    rb.add(**_episode(0, 0, 6))
    rb.add(**_episode(0, 1, 9))
    return rb


def test_a_bad_stack_in_a_later_episode_changes_nothing(unchanged):
    members = _members(_two_episodes())
    members["obs"][10, 0, 0, 0] ^= 1  # step 4 of episode 1: no longer step 3 shifted
    target = _target()
    with unchanged(target), pytest.raises(TransitionFileError, match=r"episode 1 \(rows 6 to 14\): field 'obs'"):
        target.load_transitions(damage.file_archive(members))


def test_a_file_whose_episode_is_in_two_lanes_is_refused_and_changes_nothing(unchanged):
    members = _members(_two_episodes())
    members["episode.lane"][10:] = 1
    target = _target()
    with unchanged(target), pytest.raises(TransitionFileError, match="episode 1 is in lanes 0 and 1"):
        target.load_transitions(damage.file_archive(members))


# -- the order an ordered selector draws in, across lanes ------------------------------------------------
def _queue_of_two_lanes(**options: Any) -> Table:
    return Table(2 * WIDTH, ENV, lanes=2, next_of="obs", **options)


def _queued_in_turns(table: Table) -> list[tuple[int, int, int]]:
    """Two writers add an episode of 6 steps each, a step in turn; returns the tags in the order
    their rows were given the selector (a next_of row is complete once its next step comes)."""
    writers = [table, table.episode_writer()]
    episodes = [_episode(w, 0, 6) for w in range(2)]
    for step in range(6):
        for writer, episode in zip(writers, episodes, strict=True):
            writer.add(**{name: column[step : step + 1] for name, column in episode.items()})
    writers[1].close()
    # A lane's row s completes with its step s + 1, its last two with the done step.
    return [(w, 0, s) for s in range(4) for w in range(2)] + [(w, 0, s) for w in range(2) for s in (4, 5)]


def _drawn(table: Table) -> list[tuple[int, int, int]]:
    return [tuple(tag) for tag in table.sample(table.get_stored_size(), timeout=0)["tag"].tolist()]


def test_a_reloaded_queue_of_two_lanes_hands_out_its_items_in_the_order_they_were_queued():
    with _queue_of_two_lanes(rate_limiter=Queue(2 * WIDTH)) as table:
        queued = _queued_in_turns(table)
        file = saved_file(table)
    with _queue_of_two_lanes(rate_limiter=Queue(2 * WIDTH)) as loaded:
        loaded.load_transitions(file)
        assert _drawn(loaded) == queued


def test_a_fifo_file_of_two_lanes_loads_into_a_table_of_plain_rows_in_its_order():
    with _queue_of_two_lanes(selector="fifo") as table:
        queued = _queued_in_turns(table)
        file, env_dict = saved_file(table), table.get_env_dict()
    with Table(2 * WIDTH, env_dict, selector="fifo") as plain:
        plain.load_transitions(file)
        assert _drawn(plain) == queued


def test_a_format_version_2_file_of_two_lanes_loads_lane_by_lane():
    with _queue_of_two_lanes(selector="fifo") as table:
        queued = _queued_in_turns(table)
        members = damage.as_version_2(_members(table))
    with _queue_of_two_lanes(selector="fifo") as loaded:
        loaded.load_transitions(damage.file_archive(members))
        assert _drawn(loaded) == sorted(queued)


# -- files of format version 1 (no episodes) load as before ---------------------------------------------
def test_a_format_version_1_file_loads_as_the_steps_of_one_episode():
    rb = _two_episodes()
    target = ReplayBuffer(WIDTH, ENV, **BOTH_STACKED)
    assert target.load_transitions(damage.file_archive(damage.as_version_1(_members(rb)))) == 15
    _assert_same(target, rb)


def test_a_format_version_1_file_whose_oldest_stack_reads_unsaved_frames_is_still_refused(unchanged):
    rb = ReplayBuffer(WIDTH, ENV, stack_compress="obs")
    _fill(rb, 0, WIDTH + 5)  # wrapped mid-episode: the oldest stack holds frames of no saved row
    target = ReplayBuffer(WIDTH, ENV, stack_compress="obs")
    with unchanged(target), pytest.raises(ValueError, match="stack_compress"):
        target.load_transitions(damage.file_archive(damage.as_version_1(_members(rb))))

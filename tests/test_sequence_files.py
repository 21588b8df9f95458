"""Sequence buffer files: a save/load round trip gives back every step, in its lane and episode,
and the same sampleable sequences."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import damage  # tests/damage.py: transitions files taken apart and put together
import numpy as np
import pytest
from helpers import TAGGED_STACK_FIELDS, reloaded, tagged_episode

from mpreplay import MPPrioritizedSequenceReplayBuffer, SequenceReplayBuffer
from mpreplay.fileformat import TransitionFileError

ENV = {"tag": {"shape": (3,), "dtype": np.int64}, "done": {}}
STACKED = TAGGED_STACK_FIELDS
COMPRESSIONS = pytest.mark.parametrize(
    "options", [{"stack_compress": "obs"}, {"stack_compress": "obs", "next_of": "obs"}], ids=["stack", "stack+next_of"]
)


def _write(writers: list, lengths: list[list[int]], **kwargs: Any) -> None:
    """Writer w stores episodes of ``lengths[w]`` steps, each ended by its done flag."""
    for w, (writer, ns) in enumerate(zip(writers, lengths, strict=True)):
        for e, n in enumerate(ns):
            writer.add(**tagged_episode(w, e, n, **kwargs))


def _steps(rb: Any) -> list[tuple[int, ...]]:
    """(writer, episode, step, episode_step) of every stored step, in the order listed (lane by lane)."""
    t = rb.get_all_transitions()
    return [(*tag, s) for tag, s in zip(t["tag"].tolist(), t["episode_step"].tolist(), strict=True)]


def _windows(rb: Any, draws: int = 3000) -> set[tuple[int, int, int, int]]:
    """The (writer, episode, first step, real steps) of the sequences ``draws`` draws find,
    each checked to hold consecutive steps of one episode."""
    b = rb.sample(draws)
    out = set()
    for tag, mask, steps in zip(b["tag"], b["mask"], b["episode_step"], strict=True):
        real = tag[mask]
        assert (real[:, :2] == real[0, :2]).all(), f"a sequence mixes episodes: {real.tolist()}"
        assert (np.diff(real[:, 2]) == 1).all() and (steps[mask] == real[:, 2]).all(), real.tolist()
        out.add((int(real[0, 0]), int(real[0, 1]), int(real[0, 2]), int(mask.sum())))
    return out


def _assert_same_steps(loaded: Any, saved: Any) -> None:
    a, b = loaded.get_all_transitions(), saved.get_all_transitions()
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


# -- every step, in its lane and episode; the same sequences -------------------------------------------
LANE_EPISODES = [[9, 7, 5, 14], [6, 12, 3], [10, 4, 8, 9]]  # 35, 21 and 31 steps: lanes of 30 wrap


@pytest.mark.parametrize("lanes", [1, 2, 3])
@pytest.mark.parametrize("cls", [SequenceReplayBuffer, MPPrioritizedSequenceReplayBuffer], ids=["local", "shared"])
def test_a_round_trip_gives_back_every_step_in_its_lane_and_episode(cls, lanes, tmp_path):
    def make():
        return cls(30 * lanes, ENV, length=4, period=2, lanes=lanes, seed=0)

    with make() as rb:
        writers = [rb] + [rb.episode_writer() for _ in range(lanes - 1)]
        _write(writers, LANE_EPISODES[:lanes])
        with reloaded(rb, make, tmp_path / "steps.npz") as loaded:
            _assert_same_steps(loaded, rb)
        for writer in writers[1:]:
            writer.close()


@pytest.mark.parametrize("lanes", [1, 2, 3])
@pytest.mark.parametrize("cls", [SequenceReplayBuffer, MPPrioritizedSequenceReplayBuffer], ids=["local", "shared"])
def test_a_round_trip_gives_back_the_same_sampleable_sequences(cls, lanes, tmp_path):
    def make():
        return cls(30 * lanes, ENV, length=4, period=2, lanes=lanes, seed=0)

    with make() as rb:
        writers = [rb] + [rb.episode_writer() for _ in range(lanes - 1)]
        _write(writers, LANE_EPISODES[:lanes])
        with reloaded(rb, make, tmp_path / "steps.npz") as loaded:
            assert loaded.stats()["sequences"] == rb.stats()["sequences"] == len(_windows(rb))
            assert _windows(loaded) == _windows(rb)
        for writer in writers[1:]:
            writer.close()


@COMPRESSIONS
def test_a_stack_compressed_buffer_loads_back_wherever_its_lane_wrapped(options, tmp_path):
    def make():
        return SequenceReplayBuffer(40, STACKED, length=5, period=3, seed=0, **options)

    for extra in range(40):
        # 40 + extra steps in episodes of 9, 13, 7, 11, ... steps: the lane wraps at every offset of them.
        rng, rb, stored, e = np.random.default_rng(extra), make(), 0, 0
        while stored < 40 + extra:
            n = min([9, 13, 7, 11][e % 4], 40 + extra - stored)
            rb.add(**tagged_episode(0, e, n, rng=rng))
            stored, e = stored + n, e + 1
        loaded = reloaded(rb, make, tmp_path / f"wrapped{extra}.npz")
        _assert_same_steps(loaded, rb)
        assert _windows(loaded, 600) == _windows(rb, 600), f"after {40 + extra} steps"
        assert loaded.stats()["sequences"] == rb.stats()["sequences"], f"after {40 + extra} steps"


# -- no two episodes joined -----------------------------------------------------------------------------
def _continuing_lanes(ended: bool) -> SequenceReplayBuffer:
    """Lane 0 holds steps 0..9 of an episode; lane 1 (20 slots) kept steps 10..15 of another, then 0..13."""
    rb = SequenceReplayBuffer(40, ENV, length=4, period=2, lanes=2, seed=0)
    other = rb.episode_writer()
    rb.add(**tagged_episode(0, 0, 10, ended=ended))
    other.add(**tagged_episode(1, 0, 16))
    other.add(**tagged_episode(1, 1, 14))
    return rb


@pytest.mark.parametrize("ended", [True, False], ids=["ended", "open"])
def test_adjacent_lanes_whose_episode_steps_continue_load_as_separate_episodes(ended, tmp_path):
    rb = _continuing_lanes(ended)
    loaded = reloaded(
        rb, lambda: SequenceReplayBuffer(400, ENV, length=4, period=2, lanes=2, seed=0), tmp_path / "two.npz"
    )
    assert _steps(loaded) == _steps(rb)
    assert _windows(loaded) == _windows(rb)


def test_the_file_numbers_each_steps_episode_and_names_its_lane(tmp_path):
    _continuing_lanes(ended=False).save_transitions(tmp_path / "two.npz")
    data = np.load(tmp_path / "two.npz", allow_pickle=False)
    assert data["episode.lane"].tolist() == [0] * 10 + [1] * 20
    assert data["episode.id"].tolist() == [0] * 10 + [1] * 6 + [2] * 14
    assert data["episode_step"].tolist() == list(range(10)) + list(range(10, 16)) + list(range(14))


def test_episodes_loaded_one_after_another_into_a_lane_stay_apart_in_its_next_file(tmp_path):
    def make():
        return SequenceReplayBuffer(200, ENV, length=4, period=2, seed=0)  # one lane

    rb = _continuing_lanes(ended=False)
    once = reloaded(rb, make, tmp_path / "once.npz")
    twice = reloaded(once, make, tmp_path / "twice.npz")
    assert _steps(twice) == _steps(once) == _steps(rb)
    assert _windows(twice) == _windows(once) == _windows(rb)


# -- episodes open at save time -------------------------------------------------------------------------
def test_an_episode_open_at_save_time_gains_its_padded_end(tmp_path):
    rb = SequenceReplayBuffer(64, ENV, length=4, period=2, seed=0)
    rb.add(**tagged_episode(0, 0, 7, ended=False))  # sequences at steps 0 and 2; steps 4..6 wait for step 7
    loaded = reloaded(rb, lambda: SequenceReplayBuffer(64, ENV, length=4, period=2, seed=0), tmp_path / "open.npz")
    assert _windows(rb) == {(0, 0, 0, 4), (0, 0, 2, 4)}
    assert _windows(loaded) == _windows(rb) | {(0, 0, 4, 3)}


def test_without_pad_end_an_episode_open_at_save_time_keeps_its_sequences(tmp_path):
    def make():
        return SequenceReplayBuffer(64, ENV, length=4, period=2, pad_end=False, seed=0)

    rb = make()
    rb.add(**tagged_episode(0, 0, 7, ended=False))
    assert _windows(reloaded(rb, make, tmp_path / "open.npz")) == _windows(rb) == {(0, 0, 0, 4), (0, 0, 2, 4)}


def test_loading_ends_the_episode_the_buffer_was_writing(tmp_path):
    source = SequenceReplayBuffer(64, ENV, length=2, seed=0)
    source.add(**tagged_episode(1, 0, 4))
    source.save_transitions(tmp_path / "steps.npz")
    rb = SequenceReplayBuffer(64, ENV, length=2, seed=0)
    rb.add(**tagged_episode(0, 0, 3, ended=False))
    rb.load_transitions(tmp_path / "steps.npz")
    rb.add(**tagged_episode(0, 1, 1, ended=False))
    assert _steps(rb) == [
        (0, 0, 0, 0),
        (0, 0, 1, 1),
        (0, 0, 2, 2),
        (1, 0, 0, 0),
        (1, 0, 1, 1),
        (1, 0, 2, 2),
        (1, 0, 3, 3),
        (0, 1, 0, 0),
    ]


# -- fewer lanes, less room ----------------------------------------------------------------------------
def _three_lanes() -> SequenceReplayBuffer:
    rb = SequenceReplayBuffer(90, ENV, length=4, period=2, lanes=3, seed=0)
    _write([rb, rb.episode_writer(), rb.episode_writer()], [[9, 7, 5], [6, 12, 3], [10, 4, 8]])
    return rb


def test_a_file_of_more_lanes_loads_its_episodes_one_after_another_into_fewer(tmp_path):
    rb = _three_lanes()
    loaded = reloaded(rb, lambda: SequenceReplayBuffer(90, ENV, length=4, period=2, seed=0), tmp_path / "three.npz")
    assert sorted(_steps(loaded)) == sorted(_steps(rb))
    assert _windows(loaded) == _windows(rb)


@pytest.mark.parametrize("written", [False, True], ids=["empty", "written"])
def test_a_file_the_free_lanes_cannot_hold_is_refused_and_changes_nothing(written, tmp_path, unchanged):
    _three_lanes().save_transitions(tmp_path / "three.npz")  # 64 steps
    target = SequenceReplayBuffer(40, ENV, length=4, period=2, lanes=2, seed=0)
    if written:
        target.add(**tagged_episode(5, 0, 6))
    with unchanged(target), pytest.raises(ValueError, match="no room for the file's episode"):
        target.load_transitions(tmp_path / "three.npz")


# -- bad files change nothing ----------------------------------------------------------------------------
def _stacked_file(tmp_path: Any) -> tuple[Any, SequenceReplayBuffer]:
    """A stack-compressed buffer's file: episodes of 6, 9 and 5 steps; and a buffer for it holding one."""

    def make():
        return SequenceReplayBuffer(64, STACKED, length=3, stack_compress="obs", seed=0)

    rng, rb = np.random.default_rng(0), make()
    for e, n in enumerate([6, 9, 5]):
        rb.add(**tagged_episode(0, e, n, rng=rng))
    rb.save_transitions(tmp_path / "stacked.npz")
    target = make()
    target.add(**tagged_episode(9, 0, 4, rng=rng))
    return tmp_path / "stacked.npz", target


def test_a_bad_stack_in_a_later_episode_changes_nothing(tmp_path, unchanged):
    path, target = _stacked_file(tmp_path)
    members = damage.file_members(path)
    members["obs"][10, 0, 0, 0] ^= 1  # step 4 of episode 1: no longer step 3 shifted
    with unchanged(target), pytest.raises(TransitionFileError, match=r"episode 1 \(rows 6 to 14\): field 'obs'"):
        target.load_transitions(damage.file_archive(members))


def _without_first_row(members: dict[str, Any]) -> None:
    for name, value in members.items():
        if name != "metadata.json":
            members[name] = value[1:]
    members["metadata.json"]["count"] -= 1


def test_an_episode_kept_from_a_step_younger_than_its_stack_rebuilds_its_repeated_first_frame(tmp_path):
    path, target = _stacked_file(tmp_path)
    members = damage.file_members(path)
    _without_first_row(members)  # episode 0 now starts at step 1: its stack repeats step 0's frame
    target.load_transitions(damage.file_archive(members))
    loaded = target.get_all_transitions()
    np.testing.assert_array_equal(loaded["obs"][4:], members["obs"])
    np.testing.assert_array_equal(loaded["episode_step"][4:], members["episode_step"])


def test_a_young_stack_whose_older_frames_do_not_repeat_the_first_is_refused(tmp_path, unchanged):
    path, target = _stacked_file(tmp_path)
    members = damage.file_members(path)
    _without_first_row(members)
    members["obs"][0, 0, 0, 0] ^= 1  # step 1 of its episode: stack positions 0..2 must be step 0's frame
    with unchanged(target), pytest.raises(TransitionFileError, match="do not repeat the episode's first frame"):
        target.load_transitions(damage.file_archive(members))


def _set(name: str, row: int, value: int) -> Callable[[dict[str, Any]], None]:
    def change(members: dict[str, Any]) -> None:
        members[name][row] = value

    return change


INVALID = {
    "format version 1": (damage.as_version_1, "format version 1 records no episode or lane.*writes format version 3"),
    "episodes not from 0": (lambda m: m.update({"episode.id": m["episode.id"] + 1}), "numbered 0, 1, ..."),
    "an episode number skipped": (_set("episode.id", 29, 4), "row 29 has 4"),
    "an episode in two lanes": (_set("episode.lane", 12, 0), "episode 1 is in lanes 1 and 0"),
    "a lane's rows apart": (
        lambda m: m.update({"episode.lane": np.where(m["episode.id"] == 2, 0, m["episode.lane"])}),
        "the rows of lane 0 are not one after another",
    ),
    "a negative lane": (lambda m: m.update({"episode.lane": m["episode.lane"] - 1}), "expected lanes >= 0"),
    "a step missing": (_set("episode_step", 12, 13), "episode 1 has step 11 then 13"),
    "a negative step": (lambda m: m.update(episode_step=m["episode_step"] - 20), "expected values >= 0"),
    "a done flag inside an episode": (_set("done", 20, 1), r"episode 2 \(rows 16 to 29\): row 4 of 14: its done flag"),
}


@pytest.mark.parametrize("change, message", INVALID.values(), ids=INVALID.keys())
def test_a_file_whose_episodes_are_inconsistent_is_refused_and_changes_nothing(change, message, tmp_path, unchanged):
    _continuing_lanes(ended=False).save_transitions(tmp_path / "two.npz")
    members = damage.file_members(tmp_path / "two.npz")
    change(members)
    target = SequenceReplayBuffer(400, ENV, length=4, period=2, lanes=2, seed=0)
    target.add(**tagged_episode(5, 0, 6))
    with unchanged(target), pytest.raises(TransitionFileError, match=message):
        target.load_transitions(damage.file_archive(members))

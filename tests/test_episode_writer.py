"""ReplayBuffer.episode_writer: several streams of episodes written interleaved from one process."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from mpreplay import MPReplayBuffer, ReplayBuffer

FRAME = (2, 2)
STACK = 3
ENV = {
    "obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "next_obs": {"shape": FRAME + (STACK,), "dtype": np.uint8},
    "rew": {},
    "done": {},
}
KINDS = [ReplayBuffer, MPReplayBuffer]


def _observation(stream: int, episode: int, t: int) -> np.ndarray:
    """Stacked frames of step t (the first frame repeated at the start); frame k holds (stream, episode, k)."""
    frames = [
        np.full(FRAME, 0, np.uint8) + np.array([[stream, episode], [max(0, t - STACK + 1 + i), 7]], np.uint8)
        for i in range(STACK)
    ]
    return np.stack(frames, axis=-1)


def _step(stream: int, episode: int, t: int, length: int) -> dict:
    return dict(
        obs=_observation(stream, episode, t),
        next_obs=_observation(stream, episode, t + 1),
        rew=float(10 * stream + t),
        done=float(t == length - 1),
    )


def _episodes(stream: int) -> list[list[dict]]:
    return [[_step(stream, e, t, length) for t in range(length)] for e, length in enumerate([3, 1, 5, 2])]


def _rows(steps: list[dict]) -> dict[str, np.ndarray]:
    return {k: np.stack([np.asarray(s[k]) for s in steps]) for k in steps[0]}


@pytest.mark.parametrize("kind", KINDS)
def test_a_buffer_without_episode_state_is_its_own_writer(kind):
    with kind(64, ENV) as buffer:
        assert buffer.episode_writer() is buffer


@pytest.mark.parametrize("kind", KINDS)
def test_interleaved_episodes_through_their_own_writers_are_stored_exactly(kind):
    with kind(4 * 64, ENV, next_of="obs", stack_compress="obs", lanes=2) as buffer:
        writers = [buffer.episode_writer(), buffer.episode_writer()]
        streams = [[s for episode in _episodes(i) for s in episode] for i in range(2)]
        for a, b in zip(*streams, strict=True):  # one step of each stream in turn
            writers[0].add(**a)
            writers[1].add(**b)
        stored = buffer.get_all_transitions()
        for w in writers:
            w.close()
    with ReplayBuffer(64, ENV) as plain:  # the same steps, one stream after the other
        plain.add(**_rows(streams[0] + streams[1]))
        written = plain.get_all_transitions()
    stream_of = stored["obs"][:, 0, 0, 0]
    order = np.argsort(stream_of, kind="stable")  # lane by lane: each stream's steps in order
    assert {k: v[order].tobytes() for k, v in stored.items()} == {k: v.tobytes() for k, v in written.items()}


def test_each_writer_of_a_folding_buffer_folds_its_own_episodes():
    env = {"obs": {}, "rew": {}, "next_obs": {}, "done": {}}
    with ReplayBuffer(64, env, nstep={"size": 2, "gamma": 0.5}) as buffer:
        a, b = buffer.episode_writer(), buffer.episode_writer()
        for t in range(3):
            a.add(obs=t, rew=1.0, next_obs=t + 1, done=0.0)
            b.add(obs=100 + t, rew=2.0, next_obs=101 + t, done=float(t == 2))
        stored = buffer.get_all_transitions()
    got = {
        float(o): (float(r), float(n)) for o, r, n in zip(stored["obs"], stored["rew"], stored["next_obs"], strict=True)
    }
    assert got == {0.0: (1.5, 2.0), 1.0: (1.5, 3.0), 100.0: (3.0, 102.0), 101.0: (3.0, 103.0), 102.0: (2.0, 103.0)}


@pytest.mark.parametrize("kind", KINDS)
def test_more_writers_than_lanes_are_told_to_create_more_lanes(kind):
    with kind(2 * 64, ENV, next_of="obs", lanes=2) as buffer:
        writers = [buffer.episode_writer() for _ in range(3)]
        for i, w in enumerate(writers[:2]):
            w.add(**_step(i, 0, 0, 1))
        with pytest.raises(ValueError, match="lanes="):
            writers[2].add(**_step(2, 0, 0, 1))


@pytest.mark.parametrize("kind", KINDS)
def test_closing_a_writer_gives_its_lane_back_and_leaves_the_buffer_open(kind):
    with kind(64, ENV, next_of="obs") as buffer:
        first = buffer.episode_writer()
        first.add(**_step(0, 0, 0, 1))
        first.close()
        second = buffer.episode_writer()
        second.add(**_step(1, 0, 0, 1))
        assert buffer.get_stored_size() == 2


@pytest.mark.parametrize("kind", KINDS)
def test_a_new_writer_takes_a_lane_never_written_before_one_a_closed_writer_filled(kind):
    with kind(64, ENV, next_of="obs", lanes=2) as buffer:
        first = buffer.episode_writer()
        for step in _episodes(0)[0]:
            first.add(**step)
        first.close()
        second = buffer.episode_writer()
        for step in _episodes(1)[0]:
            second.add(**step)
        rows = buffer.get_all_transitions(indexes=True)
        by_stream = {stream: set(rows["indexes"][rows["rew"] // 10 == stream] // 32) for stream in (0, 1)}
        assert by_stream == {0: {0}, 1: {1}}  # one lane each: the second did not write after the first's rows


@pytest.mark.parametrize("kind", KINDS)
def test_a_writer_collected_without_close_gives_its_lane_back(kind):
    with kind(64, ENV, next_of="obs") as buffer:
        first = buffer.episode_writer()
        first.add(**_step(0, 0, 0, 1))
        del first
        gc.collect()
        buffer.episode_writer().add(**_step(1, 0, 0, 1))
        assert buffer.get_stored_size() == 2


def test_closing_the_buffer_closes_its_writers():
    buffer = ReplayBuffer(64, ENV, next_of="obs")
    writer = buffer.episode_writer()
    buffer.close()
    with pytest.raises(Exception, match="closed"):
        writer.add(**_step(0, 0, 0, 1))

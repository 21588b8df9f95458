"""Smoke tests of ``mpreplay bench apex`` and its recorded episodes: it runs on real Breakout frames and
reports every table; no timing is asserted."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch", reason="bench apex runs the demo's actor, a torch network")
pytest.importorskip("gymnasium")
pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from mpreplay import ReplayBuffer
from mpreplay.bench import apex
from mpreplay.bench.apex_episodes import chunks, record
from mpreplay.demo.apex_atari import replay_fields


@pytest.fixture(scope="module")
def episodes():
    return record(300, num_envs=2, seed=1)


def test_recorded_episodes_hold_a_frame_more_than_their_steps(episodes):
    assert episodes and all(e.frames.shape == (len(e) + 1, 84, 84) for e in episodes)


def test_an_episode_rows_go_into_a_compressed_buffer_in_the_chunks_an_actor_writes(episodes):
    buffer = ReplayBuffer(2_000, replay_fields(), next_of="obs", stack_compress="obs")
    for episode in episodes:
        for start, stop in chunks(len(episode), 5):
            buffer.add(**episode.rows(start, stop))
        buffer.on_episode_end()
    assert buffer.get_stored_size() == sum(len(e) for e in episodes)


def test_the_last_chunk_of_an_episode_holds_its_last_three_rows():
    assert chunks(10, 1)[-1] == (7, 10) and chunks(33, 32) == [(0, 33)] and chunks(40, 32) == [(0, 32), (32, 40)]


def test_a_row_bootstraps_from_the_stack_three_steps_on(episodes):
    episode = max(episodes, key=len)
    rows = episode.rows(0, 1)
    np.testing.assert_array_equal(rows["next_obs"][0, :, :, -1], episode.frames[3])
    np.testing.assert_allclose(rows["discount"], [0.99**3])


@pytest.mark.timeout(600)
def test_a_quick_run_prints_every_table_and_the_targets(capsys):
    assert apex.main(["--quick", "--writers", "1"]) == 0
    out = capsys.readouterr().out
    for title in ("Memory: real Breakout episodes", "Actor: 4 Breakout games", "Learner: sample", "Lock: writers"):
        assert title in out, title
    assert "Targets (this run)" in out and "one learner's lock serves" in out

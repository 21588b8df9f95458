"""mpreplay demo --env atari: the Atari task (lives, frame stacks), real emulator frames through the
compressed buffer, bad input on that path, and a smoke run through every stage.

Needs ale-py (its ROMs) and opencv-python-headless: the 'atari' extra.  The smoke run is short and
learning is not asserted (docs/demo.md has the long run).  The demo starts its processes from a
forkserver, so like tests/test_demo.py these do not run under "fork".
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")
pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from demo_runs import Run, carried_over, kill_and_resume, run_demo, summary_of  # tests/demo_runs.py
from helpers import segments_of

from mpreplay import PrioritizedReplayBuffer, ReplayBuffer, cli
from mpreplay.demo.apex_atari import StackedSteps, initial_priorities, replay_fields, stored
from mpreplay.demo.atari import AtariConfig, FrameStacks, game, random_returns, vector_env
from mpreplay.vector_env import VectorWriter

SEED = 3


def zero_q(stacks: np.ndarray) -> np.ndarray:
    return np.zeros((len(stacks), 4), np.float32)


def frames_of(values: list[int]) -> np.ndarray:
    """One 84x84 frame per sub-environment, each filled with its value."""
    return np.stack([np.full((84, 84), v, np.uint8) for v in values])


# ------------------------------------------------------------------ lives


def play_until(env, stop, steps: int = 5_000):
    """Step random actions until ``stop(terminated, truncated, info)``; the last step's results."""
    rng = np.random.default_rng(SEED)
    for _ in range(steps):
        result = env.step(int(rng.integers(env.action_space.n)))
        if stop(*result[2:]):
            return result
    raise AssertionError(f"no such step in {steps}")


def test_with_life_loss_a_lost_life_ends_the_episode_but_not_the_game():
    env = game(AtariConfig(life_loss=True))
    _, info = env.reset(seed=SEED)
    _, _, terminated, _, info = play_until(env, lambda term, trunc, info: term)
    assert (terminated, info["game_over"], info["lives"]) == (True, False, 4)


def test_the_reset_after_a_lost_life_goes_on_with_the_same_game():
    env = game(AtariConfig(life_loss=True))
    env.reset(seed=SEED)
    _, _, _, _, info = play_until(env, lambda term, trunc, info: term)
    frame = info["frame_number"]
    _, info = env.reset()
    assert info["lives"] == 4 and info["frame_number"] > frame


def test_without_life_loss_only_the_game_over_ends_an_episode():
    env = game(AtariConfig(life_loss=False))
    env.reset(seed=SEED)
    _, _, _, _, info = play_until(env, lambda term, trunc, info: term or trunc)
    assert (info["game_over"], info["lives"]) == (True, 0)


def test_random_returns_are_whole_games():
    returns = random_returns(AtariConfig(), 2, seed=SEED)
    assert len(returns) == 2 and (returns >= 0).all()


# ------------------------------------------------------------------ frame stacks


def test_a_new_episode_stack_repeats_its_first_frame():
    stacks = FrameStacks(2)
    stacks.restart(frames_of([7, 9]))
    assert stacks.stacks[:, 0, 0].tolist() == [[7, 7, 7, 7], [9, 9, 9, 9]]


def test_a_push_shifts_in_the_newest_frame_last_and_restarts_only_where_asked():
    stacks = FrameStacks(2)
    stacks.restart(frames_of([1, 1]))
    stacks.push(frames_of([2, 2]))
    stacks.push(frames_of([3, 8]), restart=np.array([False, True]))
    assert stacks.stacks[:, 0, 0].tolist() == [[1, 1, 2, 3], [8, 8, 8, 8]]


def test_read_only_and_strided_frames_are_stacked_as_their_values():
    stacks, reference = FrameStacks(2), FrameStacks(2)
    frames = frames_of([4, 5])
    odd = np.asfortranarray(frames)[:, ::-1].copy()[:, ::-1]  # a negative-stride view of the same values
    odd.flags.writeable = False
    stacks.restart(odd)
    reference.restart(frames)
    assert np.array_equal(stacks.stacks, reference.stacks)


@pytest.mark.parametrize(
    "bad", [np.zeros((2, 84, 84), np.float32), np.zeros((2, 84, 83), np.uint8), np.zeros((3, 84, 84), np.uint8)]
)
def test_a_frame_of_another_shape_or_dtype_is_refused_naming_it_and_changes_nothing(bad):
    stacks = FrameStacks(2)
    stacks.restart(frames_of([1, 2]))
    before = stacks.frames.copy()
    with pytest.raises(ValueError, match="frames: expected uint8 of shape"):
        stacks.push(bad)
    assert np.array_equal(stacks.frames, before)


# ------------------------------------------------------------------ priorities


def test_initial_priorities_are_the_rows_td_errors_from_the_q_values_they_carry():
    rows = {
        "obs_q": np.array([[1.0, 2.0], [0.5, 0.0]], np.float32),
        "next_obs_q": np.array([[3.0, 4.0], [9.0, 9.0]], np.float32),
        "act": np.array([1, 0]),
        "rew": np.array([1.0, 2.0], np.float32),
        "discount": np.array([0.5, 0.25], np.float32),
        "done": np.array([0.0, 1.0], np.float32),
    }
    np.testing.assert_allclose(initial_priorities(rows), [abs(1 + 0.5 * 4 - 2), abs(2 - 0.5)])


# ------------------------------------------------------------------ real frames through the buffer


def compressed_buffer(capacity: int, lanes: int, **options) -> ReplayBuffer:
    return PrioritizedReplayBuffer(
        capacity, replay_fields(), next_of="obs", stack_compress="obs", lanes=lanes, **options
    )


def play(num_envs: int, steps: int) -> list:
    """``steps`` steps of real Breakout (random actions, an episode per life) as the actor makes
    them; every step's batch of stored rows."""
    env = vector_env(AtariConfig(envs_per_actor=num_envs))
    rng = np.random.default_rng(SEED)
    played = StackedSteps(env, zero_q, nstep=3, gamma=0.99)
    played.reset(SEED)
    batches = []
    for _ in range(steps):
        batch, *_ = played.step(rng.integers(4, size=num_envs))
        batches.append(stored(batch))
    env.close()
    return batches


@pytest.fixture(scope="module")
def breakout() -> list:
    return play(num_envs=2, steps=400)


def row_keys(transitions: dict[str, np.ndarray]) -> collections.Counter:
    """Each transition's bytes, every field together, counted."""
    fields = sorted(replay_fields())
    rows = len(transitions["act"])
    return collections.Counter(b"".join(transitions[k][i].tobytes() for k in fields) for i in range(rows))


def test_real_frames_come_back_from_the_compressed_buffer_as_the_actor_stacked_them(breakout):
    compressed = compressed_buffer(2_000, lanes=2)
    plain = ReplayBuffer(2_000, replay_fields())
    with VectorWriter(compressed, 2) as writer:
        for batch in breakout:
            writer.add(batch, np.ones(len(batch)))
            if len(batch):
                plain.add(**batch.rows)
    assert sum(len(batch.ended) for batch in breakout) >= 2  # lives lost: stacks restart inside the run
    given, kept = row_keys(plain.get_all_transitions()), row_keys(compressed.get_all_transitions())
    # Byte for byte what went in, but the newest rows of each open episode, whose next stack is 3
    # steps ahead: complete only once it is stored.
    assert not kept - given
    assert 0 <= sum(given.values()) - sum(kept.values()) <= 3 * 2


# ------------------------------------------------------------------ bad input on this path


def first_rows(breakout, k: int) -> dict[str, np.ndarray]:
    batch = next(b for b in breakout if len(b) and len(set(b.envs.tolist())) == 2)
    return {key: value[batch.envs == 0][:k] for key, value in batch.rows.items()}


def shifted(stacks: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """``stacks`` with ``frame`` pushed in last."""
    return np.concatenate([stacks[..., 1:], np.broadcast_to(frame[..., None], stacks[..., :1].shape)], -1)


def one_step(obs: np.ndarray, frame: np.ndarray, done: bool) -> dict[str, np.ndarray]:
    """A one-step row from stack ``obs`` to ``obs`` with ``frame`` pushed in."""
    row = {"obs": obs, "act": np.zeros(1, np.int64), "rew": np.zeros(1, np.float32)}
    return dict(row, next_obs=shifted(obs, frame), done=np.full(1, done, np.float32), discount=np.ones(1, np.float32))


def distinct_frames(breakout, n: int) -> list[np.ndarray]:
    """``n`` real frames, each unlike the others (the newest frames of rows far apart in the game)."""
    rows = np.concatenate([b.rows["next_obs"][:, :, :, -1] for b in breakout if len(b)])
    frames = [rows[i] for i in np.linspace(0, len(rows) - 1, n).astype(int)]
    assert all(not np.array_equal(a, b) for i, a in enumerate(frames) for b in frames[i + 1 :])
    return frames


def test_a_stack_that_crosses_an_episode_boundary_is_refused_naming_the_field(breakout, unchanged):
    buffer = compressed_buffer(500, lanes=1)
    a, b, c, d = distinct_frames(breakout, 4)
    ending = one_step(np.stack([a] * 4, -1)[None], b, done=True)
    buffer.add(**ending, priorities=np.ones(1))
    # The next episode's first stack still holds the ended episode's frames: not restarted.
    crossing = one_step(shifted(ending["next_obs"], c), d, done=False)
    with unchanged(buffer), pytest.raises(ValueError, match="field 'obs'"):
        buffer.add(**crossing, priorities=np.ones(1))


@pytest.mark.parametrize("dtype, shape", [(np.float32, (84, 84, 4)), (np.uint8, (84, 84, 3))], ids=["float", "3 deep"])
def test_a_stack_of_another_dtype_or_shape_is_refused_naming_the_field(breakout, unchanged, dtype, shape):
    buffer = compressed_buffer(500, lanes=1)
    rows = first_rows(breakout, 1)
    bad = dict(rows, obs=np.zeros((1, *shape), dtype))
    with unchanged(buffer), pytest.raises((TypeError, ValueError), match="field 'obs'"):
        buffer.add(**bad, priorities=np.ones(1))


def test_read_only_strided_stacks_are_stored_as_their_values(breakout):
    rows = first_rows(breakout, 4)
    odd = {key: np.asfortranarray(value) for key, value in rows.items()}
    for value in odd.values():
        value.flags.writeable = False
    a, b = compressed_buffer(500, lanes=1), compressed_buffer(500, lanes=1)
    a.add(**rows, priorities=np.ones(len(rows["act"])))
    b.add(**odd, priorities=np.ones(len(rows["act"])))
    got_a, got_b = a.get_all_transitions(), b.get_all_transitions()
    assert all(np.array_equal(got_a[key], got_b[key]) for key in replay_fields())


# ------------------------------------------------------------------ the demo


def test_the_atari_task_is_refused_to_an_agent_that_does_not_play_it(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--agent", "r2d2", "--env", "atari"])
    assert exit_info.value.code == 2
    assert "--env atari" in capsys.readouterr().err


@pytest.fixture(scope="module")
def atari_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """``mpreplay demo --env atari`` for 45 s in a subprocess, once for the tests below."""
    # One actor of two games: a game ends within seconds even on a busy machine (45 s: the processes
    # import torch, gymnasium and ale-py first, which takes a loaded machine tens of seconds).
    argv = ["--env", "atari", "--seconds", "45", "--actors", "1", "--envs-per-actor", "2", "--learning-starts", "200"]
    argv += ["--publish-every", "2", "--random-games", "2", "--plain"]
    return run_demo(argv, tmp_path_factory.mktemp("demo-atari"), timeout=280)


@pytest.mark.timeout(300)
def test_an_atari_run_moves_real_frames_through_every_stage(atari_run: Run):
    assert atari_run.returncode == 0, atari_run.stderr
    summary = summary_of(atari_run)
    stages = ("env_steps", "episodes", "inserts", "samples", "learner_steps", "priority_updates", "weights_published")
    assert {key: summary[key] > 0 for key in stages} == dict.fromkeys(stages, True), summary
    assert summary["env"].startswith("ALE/Breakout-v5") and summary["reason"] == "timeout"


@pytest.mark.timeout(300)
def test_an_atari_run_writes_its_learning_curve_and_leaves_no_segment(atari_run: Run):
    assert (atari_run.out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((atari_run.out / "episodes.json").read_text())["ret"]
    assert segments_of(atari_run.pid) == set()


@pytest.mark.timeout(300)
def test_an_atari_run_puts_the_random_baseline_in_its_summary(atari_run: Run):
    assert summary_of(atari_run)["random_policy"]["games"] == 2


# ------------------------------------------------------------------ checkpoint and resume


@pytest.mark.timeout(600)
def test_an_atari_run_killed_whole_resumes_its_compressed_replay_and_learner(tmp_path):
    """A small Atari run (a replay of 3,000 transitions) checkpointing every 3 s, SIGKILLed with
    its processes after a checkpoint of 4 learner steps, then resumed for 25 s."""
    argv = ["--env", "atari", "--seconds", "300", "--actors", "1", "--envs-per-actor", "2", "--capacity", "3000"]
    argv += ["--learning-starts", "200", "--publish-every", "2", "--checkpoint-every", "3", "--plain"]
    resumed = kill_and_resume(argv, tmp_path, learner_steps=4, seconds=25, timeout=280)
    summary = carried_over(resumed)
    assert summary["env"].startswith("ALE/Breakout-v5") and summary["config"]["capacity"] == 3000
    assert resumed.state["counters"]["learner_steps"] >= 4

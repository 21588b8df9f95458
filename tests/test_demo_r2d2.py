"""mpreplay demo --agent r2d2: the pieces with logic (n-step targets inside masked sequences, the burn-in
split, the velocity-hiding wrapper, the solved rule) and a smoke run through every stage.

The smoke run is short and learning is not asserted (see the README for full runs).  The demo starts
its processes from a forkserver, so like tests/test_demo.py these do not run under "fork".
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
gym = pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")

from demo_runs import carried_over, kill_and_resume  # tests/demo_runs.py
from helpers import segments_of

from mpreplay import cli
from mpreplay.demo.r2d2 import R2D2_SOLVED_RETURN, R2D2Config, nstep_targets, trained_steps
from mpreplay.demo.task import POSITIONS, WINDOW, Config, hide_velocity, solve_point, vector_env

GAMMA = 0.5


def targets(rew, done, mask, bootstrap, n):
    """nstep_targets over one sequence given as lists; returns (y, defined) as lists."""
    y, defined = nstep_targets(
        torch.tensor([rew], dtype=torch.float64),
        torch.tensor([done]),
        torch.tensor([mask]),
        torch.tensor([bootstrap], dtype=torch.float64),
        GAMMA,
        n,
    )
    return y[0].tolist(), defined[0].tolist()


# -------------------------------------------------------------- n-step targets


def test_a_step_whose_window_stays_inside_the_sequence_bootstraps_n_steps_later():
    y, defined = targets([1, 2, 4, 8, 16], [False] * 5, [True] * 5, [100, 200, 300, 400, 500], n=2)
    assert y[:3] == [1 + GAMMA * 2 + GAMMA**2 * 300, 2 + GAMMA * 4 + GAMMA**2 * 400, 4 + GAMMA * 8 + GAMMA**2 * 500]
    assert defined[:3] == [True, True, True]


def test_a_step_whose_window_leaves_the_sequence_has_no_target():
    _, defined = targets([1, 2, 4, 8, 16], [False] * 5, [True] * 5, [0] * 5, n=2)
    assert defined[3:] == [False, False]


def test_the_sum_stops_at_a_terminal_step_without_bootstrapping():
    y, defined = targets(
        [1, 2, 4, 0, 0],
        [False, False, True, False, False],
        [True, True, True, False, False],
        [100, 200, 300, 400, 500],
        n=3,
    )
    assert y[:3] == [1 + GAMMA * 2 + GAMMA**2 * 4, 2 + GAMMA * 4, 4]
    assert defined == [True, True, True, False, False]


def test_no_reward_or_bootstrap_past_a_terminal_step_counts_even_if_steps_follow_it():
    # The buffer pads after an episode's end; the targets do not rely on it.
    y, defined = targets([1, 2, 4, 8], [False, True, False, False], [True] * 4, [100, 200, 300, 400], n=3)
    assert y[:2] == [1 + GAMMA * 2, 2]
    assert defined[:2] == [True, True]


def test_padding_steps_have_no_target_and_add_nothing():
    rew, mask = [1, 1, 5, 5], [True, True, False, False]  # padding with values a bug would pick up
    y, defined = targets(rew, [False] * 4, mask, [100] * 4, n=1)
    assert defined == [True, False, False, False]
    assert y[0] == 1 + GAMMA * 100


def test_a_window_reaching_padding_after_a_truncation_has_no_target():
    # An episode cut by its time limit: no terminal step, padding after its last step.
    _, defined = targets([1, 1, 1, 0], [False] * 4, [True, True, True, False], [7] * 4, n=2)
    assert defined == [True, False, False, False]


def test_one_step_targets_are_reward_plus_discounted_bootstrap():
    y, defined = targets([1, 2, 3], [False] * 3, [True] * 3, [10, 20, 30], n=1)
    assert y[:2] == [1 + GAMMA * 20, 2 + GAMMA * 30]
    assert defined == [True, True, False]


# -------------------------------------------------------------- burn-in split


def test_the_burn_in_steps_of_a_sequence_inside_an_episode_are_not_trained_on():
    first = np.zeros((1, 6), bool)
    assert trained_steps(first, 2).tolist() == [[False, False, True, True, True, True]]


def test_a_sequence_starting_its_episode_is_trained_on_from_its_first_step():
    first = np.zeros((2, 4), bool)
    first[1, 0] = True
    assert trained_steps(first, 3).tolist() == [[False, False, False, True], [True] * 4]


def test_an_episode_starting_inside_a_sequence_does_not_lift_its_burn_in():
    first = np.zeros((1, 4), bool)
    first[0, 1] = True  # only the sequence's own first step counts
    assert trained_steps(first, 2).tolist() == [[False, False, True, True]]


def test_no_burn_in_trains_every_step():
    assert trained_steps(np.zeros((1, 3), bool), 0).tolist() == [[True] * 3]


def test_the_burn_in_split_rejects_a_flat_array_naming_it():
    with pytest.raises(ValueError, match="first"):
        trained_steps(np.zeros(4, bool), 1)


# -------------------------------------------------------------- hidden velocities


def test_hide_velocity_keeps_the_cart_position_and_the_pole_angle():
    env = hide_velocity(gym.make("CartPole-v1"))
    obs, _ = env.reset(seed=3)
    seen = [obs]
    for _ in range(5):
        obs = env.step(1)[0]
        seen.append(obs)
    state = np.asarray(env.unwrapped.state, dtype=np.float32)
    np.testing.assert_array_equal(seen[-1], state[list(POSITIONS)])
    assert all(o.shape == (2,) for o in seen)


def test_hide_velocity_declares_the_kept_bounds():
    inner = gym.make("CartPole-v1")
    env = hide_velocity(inner)
    assert env.observation_space.shape == (2,)
    np.testing.assert_array_equal(env.observation_space.high, inner.observation_space.high[list(POSITIONS)])


def test_the_ape_x_demo_hides_the_velocities_when_asked():
    config = Config(hide_velocity=True, envs_per_actor=3)
    env = vector_env(config)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 2) and config.obs_dim == 2


def test_the_r2d2_demo_always_hides_the_velocities():
    assert R2D2Config().obs_dim == 2


# -------------------------------------------------------------- the solved rule


def episodes(greedy_returns, explorer_return=500.0):
    """An episode log alternating greedy (ε = 0) episodes with the given returns and explorers' ones."""
    n = len(greedy_returns)
    return {
        "time": list(range(2 * n)),
        "env_steps": [100 * i for i in range(2 * n)],
        "ret": [r for g in greedy_returns for r in (g, explorer_return)],
        "rank": [0] * (2 * n),
        "eps": [0.0, 0.4] * n,
    }


def test_r2d2_is_solved_when_20_greedy_episodes_average_400():
    returns = [380.0] * (WINDOW - 1) + [380.0 + 20 * WINDOW]  # the mean reaches 400 at the last one
    assert solve_point(episodes(returns), R2D2_SOLVED_RETURN) == (2 * WINDOW - 2, 100 * (2 * WINDOW - 2))


def test_r2d2_is_not_solved_by_a_greedy_mean_just_below_400_whatever_the_explorers_score():
    returns = [380.0] * (WINDOW - 1) + [380.0 + 20 * WINDOW - 1]
    assert solve_point(episodes(returns, explorer_return=500.0), R2D2_SOLVED_RETURN) is None


def test_fewer_than_20_greedy_episodes_never_solve():
    assert solve_point(episodes([500.0] * (WINDOW - 1)), R2D2_SOLVED_RETURN) is None


# -------------------------------------------------------------- the command line


def test_the_demo_command_shows_the_r2d2_flags(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--agent", "r2d2", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "--burn-in" in out and "--period" in out


def test_a_burn_in_as_long_as_the_sequence_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--agent", "r2d2", "--length", "10", "--burn-in", "10"])
    assert exit_info.value.code == 2
    assert "--burn-in" in capsys.readouterr().err


def test_too_small_a_capacity_for_one_sequence_per_lane_is_refused_naming_the_flag(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--agent", "r2d2", "--capacity", "100", "--learning-starts", "10"])
    assert exit_info.value.code == 2
    assert "--capacity" in capsys.readouterr().err


def test_the_ape_x_flags_are_not_offered_to_r2d2(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--agent", "r2d2", "--hide-velocity"])
    assert exit_info.value.code == 2
    assert "--hide-velocity" in capsys.readouterr().err


# -------------------------------------------------------------- a smoke run


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``mpreplay demo --agent r2d2 --seconds 20`` in a subprocess, once for the tests below."""
    out = tmp_path_factory.mktemp("r2d2")
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpreplay", "demo", "--agent", "r2d2", "--seconds", "20", "--plain", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _, stderr = proc.communicate(timeout=150)
    finally:
        proc.kill()
    return {"returncode": proc.returncode, "stderr": stderr, "pid": proc.pid, "out": Path(out)}


@pytest.mark.timeout(180)
def test_a_timed_r2d2_run_exits_0(smoke_run: dict):
    assert smoke_run["returncode"] == 0, smoke_run["stderr"]


@pytest.mark.timeout(180)
def test_a_timed_r2d2_run_moves_data_through_every_stage(smoke_run: dict):
    summary = json.loads((smoke_run["out"] / "summary.json").read_text())
    stages = ("env_steps", "episodes", "inserts", "samples", "learner_steps", "priority_updates", "weights_published")
    assert {key: summary[key] > 0 for key in stages} == dict.fromkeys(stages, True), summary
    assert (summary["agent"], summary["solved_at"], summary["env"]) == (
        "R2D2",
        R2D2_SOLVED_RETURN,
        "CartPole-v1, velocities hidden",
    )


@pytest.mark.timeout(180)
def test_a_timed_r2d2_run_writes_the_learning_curve(smoke_run: dict):
    assert (smoke_run["out"] / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(180)
def test_a_timed_r2d2_run_leaves_no_segment_behind(smoke_run: dict):
    assert segments_of(smoke_run["pid"]) == set()


@pytest.mark.timeout(400)
def test_an_r2d2_run_killed_whole_resumes_its_sequence_replay_and_learner(tmp_path: Path):
    argv = ["--agent", "r2d2", "--seconds", "300", "--checkpoint-every", "2", "--plain"]
    resumed = kill_and_resume(argv, tmp_path, learner_steps=20, seconds=12, timeout=150)
    summary = carried_over(resumed)
    assert summary["agent"] == "R2D2" and summary["config"]["length"] == R2D2Config().length
    assert resumed.state["counters"]["learner_steps"] >= 20

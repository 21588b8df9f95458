"""``bench apex``'s actor beside its floor and its peers (mpreplay.bench.apex_peers, peer_actor): the
script replayed from recorded episodes, each contender's loop run small, the targets' rows.

Reverb and TorchRL run only where ``MPREPLAY_PEERS`` names the peers' venvs (they are gigabytes);
elsewhere they are reported unavailable with the reason.  No timing is judged.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import table_cells

pytest.importorskip("gymnasium", reason="bench apex's episodes are the Atari demo's (the atari extra)")

from mpreplay.bench import apex_peers, peers
from mpreplay.bench.apex_episodes import Episode
from mpreplay.bench.peer_actor import save_script

pytestmark = pytest.mark.timeout(300)

_VENV = os.environ.get(peers.ENV_VAR)


def _episode(steps: int, terminated: bool, seed: int) -> Episode:
    rng = np.random.default_rng(seed)
    return Episode(
        rng.integers(0, 256, (steps + 1, 84, 84), dtype=np.uint8),
        rng.integers(0, 4, steps).astype(np.int64),
        rng.random(steps).astype(np.float32),
        terminated,
    )


@pytest.fixture(scope="module")
def episodes():
    return [_episode(n, n % 2 == 0, n) for n in (7, 2, 12, 5, 9)]


@pytest.fixture
def script_dir(tmp_path, episodes):
    save_script(str(tmp_path), apex_peers.script(episodes, games=4, steps=40))
    return str(tmp_path)


def test_the_script_starts_each_game_at_the_first_frame_of_its_own_episode(episodes):
    script = apex_peers.script(episodes, games=3, steps=10)
    for g in range(3):
        np.testing.assert_array_equal(script["frames"][0, g], episodes[g].frames[0])


def test_the_script_resets_a_game_the_step_after_its_episode_ended(episodes):
    script = apex_peers.script(episodes, games=4, steps=40)
    np.testing.assert_array_equal(script["restart"][1:], script["ended"][:-1])
    assert not (script["restart"] & script["ended"]).any()


def test_the_script_plays_a_game_its_episodes_in_turn_with_their_actions_and_rewards(episodes):
    script = apex_peers.script(episodes, games=2, steps=30)
    first, second = episodes[0], episodes[2]  # game 0 plays episodes 0, 2, 4, ...
    np.testing.assert_array_equal(script["act"][1 : len(first) + 1, 0], first.act)
    np.testing.assert_array_equal(script["rew"][1 : len(first) + 1, 0], first.rew)
    assert script["terminated"][len(first), 0] == first.terminated
    np.testing.assert_array_equal(script["frames"][len(first) + 1, 0], second.frames[0])


def test_a_script_needs_an_episode():
    with pytest.raises(ValueError, match="episodes: expected at least one"):
        apex_peers.script([], games=4, steps=10)


@pytest.mark.usefixtures("no_peers_venv")
def test_without_the_peers_venvs_reverb_and_torchrl_are_unavailable_saying_how_to_make_them(episodes, capsys):
    pytest.importorskip("gymnasium", reason="mpreplay's contender runs the demo actor's folder")
    result = apex_peers.actor_peers(episodes, None, capacity=2_000, steps=40, rounds=1)
    assert set(result.unavailable) == {"reverb", "torchrl"}
    assert all("--setup DIR" in reason for reason in result.unavailable.values())
    first_cells = {cells[0] for cells in table_cells(capsys.readouterr().out) if cells}
    assert {"reverb", "torchrl"} <= first_cells


@pytest.mark.usefixtures("no_peers_venv")
def test_the_floor_mpreplay_and_cpprb_each_take_the_scripts_env_steps(episodes):
    pytest.importorskip("gymnasium", reason="mpreplay's contender runs the demo actor's folder")
    pytest.importorskip("cpprb")
    result = apex_peers.actor_peers(episodes, None, capacity=2_000, steps=40, rounds=2)
    script = apex_peers.script(episodes, games=4, steps=40)
    assert result.env_steps == int((~script["restart"][1:]).sum())
    assert {"floor", "mpreplay", "cpprb"} <= set(result.micros)
    assert all(us > 0 for us in result.micros.values())
    assert set(result.parts) == {"n-step fold", "rows merged, initial priorities", "add + episode ends"}


def test_targets_divide_each_peer_by_mpreplay_and_mpreplay_by_the_floor():
    result = apex_peers.ActorPeers(
        micros={"floor": 2.0, "mpreplay": 20.0, "cpprb": 400.0, "reverb": 100.0},
        unavailable={"torchrl": "no venv"},
    )
    rows = {row[0]: row[1:] for row in apex_peers.targets(result)}
    assert rows["actor: replay path per env step (recorded steps)"] == ["20.0 µs", "<= 25 µs", "yes"]
    assert rows["actor: replay path ÷ the floor (same run)"] == ["10.0x", "<= 10x", "yes"]
    assert rows["actor: cpprb's path ÷ mpreplay's"] == ["20.0x", ">= 10x", "yes"]
    assert rows["actor: reverb's path ÷ mpreplay's"] == ["5.0x", ">= 10x", "no"]
    assert rows["actor: torchrl's path ÷ mpreplay's"] == ["unavailable", ">= 10x", "not measured"]


def test_the_floors_segment_is_gone_once_its_worker_closes(script_dir):
    before = set(os.listdir("/dev/shm"))
    worker = peers.launch(["floor"], None)["floor"]
    assert isinstance(worker, peers.PeerProcess), worker
    try:
        worker.request("actor_build", script=script_dir, capacity=1_000)
        assert worker.request("actor_run")["env_steps"] > 0
    finally:
        worker.close()
    assert set(os.listdir("/dev/shm")) - before == set()


@pytest.mark.skipif(
    not _VENV or not os.path.exists(os.path.join(_VENV, "reverb", "bin", "python")),
    reason=f"no Reverb venv: set {peers.ENV_VAR}=DIR after `python -m mpreplay.bench.peers --setup DIR` (DIR/reverb)",
)
def test_reverb_writes_three_step_items_through_a_trajectory_writer_per_game(script_dir):
    _runs_the_script("reverb", script_dir)


@pytest.mark.skipif(
    not _VENV or not os.path.exists(os.path.join(_VENV, "bin", "python")),
    reason=f"no peers' venv: set {peers.ENV_VAR}=DIR after `python -m mpreplay.bench.peers --setup DIR`",
)
def test_torchrl_folds_collector_batches_with_multistep_into_its_shared_buffer(script_dir):
    _runs_the_script("torchrl", script_dir)


def _runs_the_script(name: str, script_dir: str) -> None:
    worker = peers.launch([name], _VENV)[name]
    assert isinstance(worker, peers.PeerProcess), worker
    try:
        worker.request("actor_build", script=script_dir, capacity=1_000)
        answer = worker.request("actor_run")
    finally:
        worker.close()
    assert answer["cpu"] > 0 and answer["env_steps"] > 0

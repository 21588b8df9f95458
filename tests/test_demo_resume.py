"""mpreplay demo --checkpoint-every / --resume: a run SIGKILLed whole goes on from its latest checkpoint.

The runs are smoke runs: learning is not asserted, what carries over is.  Like the other demo
tests they run the demo as a user does (its processes start from a process server: "forkserver").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")

from demo_runs import Resumed, kill_and_resume, latest_checkpoint, run_demo, summary_of  # tests/demo_runs.py
from helpers import segments_of

from mpreplay import cli
from mpreplay.demo import epsilon
from mpreplay.demo.processes import learner_state, load_learner_state, make_optimizer
from mpreplay.demo.resume import FolderInUse, hold_folder, read_state
from mpreplay.demo.task import Config


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    """A CartPole run checkpointing every 2 s, SIGKILLed whole after a checkpoint of 50 learner
    steps, then ``--resume``d for 15 s; once for the tests below."""
    argv = ["--seconds", "300", "--checkpoint-every", "2", "--plain"]
    return kill_and_resume(argv, tmp_path_factory.mktemp("demo-resume"), 50, 15, timeout=150)


@pytest.mark.timeout(330)
def test_a_resumed_run_exits_0_after_its_checkpoint(resumed: Resumed):
    assert resumed.run.returncode == 0, resumed.run.stderr
    assert f"resumed {resumed.run.out / 'checkpoints'}" in resumed.run.stdout


@pytest.mark.timeout(330)
def test_the_learner_goes_on_from_the_checkpointed_step(resumed: Resumed):
    summary = summary_of(resumed.run)
    assert summary["restarts"][0]["learner_steps"] == resumed.state["counters"]["learner_steps"] >= 50
    assert summary["learner_steps"] >= resumed.state["counters"]["learner_steps"]


@pytest.mark.timeout(330)
def test_the_replay_comes_back_with_the_rows_and_counters_it_had(resumed: Resumed):
    summary = summary_of(resumed.run)
    assert summary["restarts"][0]["stored"] == resumed.stored > 0
    assert summary["inserts"] >= resumed.state["counters"]["inserts"] > 0


@pytest.mark.timeout(330)
def test_the_learning_curve_continues_the_checkpointed_episodes(resumed: Resumed):
    episodes = json.loads((resumed.run.out / "episodes.json").read_text())
    before = len(resumed.curve["ret"])
    assert before == resumed.state["counters"]["episodes"] > 0
    assert episodes["ret"][:before] == resumed.curve["ret"].tolist()
    assert episodes["time"][:before] == resumed.curve["time"].tolist()
    assert summary_of(resumed.run)["episodes"] == len(episodes["ret"]) >= before


@pytest.mark.timeout(330)
def test_the_resumed_clock_and_env_steps_start_where_the_checkpoint_stopped(resumed: Resumed):
    episodes = json.loads((resumed.run.out / "episodes.json").read_text())
    counters, before = resumed.state["counters"], len(resumed.curve["ret"])
    mark = summary_of(resumed.run)["restarts"][0]
    assert (mark["elapsed_seconds"], mark["env_steps"]) == (counters["elapsed_seconds"], counters["env_steps"])
    assert min(episodes["time"][before:], default=np.inf) >= counters["elapsed_seconds"]
    assert min(episodes["env_steps"][before:], default=np.inf) > counters["env_steps"]


@pytest.mark.timeout(330)
def test_a_resumed_run_plays_the_same_epsilon_ladder(resumed: Resumed):
    config = resumed.state["config"]
    n = config["actors"] * config["envs_per_actor"]
    ladder = [epsilon(i, n) for i in range(n)]
    assert resumed.state["epsilons"] == ladder
    episodes = json.loads((resumed.run.out / "episodes.json").read_text())
    later = episodes["eps"][len(resumed.curve["ret"]) :]
    assert later and set(later) <= set(ladder)


@pytest.mark.timeout(330)
def test_a_resumed_run_checkpoints_on_with_its_restart_marked(resumed: Resumed):
    folder = latest_checkpoint(resumed.run.out)
    assert folder is not None and int(folder.name) > resumed.state["number"]
    state = json.loads((folder / "state.json").read_text())
    assert state["config"]["resumes"] == 1
    assert state["restarts"] == summary_of(resumed.run)["restarts"]
    assert (resumed.run.out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(330)
def test_a_resumed_run_removes_the_segments_the_killed_run_left_and_leaves_none(resumed: Resumed):
    assert segments_of(resumed.killed_pid) == set()
    assert segments_of(resumed.run.pid) == set()


@pytest.mark.timeout(330)
def test_a_resumed_run_refuses_a_flag_that_changes_its_settings(resumed: Resumed, capsys: pytest.CaptureFixture):
    for flag, value in (("--actors", "5"), ("--agent", "r2d2"), ("--env", "atari"), ("--lr", "0.5")):
        with pytest.raises(SystemExit) as exit_info:
            cli.main(["demo", "--resume", str(resumed.run.out), flag, value])
        assert exit_info.value.code == 2
        assert f"{flag} {value}" in capsys.readouterr().err


@pytest.mark.timeout(330)
def test_a_damaged_learner_file_is_refused_naming_it(resumed: Resumed, tmp_path: Path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(resumed.run.out, copy)
    learner = latest_checkpoint(copy) / "learner.npz"  # type: ignore[operator]
    learner.write_bytes(learner.read_bytes()[:-100])
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--resume", str(copy)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--resume" in err and "learner.npz" in err


@pytest.mark.timeout(330)
def test_a_damaged_replay_is_refused_naming_the_flag_and_leaves_no_segment(resumed: Resumed, tmp_path: Path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(resumed.run.out, copy)
    data = latest_checkpoint(copy) / "replay" / "data.bin"  # type: ignore[operator]
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))
    run = run_demo(["--resume", str(copy), "--seconds", "5", "--plain"], copy, timeout=120)
    assert run.returncode == 1
    assert f"--resume {copy}" in run.stderr and "data.bin" in run.stderr
    assert segments_of(run.pid) == set()


@pytest.mark.timeout(330)
def test_a_checkpoint_killed_midway_leaves_the_previous_one_the_latest(resumed: Resumed, tmp_path: Path):
    copy = tmp_path / "run"
    shutil.copytree(resumed.run.out, copy)
    latest = latest_checkpoint(copy)
    assert latest is not None
    midway = copy / "checkpoints" / f".{int(latest.name) + 1:06d}.tmp-999999"  # as a SIGKILL leaves one
    midway.mkdir()
    (midway / "state.json").write_text('{"format": "mpreplay-demo-chec')
    folder, state = read_state(str(copy))
    assert (folder, state["number"]) == (str(latest), int(latest.name))


def test_resume_of_a_folder_without_a_checkpoint_is_refused_naming_the_flag(tmp_path: Path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--resume", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"--resume {tmp_path}" in err and "no checkpoint" in err


@pytest.mark.parametrize("argv", [["--checkpoint-every", "0"], ["--checkpoint-every", "5", "--table", "t"]])
def test_checkpoint_every_is_refused_naming_the_flag(argv: list[str], capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", *argv])
    assert exit_info.value.code == 2
    assert "--checkpoint-every" in capsys.readouterr().err


def test_a_learner_state_loads_back_into_networks_and_an_optimizer_that_step_alike():
    import torch

    from mpreplay.demo.apex import APEX

    config = Config(hidden=8)
    torch.manual_seed(0)
    online, target = APEX.network(config), APEX.network(config)
    optimizer = make_optimizer(online, config)
    for _ in range(3):
        loss = online(torch.randn(5, config.obs_dim)).square().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    counts = {"learner_steps": 3, "priority_updates": 15}
    saved = {key: np.asarray(value).copy() for key, value in learner_state(online, target, optimizer, counts).items()}
    online2, target2 = APEX.network(config), APEX.network(config)
    optimizer2 = make_optimizer(online2, config)
    assert load_learner_state(saved, online2, target2, optimizer2) == counts
    batch = torch.randn(5, config.obs_dim)
    for net, opt in ((online, optimizer), (online2, optimizer2)):
        loss = net(batch).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert all(
        torch.equal(a, b) for a, b in zip(online.state_dict().values(), online2.state_dict().values(), strict=True)
    )
    assert all(
        torch.equal(a, b) for a, b in zip(target.state_dict().values(), target2.state_dict().values(), strict=True)
    )


def test_a_folder_another_run_checkpoints_into_is_refused_naming_its_process(tmp_path: Path):
    with hold_folder(str(tmp_path)), pytest.raises(FolderInUse, match=f"another run \\(process {os.getpid()}\\)"):
        hold_folder(str(tmp_path))
    hold_folder(str(tmp_path)).close()  # free again once its holder lets go


_HOLDER = (
    "import sys, time; from mpreplay.demo.resume import hold_folder; "
    "held = hold_folder(sys.argv[1]); print('held', flush=True); time.sleep(60)"
)


@pytest.mark.timeout(60)
def test_a_folder_whose_run_was_killed_is_free_again(tmp_path: Path):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOLDER,
            str(tmp_path),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(FolderInUse, match=f"process {holder.pid}"):
        hold_folder(str(tmp_path))
    holder.kill()
    holder.wait(30)
    hold_folder(str(tmp_path)).close()

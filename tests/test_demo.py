"""mpreplay demo: the Ape-X DQN run moves data through every stage and cleans up.

The runs are smoke runs: short, and learning is not asserted.  The demo always
starts its processes with "spawn" (forking a process that has initialised
torch can deadlock), so unlike the other multiprocess tests these do not run
under "fork".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")

from demo_runs import Run, run_demo, summary_of  # tests/demo_runs.py
from helpers import segments_of

from mpreplay import cli
from mpreplay.demo import epsilon
from mpreplay.demo.task import Config

# The smoke run keeps its replay in a persistent table of this name, which a second run joins
# (the Ctrl-C run below makes its replay as a run without --table does).
SMOKE_TABLE = f"test-demo-{os.getpid()}"


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    """``main(["--seconds", "20", "--table", SMOKE_TABLE, "--out", DIR])`` in a subprocess, once for
    the tests below; its table is removed after them."""
    yield run_demo(["--seconds", "20", "--table", SMOKE_TABLE], tmp_path_factory.mktemp("demo"), timeout=150)
    cli.main(["rm", SMOKE_TABLE])


@pytest.mark.timeout(180)
def test_a_timed_run_exits_0(smoke_run: Run):
    assert smoke_run.returncode == 0, smoke_run.stderr


@pytest.mark.timeout(180)
def test_a_timed_run_moves_data_through_every_stage(smoke_run: Run):
    summary = summary_of(smoke_run)
    stages = ("env_steps", "episodes", "inserts", "samples", "learner_steps", "priority_updates", "weights_published")
    assert {key: summary[key] > 0 for key in stages} == dict.fromkeys(stages, True), summary
    assert summary["reason"] in ("timeout", "solved")


@pytest.mark.timeout(180)
def test_a_timed_run_writes_the_learning_curve(smoke_run: Run):
    assert (smoke_run.out / "learning_curve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(180)
def test_a_timed_run_leaves_no_segment_behind(smoke_run: Run):
    assert segments_of(smoke_run.pid) == set()


@pytest.mark.timeout(180)
def test_ctrl_c_stops_the_run_and_still_writes_the_summary(tmp_path: Path):
    proc = subprocess.Popen(
        [sys.executable, "-m", "mpreplay", "demo", "--seconds", "120", "--plain", "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        for line in proc.stdout:  # one line per second once the processes run
            if "weights published" in line and not line.rstrip().endswith("published 0"):
                break
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["reason"] == "interrupted"
    assert summary["inserts"] > 0
    assert segments_of(proc.pid) == set()


def test_the_epsilon_ladder_runs_from_0_4_to_0_4_to_the_8th():
    ladder = [epsilon(rank, 5) for rank in range(5)]
    assert ladder[0] == pytest.approx(0.4)
    assert ladder[-1] == pytest.approx(0.4**8)
    assert ladder == sorted(ladder, reverse=True)


def test_a_lone_actor_explores_with_epsilon_0_4():
    assert epsilon(0, 1) == pytest.approx(0.4)


def test_epsilon_rejects_a_rank_outside_the_actors():
    with pytest.raises(ValueError, match="rank"):
        epsilon(2, 2)


def test_the_demo_command_forwards_its_flags_to_the_demo(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--help"])
    assert exit_info.value.code == 0
    assert "--actors" in capsys.readouterr().out


def test_the_demo_rejects_zero_actors_naming_the_flag(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["demo", "--actors", "0"])
    assert exit_info.value.code == 2
    assert "--actors" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_a_run_started_again_with_the_same_table_goes_on_with_its_replay(smoke_run: Run, tmp_path: Path):
    assert f"made the persistent table {SMOKE_TABLE!r}" in smoke_run.stdout
    stored = min(summary_of(smoke_run)["inserts"], Config().capacity)  # a full table keeps its newest rows
    # The table outlived the run: the next one joins it with every row the first stored.
    again = run_demo(["--seconds", "3", "--table", SMOKE_TABLE], tmp_path, timeout=150)
    assert again.returncode == 0, again.stderr
    assert f"joined the table {SMOKE_TABLE!r}, which holds {stored:,} rows" in again.stdout

"""The examples run: each is started as a user would, in a subprocess, with a short run."""

from __future__ import annotations

import subprocess
import sys

import pytest
from helpers import REPO_ROOT

EXAMPLES = REPO_ROOT / "examples"


def _run_example(script: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``python examples/<script> <args>``, its output captured."""
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args], check=False, capture_output=True, text=True, timeout=timeout
    )


@pytest.mark.timeout(120)
def test_library_use_runs_to_the_end():
    pytest.importorskip("gymnasium")
    proc = _run_example("library_use.py", "--steps", "300", timeout=100)
    assert proc.returncode == 0, proc.stderr
    assert "saved and loaded" in proc.stdout


@pytest.mark.timeout(60)
def test_apex_dqn_shows_its_flags():
    proc = _run_example("apex_dqn.py", "--help", timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "--samples-per-insert" in proc.stdout


@pytest.mark.timeout(60)
def test_r2d2_cartpole_shows_the_r2d2_flags():
    proc = _run_example("r2d2_cartpole.py", "--help", timeout=50)
    assert proc.returncode == 0, proc.stderr
    assert "--burn-in" in proc.stdout


@pytest.mark.timeout(120)
def test_on_policy_queue_consumes_every_chunk_exactly_once():
    pytest.importorskip("gymnasium")
    proc = _run_example("on_policy_queue.py", "--actors", "2", "--updates", "3", timeout=100)
    assert proc.returncode == 0, proc.stderr
    assert "consumed 12 chunks, each exactly once" in proc.stdout


def _start_example(script: str, *args: str) -> subprocess.Popen[str]:
    """``python examples/<script> <args>`` started, its output piped."""
    return subprocess.Popen(
        [sys.executable, str(EXAMPLES / script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.timeout(120)
def test_a_learner_and_actors_started_apart_find_each_other_by_name_and_a_restarted_learner_goes_on(table_name):
    table = ("--table", table_name)
    # The actors start first: they wait for the learner's table.
    actors = [_start_example("replay_by_name.py", "actor", *table, "--steps", "300", "--seed", str(i)) for i in (1, 2)]
    first = _run_example("replay_by_name.py", "learner", *table, "--updates", "20", timeout=100)
    assert first.returncode == 0, first.stderr
    assert f"learner: made table '{table_name}'" in first.stdout
    for proc in actors:
        out, err = proc.communicate(timeout=100)
        assert proc.returncode == 0, err
        assert "actor: added 300 transitions" in out
    watch = _run_example("replay_by_name.py", "watch", *table, timeout=100)
    assert watch.returncode == 0, watch.stderr
    assert "watch: 600 rows" in watch.stdout and "600 complete rows" in watch.stdout
    # The first learner has ended; the next one finds every row the actors stored, then removes the table.
    second = _run_example("replay_by_name.py", "learner", *table, "--updates", "5", "--remove", timeout=100)
    assert second.returncode == 0, second.stderr
    assert f"learner: joined table '{table_name}' holding 600 rows" in second.stdout
    assert f"learner: removed table '{table_name}'" in second.stdout

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

"""Specification of ``mpreplay bench mp --quick``: a smoke run of the multi-process benchmark.

It runs as the command line does, in its own process group, so the tests can
see every process it started and every shared-memory segment it created.
No figure is checked: speed is the benchmark's business, not the tests'.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import START_METHODS, segments_of, table_cells

OBSERVATIONS = ("(4,) float32", "(84, 84, 4) uint8")
CASES = ("learner", "1 writer", "2 writers", "1 writer + learner", "2 writers + learner")


@dataclass(frozen=True)
class Run:
    pid: int
    returncode: int
    stdout: str
    stderr: str


def _start(method: str, *options: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "mpreplay", "bench", "mp", "--quick", "--start-method", method, *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _finish(proc: subprocess.Popen, timeout: float) -> Run:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
        proc.wait()
    return Run(proc.pid, proc.returncode, stdout, stderr)


def _group_members(pgid: int) -> list[int]:
    """Live processes of process group ``pgid`` (zombies excluded)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while listed
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _wait_until(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module", params=START_METHODS)
def quick_run(request) -> Run:
    return _finish(_start(request.param), 100)


@pytest.mark.timeout(120)
def test_quick_run_exits_with_status_0(quick_run):
    assert quick_run.returncode == 0, quick_run.stderr


# The tables are drawn by rich where it is installed, as plain text elsewhere: table_cells reads
# both, and CI runs this file again with rich installed.
@pytest.mark.timeout(120)
@pytest.mark.parametrize("obs", OBSERVATIONS)
@pytest.mark.parametrize("case", CASES)
def test_quick_run_prints_every_case_for_every_observation(quick_run, obs, case):
    rows = [cells for cells in table_cells(quick_run.stdout) if obs in cells and "mpreplay" in cells and case in cells]
    assert rows, f"no row for {case!r} with {obs}:\n{quick_run.stdout}"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("obs", OBSERVATIONS)
def test_quick_run_prints_the_gather_limit_of_every_observation(quick_run, obs):
    assert any(obs in cells and "np.take limit" in cells for cells in table_cells(quick_run.stdout)), quick_run.stdout


@pytest.mark.timeout(120)
def test_quick_run_prints_the_capacity_sweep(quick_run):
    capacities = {
        cells[2]
        for cells in table_cells(quick_run.stdout)
        if len(cells) > 3 and cells[1] == "mpreplay" and cells[3] == "learner"
    }
    assert {"1,000", "10,000"} <= capacities, quick_run.stdout


@pytest.mark.timeout(120)
@pytest.mark.parametrize("target", ["(a)", "(b)", "(c)", "(d)"])
def test_quick_run_reports_every_target(quick_run, target):
    assert any(cells and cells[0].startswith(target) for cells in table_cells(quick_run.stdout)), quick_run.stdout


@pytest.mark.timeout(120)
def test_quick_run_leaves_no_process_and_no_segment_behind(quick_run):
    assert _wait_until(lambda: not _group_members(quick_run.pid)), _group_members(quick_run.pid)
    assert segments_of(quick_run.pid) == set()
    assert "leaked" not in quick_run.stderr  # the resource tracker had nothing left to unlink


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", START_METHODS)
def test_ctrl_c_stops_every_process_and_unlinks_every_segment(method):
    proc = _start(method)
    try:
        assert _wait_until(lambda: segments_of(proc.pid), timeout=60), "the benchmark never created a buffer"
        time.sleep(0.5)  # into the cases: writer and learner processes run now
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGINT, stderr
    assert _wait_until(lambda: not _group_members(proc.pid)), _group_members(proc.pid)
    assert segments_of(proc.pid) == set()
    assert "leaked" not in stderr  # the resource tracker had nothing left to unlink


@pytest.fixture(scope="module")
def atari_scale_run() -> Run:
    return _finish(_start("fork", "--atari-scale"), 150)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("rows", ["1", "32"])
def test_atari_scale_run_reports_eight_compressed_writers_beside_a_learner(atari_scale_run, rows):
    assert atari_scale_run.returncode == 0, atari_scale_run.stderr
    assert "8 writers + learner" in atari_scale_run.stdout
    line = next(c for c in table_cells(atari_scale_run.stdout) if c[:3] == ["mpreplay, compressed", "8,000", rows])
    assert len(line) == 11 and all(cell for cell in line)


@pytest.mark.timeout(180)
def test_atari_scale_run_leaves_no_segment_behind(atari_scale_run):
    assert segments_of(atari_scale_run.pid) == set()

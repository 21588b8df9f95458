"""Helpers of the demo's tests: a run of ``mpreplay demo`` in a subprocess, what it wrote, what it left."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np
from helpers import segments_of

import mpreplay


class Run(NamedTuple):
    returncode: int
    pid: int
    out: Path
    stdout: str
    stderr: str


def run_demo(argv: list[str], out: Path, timeout: float) -> Run:
    """``mpreplay.demo.main(argv + ["--out", out])`` in a subprocess, waited for at most ``timeout`` s."""
    code = f"from mpreplay.demo import main; raise SystemExit(main({[*argv, '--out', str(out)]!r}))"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return Run(proc.returncode, proc.pid, out, stdout, stderr)


def summary_of(run: Run) -> dict:
    return json.loads((run.out / "summary.json").read_text())


def kill_after_checkpoint(argv: list[str], out: Path, timeout: float, learner_steps: int = 1) -> int:
    """``mpreplay.demo.main(argv + ["--out", out])`` in a process group of its own, SIGKILLed whole
    (the demo, its processes, its process server and resource tracker) once a checkpoint in ``out``
    records ``learner_steps`` or more; returns the demo's pid.  Fails if none does in ``timeout`` s.

    The run has a TMPDIR of its own, removed after the kill: SIGKILL leaves Python's
    multiprocessing folders (``pymp-*``) of the processes it kills there, as a preempted machine's
    /tmp keeps them (short: its process server's socket path must fit AF_UNIX's 108 bytes)."""
    code = f"from mpreplay.demo import main; raise SystemExit(main({[*argv, '--out', str(out)]!r}))"
    tmp = tempfile.mkdtemp(prefix="killed-")
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
        env={**os.environ, "TMPDIR": tmp},
    )
    deadline = time.monotonic() + timeout
    try:
        while latest_learner_steps(out) < learner_steps:
            if proc.poll() is not None:
                raise AssertionError(f"the demo ended before its checkpoint: {proc.stderr.read().decode()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no checkpoint of {learner_steps} learner steps in {out} within {timeout} s")
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        shutil.rmtree(tmp)
    return proc.pid


def latest_checkpoint(out: Path) -> Path | None:
    """The newest whole checkpoint folder of the demo run in ``out`` (None: none yet)."""
    folders = sorted(p for p in (out / "checkpoints").glob("[0-9]*") if p.name.isdigit())
    return folders[-1] if folders else None


def latest_learner_steps(out: Path) -> int:
    folder = latest_checkpoint(out)
    if folder is None:
        return 0
    try:
        return json.loads((folder / "state.json").read_text())["counters"]["learner_steps"]
    except (OSError, ValueError):  # removed meanwhile: a newer one took its place
        return 0


class Resumed(NamedTuple):
    killed_pid: int  # the run SIGKILLed whole
    state: dict  # the state.json of the checkpoint the run resumed from
    curve: dict[str, np.ndarray]  # its curve.npz
    stored: int  # rows its replay restores to
    run: Run  # the resumed run


def kill_and_resume(argv: list[str], out: Path, learner_steps: int, seconds: float, timeout: float) -> Resumed:
    """A run of ``argv`` killed whole after a checkpoint of ``learner_steps`` (:func:`kill_after_checkpoint`),
    what its latest checkpoint holds, then ``--resume out --seconds SECONDS --plain``."""
    pid = kill_after_checkpoint(argv, out, timeout, learner_steps)
    folder = latest_checkpoint(out)
    assert folder is not None
    state = json.loads((folder / "state.json").read_text())
    with np.load(folder / "curve.npz", allow_pickle=False) as curve:
        arrays = {key: curve[key] for key in curve.files}
    with mpreplay.restore(folder / "replay", shared=False) as replay:
        stored = replay.get_stored_size()
    run = run_demo(["--resume", str(out), "--seconds", str(seconds), "--plain"], out, timeout)
    return Resumed(pid, state, arrays, stored, run)


def carried_over(resumed: Resumed) -> dict:
    """The resumed run's summary, once checked: it exited 0, started from the checkpoint's learner
    step, replay and counters and went on from them (its actors added rows), and neither run left
    a segment."""
    assert resumed.run.returncode == 0, resumed.run.stderr
    summary, before = summary_of(resumed.run), resumed.state["counters"]
    mark = summary["restarts"][0]
    assert (mark["learner_steps"], mark["stored"]) == (before["learner_steps"], resumed.stored), mark
    assert summary["learner_steps"] >= before["learner_steps"] and resumed.stored > 0, summary
    assert summary["inserts"] > before["inserts"] and summary["env_steps"] >= before["env_steps"], summary
    assert segments_of(resumed.killed_pid) == set() and segments_of(resumed.run.pid) == set()
    return summary

"""Helpers of the demo's tests: a run of ``mpreplay demo`` in a subprocess, what it wrote, what it left."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple


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

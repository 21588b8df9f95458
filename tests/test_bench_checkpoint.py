"""Smoke test of ``mpreplay bench checkpoint``: it runs on real Breakout frames and reports every
figure; no timing is asserted."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("gymnasium")
pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from mpreplay.bench import checkpoint

pytestmark = pytest.mark.timeout(300, method="thread")


def test_quick_run_reports_checkpoint_restore_floors_export_and_waits(capsys, tmp_path):
    assert checkpoint.main(["--quick", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"2,000 +\d+ +\d+ \(\d\.\d{3}x\) +[\d.]+ \([\d,]+ MB/s\)", out)
    for call in ("writer alone", "writer checkpointing", "learner alone", "learner checkpointing"):
        assert re.search(rf"{call} +[\d,]+ +[\d.]+ +[\d.]+", out), call
    assert re.search(r"capacity 2,000: \d+ live checkpoints, rows left out \[[\d, ]+\]", out)
    assert list(tmp_path.iterdir()) == []  # the bench's folder removed

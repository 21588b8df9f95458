"""Smoke test of ``mpreplay bench checkpoint``: it runs on real Breakout frames and reports every
figure; no timing is asserted."""

from __future__ import annotations

import re

import pytest
from helpers import table_cells

pytest.importorskip("gymnasium")
pytest.importorskip("ale_py")
pytest.importorskip("cv2")

from mpreplay.bench import checkpoint

pytestmark = pytest.mark.timeout(300, method="thread")

WINDOWS = ("alone", "checkpointing", "checkpointing deflated")


def test_quick_run_reports_checkpoint_restore_floors_export_waits_and_why_reverb_is_not_measured(capsys, tmp_path):
    nowhere = tmp_path / "no-peers"  # Reverb's venv absent: the report says why Reverb is not measured
    assert checkpoint.main(["--quick", "--dir", str(tmp_path), "--peers", str(nowhere)]) == 0
    out = capsys.readouterr().out
    rows = {tuple(cells[:2]): cells for cells in table_cells(out) if cells and cells[0] == "2,000"}
    (floors,) = [cells for key, cells in rows.items() if re.fullmatch(r"\d+", key[1])]
    # capacity, segment MB, checkpoint MB (x segment), checkpoint s (MB/s), write floor s (x), restore
    # s (MB/s), read floor s (x), save_transitions s (MB, x checkpoint)
    assert re.fullmatch(r"\d+ \(\d\.\d{3}x\)", floors[2]) and re.fullmatch(r"[\d.]+ \([\d,]+ MB/s\)", floors[3])
    assert re.fullmatch(r"[\d.]+ \([\d.]+x\)", floors[4]) and re.fullmatch(r"[\d.]+ \([\d,]+ MB/s\)", floors[5])
    # capacity, deflate, checkpoint MB (x segment, x smaller than raw), checkpoint s (x raw), write
    # floor s (x), restore s (x raw), read floor s (x)
    (deflated,) = [cells for key, cells in rows.items() if key[1] in ("isal", "zlib")]
    assert re.fullmatch(r"[\d.]+ \(\d\.\d{3}x segment, [\d.]+x smaller\)", deflated[2])
    assert all(re.fullmatch(r"[\d.]+ \([\d.]+x raw\)", deflated[k]) for k in (3, 5))
    assert all(re.fullmatch(r"[\d.]+ \([\d.]+x\)", deflated[k]) for k in (4, 6))
    assert re.search(r"capacity 2,000 deflated, each run: checkpoint s [\d.]+, write floor s [\d.]+", out)
    for call in [f"{role} {window}" for role in ("writer", "learner") for window in WINDOWS]:
        cells = rows.get(("2,000", call))
        assert cells is not None and re.fullmatch(r"[\d,]+", cells[2]), call
        assert all(re.fullmatch(r"[\d.]+", cell) for cell in cells[3:6]) and re.fullmatch(r"[\d,]+", cells[6]), call
    assert re.search(r"capacity 2,000, each run: checkpoint s [\d.]+, write floor s [\d.]+ \(ratios [\d.]+\)", out)
    assert re.search(r"capacity 2,000: \d+ live checkpoints, rows left out \[[\d, ]+\]", out)
    assert f"capacity 2,000: Reverb not measured: no interpreter at {nowhere}/reverb/bin/python" in out
    assert list(tmp_path.iterdir()) == []  # the bench's folder removed

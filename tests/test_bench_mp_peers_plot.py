"""The plot of ``mpreplay bench mp --peers DIR --plot FILE`` (mpreplay.bench.mp_peers.plot)."""

from __future__ import annotations

import pytest

from mpreplay.bench import mp_peers
from mpreplay.bench.mp_processes import Result


def _line(buffer: str, case: str, rows: int | None, inserts=None, steps=None) -> Result:
    return Result("(4,) float32", buffer, case, 1000, rows, inserts=inserts, steps=steps, cpu=1.0)


def test_the_plot_is_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    runs = mp_peers.PeerRuns(results=[_line("reverb", "1 writer", 1, inserts=10.0)])
    path = tmp_path / "mp.png"
    mp_peers.plot(
        [_line("mpreplay", "1 writer", 1, inserts=1e6), _line("mpreplay", "learner", None, steps=9.0)], runs, str(path)
    )
    assert path.read_bytes().startswith(b"\x89PNG")

"""Smoke tests of ``mpreplay bench per``: it runs and reports; no timing is asserted."""

import importlib.util
import re
import sys

import pytest
from helpers import table_cells

from mpreplay.bench import per
from mpreplay.bench.peers import ENV_VAR

_QUICK_ROWS = [(f"{c:,}", f"{f:,}") for c in (1_000, 3_000) for f in (c, 2 * c)]


def _table_rows(text: str) -> set[tuple[str, str, str]]:
    """(buffer, capacity, frames) of every table row, from rich's or the plain layout."""
    rows = set()
    for cells in table_cells(text):
        if len(cells) >= 4 and re.fullmatch(r"[\d,]+", cells[1]) and re.fullmatch(r"[\d,]+", cells[2]):
            rows.add((cells[0], cells[1], cells[2]))
    return rows


def _expected_buffers() -> list[str]:
    names = ["mpreplay", "numpy", "floor"]
    if importlib.util.find_spec("cpprb") is not None:
        names.append("cpprb")
    return names


# The peers' tables run only with a peers' venv (tests/test_bench_peers.py covers them).
pytestmark = pytest.mark.usefixtures("no_peers_venv")


def test_quick_run_exits_zero_with_a_row_per_buffer_and_size(capsys):
    assert per.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert _table_rows(out) == {(name, c, f) for name in _expected_buffers() for c, f in _QUICK_ROWS}
    assert f"Peers (Tianshou, TorchRL, flashbax, numba) not run: give --peers DIR (or set {ENV_VAR})" in out


@pytest.mark.timeout(300)
def test_naive_buffer_is_reported_skipped_above_its_capacity_limit(capsys):
    assert per.main(["--sizes", "10001", "--repeats", "1"]) == 0  # the naive buffer runs up to 1e4
    lines = capsys.readouterr().out.splitlines()
    naive = [line for line in lines if re.match(r"\W*numpy\b", line)]
    timed = [line for line in lines if re.match(r"\W*floor\b", line)]
    assert len(naive) == len(timed) == 2  # frames = capacity and 2 x capacity
    assert all("skipped (O(N) per sample)" in line for line in naive)
    assert not any("skipped" in line for line in timed)


def test_table_falls_back_to_plain_text_without_rich(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "rich.console", None)  # makes `import rich.console` fail
    assert per.main(["--sizes", "100", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "│" not in out and "┃" not in out
    sizes = [("100", "100"), ("100", "200")]
    assert _table_rows(out) == {(name, c, f) for name in _expected_buffers() for c, f in sizes}


def test_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "per.png"
    assert per.main(["--sizes", "100", "--repeats", "1", "--plot", str(path)]) == 0
    assert path.read_bytes().startswith(b"\x89PNG")


def test_sizes_not_above_the_batch_are_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        per.main(["--sizes", "32"])
    assert exc.value.code == 2
    assert "capacity > 32" in capsys.readouterr().err


def test_api_compat_adds_a_row_for_the_compat_layer(capsys):
    assert per.main(["--sizes", "100", "--repeats", "1", "--api", "compat"]) == 0
    rows = _table_rows(capsys.readouterr().out)
    assert {(name, "100", f) for name in ["compat", *_expected_buffers()] for f in ("100", "200")} == rows

"""``mpreplay bench queue``: writers push rollouts into a Queue, one learner takes each once.

mpreplay's side runs here under fork and spawn; Reverb's runs where ``MPREPLAY_PEERS`` names the
peers' venvs (tests/test_bench_peers.py).  No figure is judged.
"""

from __future__ import annotations

import re

import pytest

from mpreplay.bench import peers, queue
from mpreplay.bench.case_clock import Trace, Window

pytestmark = pytest.mark.timeout(180, method="thread")


@pytest.fixture(autouse=True)
def no_peers_from_the_environment(monkeypatch):
    monkeypatch.delenv(peers.ENV_VAR, raising=False)


def _rows(text: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃]|\s{2,}", line) if c.strip()]
        if len(cells) >= 8 and cells[0] in ("mpreplay", "reverb"):
            rows[(cells[0], cells[1])] = cells
    return rows


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_every_writer_count_moves_rollouts_and_none_is_handed_out_twice(method, capsys):
    assert queue.main(["--quick", "--seconds", "0.5", "--start-method", method, "--steps", "16"]) == 0
    rows = _rows(capsys.readouterr().out)
    for writers in ("1", "2"):
        cells = rows[("mpreplay", writers)]
        assert float(cells[2].replace(",", "")) > 0  # rollouts/s
        assert cells[-1] == "0"  # handed twice


def test_without_a_venv_reverb_is_named_not_run_and_its_target_not_measured(capsys):
    assert queue.main(["--quick", "--seconds", "0.3", "--writers", "1", "--steps", "8"]) == 0
    out = capsys.readouterr().out
    assert f"reverb: not run: give --peers DIR (or set {peers.ENV_VAR})" in out
    assert "not measured" in out


def test_a_missing_venv_makes_reverb_unavailable_with_the_reason(tmp_path, capsys):
    nowhere = tmp_path / "nowhere"
    assert queue.main(["--quick", "--seconds", "0.3", "--writers", "1", "--steps", "8", "--peers", str(nowhere)]) == 0
    assert f"reverb: unavailable: no interpreter at {nowhere}/reverb/bin/python" in capsys.readouterr().out


def test_a_line_counts_the_servers_cpu_in_the_rollouts_per_cpu_second():
    at = [0.0, 1.0, 2.0]
    window = Window(
        at,
        [Trace([0, 5, 10], 0.5, 0), Trace([0, 10, 20], 1.0, 0)],
        (None, None),
        ((1.0, 0), (2.0, 0)),
        (None, None),
    )
    line = queue.line_of("reverb", 1, window, 0)
    assert line.rollouts == 10.0
    assert line.server_cpu == pytest.approx(0.5)
    assert line.cpu == pytest.approx(0.25 + 0.5 + 0.5)
    assert line.per_cpu == pytest.approx(10.0 / 1.25)


def test_seconds_must_be_positive(capsys):
    with pytest.raises(SystemExit) as exc:
        queue.main(["--seconds", "0"])
    assert exc.value.code == 2
    assert "expected a number of seconds > 0, got '0'" in capsys.readouterr().err

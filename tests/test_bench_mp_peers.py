"""``mpreplay bench mp --peers DIR`` (mpreplay.bench.mp_peers): every buffer's lines, per CPU-second, and the targets.

What runs without the peers' venvs: the report of lines made by hand, and a quick run whose peers
are missing (each named unavailable with the reason, mpreplay and cpprb measured).  The real Reverb
and TorchRL run in tests/test_bench_peers.py, where ``MPREPLAY_PEERS`` names the venvs.  No figure
is judged.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from mpreplay.bench import mp_peers, peers
from mpreplay.bench.mp_processes import Result


def _line(buffer: str, case: str, rows: int | None, inserts=None, steps=None, cpu=1.0, server=None) -> Result:
    return Result(
        "(4,) float32",
        buffer,
        case,
        1000,
        rows,
        inserts=inserts,
        steps=steps,
        sampled=None if steps is None else steps * 256,
        cpu=cpu,
        server_cpu=server,
    )


def _cells(text: str) -> list[list[str]]:
    return [[c.strip() for c in re.split(r"[│┃]|\s{2,}", line) if c.strip()] for line in text.splitlines()]


def test_rows_per_cpu_second_count_every_process_of_the_case_the_server_included():
    reverb = _line("reverb", "1 writer", 1, inserts=3000.0, cpu=1.5, server=0.5)
    assert mp_peers.per_cpu(reverb.inserts, reverb) == pytest.approx(2000.0)


def test_targets_divide_mpreplay_per_cpu_second_by_each_peer_of_the_same_case():
    runs = mp_peers.PeerRuns(
        results=[
            _line("reverb", "1 writer + learner", 1, inserts=100.0, steps=10.0, cpu=2.0),
            _line("torchrl", "1 writer + learner", 1, inserts=400.0, steps=40.0, cpu=1.0),
        ]
    )
    mine = [
        _line("mpreplay", "1 writer + learner", 1, inserts=1e5, steps=1e3, cpu=1.0),
        _line("cpprb", "1 writer + learner", 1, inserts=1e4, steps=2e3, cpu=1.0),
    ]
    found = {t.measure: t for t in mp_peers.targets(mine, runs)}
    assert found["inserts"].ratios == {"reverb": pytest.approx(2000.0), "torchrl": 250.0, "cpprb": 10.0}
    assert found["steps"].ratios == {"reverb": pytest.approx(200.0), "torchrl": 25.0, "cpprb": 0.5}


def test_a_missed_goal_says_so_and_a_peer_without_a_line_is_not_measured():
    runs = mp_peers.PeerRuns(results=[_line("reverb", "learner", None, steps=100.0, cpu=1.0)])
    mine = [_line("mpreplay", "learner", None, steps=1000.0, cpu=1.0)]
    (cells,) = mp_peers.target_cells(mp_peers.targets(mine, runs))
    assert cells[-3:] == ["10.0 (missed)", "not measured", "not measured"]


def test_the_lines_of_one_case_stand_together_in_bench_mps_order(capsys):
    runs = mp_peers.PeerRuns(
        results=[_line("reverb", "learner", None, steps=1.0), _line("reverb", "1 writer", 1, inserts=1.0)],
        versions=["reverb: unavailable: test"],
    )
    mine = [_line("mpreplay", "learner", None, steps=9.0), _line("mpreplay", "1 writer", 1, inserts=9.0)]
    mp_peers.print_report(mine, runs)
    rows = [c[1:4] for c in _cells(capsys.readouterr().out) if len(c) > 4 and c[0] == "(4,) float32"]
    assert rows[:4] == [
        ["learner", "mpreplay", "9"],
        ["learner", "reverb", "1"],
        ["1 writer", "1", "mpreplay"],
        ["1 writer", "1", "reverb"],
    ]


def test_the_json_holds_every_line_and_every_target(tmp_path):
    runs = mp_peers.PeerRuns(results=[_line("reverb", "learner", None, steps=1.0)], reasons={"torchrl": "why"})
    path = tmp_path / "mp.json"
    mp_peers.dump(str(path), [_line("mpreplay", "learner", None, steps=9.0)], runs)
    data = json.loads(path.read_text())
    assert [line["buffer"] for line in data["lines"]] == ["mpreplay", "reverb"]
    assert data["targets"][0]["ratios"]["reverb"] == pytest.approx(9.0)
    assert data["reasons"] == {"torchrl": "why"}


def test_every_case_of_bench_mp_is_planned_for_the_peers():
    assert mp_peers.case_plan() == [
        (0, True, 256),
        (1, False, 1),
        (2, False, 1),
        (1, True, 1),
        (2, True, 1),
        (1, False, 32),
        (2, False, 32),
        (1, True, 32),
        (2, True, 32),
    ]


@pytest.fixture(scope="module")
def run_without_venvs(tmp_path_factory) -> subprocess.CompletedProcess:
    nowhere = tmp_path_factory.mktemp("peers") / "nowhere"
    env = {k: v for k, v in os.environ.items() if k != peers.ENV_VAR}
    run = subprocess.run(
        [sys.executable, "-m", "mpreplay", "bench", "mp", "--quick", "--peers", str(nowhere)],
        check=False,
        capture_output=True,
        text=True,
        timeout=200,
        env=env,
    )
    run.nowhere = str(nowhere)  # type: ignore[attr-defined]
    return run


@pytest.mark.timeout(240, method="thread")
def test_without_the_venvs_each_peer_is_named_unavailable_with_its_reason(run_without_venvs):
    assert run_without_venvs.returncode == 0, run_without_venvs.stderr
    out = run_without_venvs.stdout
    assert f"torchrl: unavailable: no interpreter at {run_without_venvs.nowhere}/bin/python" in out
    assert f"reverb: unavailable: no interpreter at {run_without_venvs.nowhere}/reverb/bin/python" in out


@pytest.mark.timeout(240, method="thread")
def test_without_the_venvs_mpreplays_line_of_every_case_is_there_and_no_peer_is_judged(run_without_venvs):
    out = run_without_venvs.stdout
    lines, targets = out.split("Every buffer, every case")[1].split("Targets (this run): mpreplay's rows")
    mine = [c for c in _cells(lines) if "mpreplay" in c and c[0] in ("(4,) float32", "(84, 84, 4) uint8")]
    assert len(mine) == 2 * len(mp_peers.case_plan())
    judged = [c for c in _cells(targets) if "inserts" in c or "steps" in c]
    # Per observation: the learner alone (steps), 4 writer cases (inserts), 4 beside a learner (both).
    assert len(judged) == 2 * (1 + 4 + 2 * 4)
    assert all(c[-3:-1] == ["not measured", "not measured"] for c in judged)

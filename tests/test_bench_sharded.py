"""``mpreplay bench sharded``: the sharded learner over a loopback Ray cluster beside the local buffer.

Reverb's side runs where ``MPREPLAY_PEERS`` names the peers' venvs (tests/test_bench_peers.py runs
its servers and clients).  No figure is judged.
"""

from __future__ import annotations

import re

import pytest

from mpreplay.bench import peers

pytestmark = pytest.mark.timeout(300, method="thread")


@pytest.fixture(autouse=True)
def no_peers_from_the_environment(monkeypatch):
    monkeypatch.delenv(peers.ENV_VAR, raising=False)


def test_one_shard_runs_the_local_and_the_sharded_path_and_judges_what_it_measured(capsys):
    pytest.importorskip("ray")
    from mpreplay.bench import sharded

    assert sharded.main(["--quick", "--shards", "1", "--capacity", "1000"]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in re.split(r"[│┃]|\s{2,}", line) if c.strip()] for line in out.splitlines()]
    paths = {cells[1] for cells in rows if len(cells) > 6 and cells[0] == "1"}
    assert {"local", "sharded"} <= paths
    assert any(cells[:2] == ["1", "sharded ÷ local"] and cells[2] != "not measured" for cells in rows)
    assert any(cells[:3] == ["1", "sharded ÷ reverb", "not measured"] for cells in rows)
    assert f"reverb: not run: give --peers DIR (or set {peers.ENV_VAR})" in out


def test_seconds_must_be_positive(capsys):
    pytest.importorskip("ray")
    from mpreplay.bench import sharded

    with pytest.raises(SystemExit) as exc:
        sharded.main(["--seconds", "0"])
    assert exc.value.code == 2
    assert "expected a number of seconds > 0" in capsys.readouterr().err

"""Smoke tests of ``mpreplay bench seq`` (figures are the benchmark's business) and of its stream."""
import contextlib
import importlib.util
import io
import sys

import numpy as np
import pytest

from mpreplay import cli
from mpreplay.bench import seq


@pytest.fixture(scope="module")
def quick_report() -> str:
    """What ``--quick`` prints, run once for the tests that read it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert seq.main(["--quick"]) == 0
    return out.getvalue()


def test_stream_shifts_each_stack_by_one_new_frame_and_starts_episodes_with_the_first_frame_repeated():
    for fields, priorities in seq.episodes(seed=3, steps=500, mean_length=60):
        obs = fields["obs"]
        assert obs.shape[1:] == seq.FRAME + (seq.STACK,) and len(priorities) == len(obs)
        assert (obs[0] == obs[0][..., :1]).all()
        np.testing.assert_array_equal(obs[1:, ..., :-1], obs[:-1, ..., 1:])
        assert fields["done"][-1] == 1 and not fields["done"][:-1].any()


def test_stream_holds_exactly_the_steps_asked_for():
    assert sum(len(p) for _, p in seq.episodes(seed=0, steps=1_234, mean_length=50)) == 1_234


def test_quick_run_reports_every_mpreplay_row_and_both_targets(quick_report):
    out = quick_report
    for row in ("mpreplay compressed, out=", "mpreplay compressed, new arrays", "mpreplay uncompressed, out="):
        assert row in out
    assert "÷ TorchRL PrioritizedSliceSampler" in out and "bytes per step ÷ one frame" in out


def test_quick_run_has_a_torchrl_row_exactly_when_torchrl_is_installed(quick_report):
    out = quick_report
    installed = importlib.util.find_spec("torchrl") is not None
    assert ("TorchRL PrioritizedSliceSampler " in out or "TorchRL SliceSampler (uniform" in out) == installed
    assert ("TorchRL is not installed" in out) != installed


def test_without_torchrl_the_run_says_so_and_leaves_the_speed_target_unjudged(capsys, monkeypatch):
    for name in ["torchrl", *(m for m in sys.modules if m.startswith("torchrl."))]:
        monkeypatch.setitem(sys.modules, name, None)  # makes `import torchrl...` fail, even once imported
    assert seq.main(["--quick", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "TorchRL is not installed" in out
    assert "not measured" in out


def test_a_capacity_below_one_sequence_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        seq.main(["--capacity", "79"])
    assert exc.value.code == 2
    assert "--capacity" in capsys.readouterr().err


def test_the_command_line_dispatches_bench_seq(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "seq", "--help"])
    assert exc.value.code == 0
    assert "usage: mpreplay bench seq" in capsys.readouterr().out

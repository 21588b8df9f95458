"""Smoke tests of ``mpreplay bench seq`` (figures are the benchmark's business) and of its stream."""

import contextlib
import io
import os

import numpy as np
import pytest

from mpreplay import cli
from mpreplay.bench import peers, seq


@pytest.fixture(scope="module")
def quick_report() -> str:
    """What ``--quick`` prints without a peers' venv, run once for the tests that read it."""
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(out):
        patch.delenv(peers.ENV_VAR, raising=False)
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


def test_without_the_peers_venv_torchrl_is_unavailable_and_the_speed_target_unjudged(quick_report):
    assert "TorchRL unavailable: no peers venv given" in quick_report
    assert "TorchRL PrioritizedSliceSampler" not in quick_report.split("Targets")[0]
    assert "not measured" in quick_report


def test_a_peers_venv_without_an_interpreter_is_named(tmp_path, capsys):
    assert seq.main(["--quick", "--repeats", "1", "--peers", str(tmp_path)]) == 0
    assert f"TorchRL unavailable: no interpreter at {tmp_path}/bin/python" in capsys.readouterr().out


@pytest.mark.skipif(
    not os.path.exists(os.path.join(os.environ.get(peers.ENV_VAR, "/nonexistent"), "bin", "python")),
    reason=f"no peers' venv: set {peers.ENV_VAR}=DIR after `python -m mpreplay.bench.peers --setup DIR`",
)
def test_with_the_peers_venv_torchrl_prioritized_slice_sampler_is_timed_and_judged(capsys):
    assert seq.main(["--quick", "--repeats", "1", "--peers", os.environ[peers.ENV_VAR]]) == 0
    out = capsys.readouterr().out
    assert "│ TorchRL PrioritizedSliceSampler" in out or "\nTorchRL PrioritizedSliceSampler" in out
    assert "not measured" not in out


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

"""Smoke tests of ``mpreplay bench learner``: it runs and reports; no timing is asserted."""

import re

import pytest

pytest.importorskip("torch", reason="bench learner trains a torch network (pip install '.[torch]')")

from mpreplay.bench import learner


def test_a_short_run_reports_every_way_and_the_ratio_to_the_target(capsys):
    assert (
        learner.main(["--capacity", "600", "--batch-size", "32", "--steps", "3", "--rounds", "1", "--train-ms", "1"])
        == 0
    )
    out = capsys.readouterr().out
    for way in ("train", "sample", "in turn", "prefetched"):
        assert re.search(rf"{way}\s*[│ ]\s*\d+\.\d\d", out), way
    for what in ("uncompressed", r"compressed \(next_of \+ stack_compress\)"):
        assert re.search(
            rf"\n{what}: prefetched / max\(train, sample\) = \d+\.\d\d \(target <= 1.1: (met|not met)\)", out
        ), what

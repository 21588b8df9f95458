"""The command line's own behaviour, apart from what each command shows (see test_monitor, test_bench*)."""

from __future__ import annotations

import re
import sys

import pytest

import mpreplay
from mpreplay import cli


def test_version_prints_the_package_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"mpreplay {mpreplay.__version__}\n"


def test_help_is_plain_text_with_no_restructuredtext_markup(capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert "usage: mpreplay" in out
    assert not re.search(r":(mod|func|class|meth):|``", out), out


def test_a_bench_whose_library_is_missing_names_it_and_exits_1(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "mpreplay.bench.learner", raising=False)
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "learner"])
    assert exc.value.code == 1
    assert "mpreplay bench learner needs the Python package 'torch'" in capsys.readouterr().err

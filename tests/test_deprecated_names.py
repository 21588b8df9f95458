"""What 0.2.0 and this round removed keeps working for a minor version, with a
``DeprecationWarning`` naming the replacement (docs/stability.md)."""

from __future__ import annotations

import importlib
import sys

import numpy as np
import pytest

import mpreplay

# Each removed module, the replacement its warning names, and the public names it had.
SHIMS = [
    (
        "mpreplay.buffer",
        "from mpreplay import",
        ["ReplayBuffer", "PrioritizedReplayBuffer", "MPReplayBuffer", "MPPrioritizedReplayBuffer", "BufferClosed"],
    ),
    (
        "mpreplay.sequence_buffer",
        "from mpreplay import",
        [
            "SequenceReplayBuffer",
            "PrioritizedSequenceReplayBuffer",
            "MPSequenceReplayBuffer",
            "MPPrioritizedSequenceReplayBuffer",
        ],
    ),
    ("mpreplay.storage", "mpreplay.compression", ["Compression", "FrameWriter", "with_next_fields"]),
    (
        "mpreplay.io",
        "mpreplay.fileformat",
        ["FORMAT_VERSION", "TransitionFileError", "inspect", "load_transitions", "read_metadata", "save_transitions"],
    ),
]


def import_afresh(name: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delitem(sys.modules, name, raising=False)
    return importlib.import_module(name)


@pytest.mark.parametrize("name, replacement, names", SHIMS, ids=[shim[0] for shim in SHIMS])
def test_a_removed_module_imports_with_a_warning_naming_its_replacement(name, replacement, names, monkeypatch):
    with pytest.warns(DeprecationWarning, match=rf"{name} is deprecated .* use {replacement}"):
        module = import_afresh(name, monkeypatch)
    assert sorted(module.__all__) == sorted(names)
    assert all(hasattr(module, attribute) for attribute in names)


def test_the_buffer_classes_of_a_removed_module_are_the_current_ones(monkeypatch):
    with pytest.warns(DeprecationWarning):
        old = import_afresh("mpreplay.buffer", monkeypatch)
    assert old.PrioritizedReplayBuffer is mpreplay.PrioritizedReplayBuffer


def test_save_transitions_safe_warns_and_writes_the_same_file(tmp_path):
    rb = mpreplay.ReplayBuffer(8, {"obs": {"shape": 2}})
    rb.add(obs=np.ones((3, 2)))
    with pytest.warns(DeprecationWarning, match=r"save_transitions\(safe=\) is deprecated"):
        rb.save_transitions(tmp_path / "old.npz", safe=True)
    loaded = mpreplay.ReplayBuffer(8, {"obs": {"shape": 2}})
    assert loaded.load_transitions(tmp_path / "old.npz") == 3
    np.testing.assert_array_equal(loaded.get_all_transitions()["obs"], np.ones((3, 2)))
    rb.close()
    loaded.close()


def test_the_old_module_functions_save_and_load_a_buffer(tmp_path, monkeypatch):
    with pytest.warns(DeprecationWarning):
        old_io = import_afresh("mpreplay.io", monkeypatch)
    rb = mpreplay.PrioritizedReplayBuffer(8, {"obs": {}})
    rb.add(obs=np.arange(4.0))
    old_io.save_transitions(rb, tmp_path / "rows.npz")
    loaded = mpreplay.PrioritizedReplayBuffer(8, {"obs": {}})
    assert old_io.load_transitions(loaded, tmp_path / "rows.npz") == 4
    rb.close()
    loaded.close()

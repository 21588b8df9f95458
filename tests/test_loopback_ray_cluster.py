"""LoopbackRayCluster starts wherever the user's temporary folder is, however deep."""

from __future__ import annotations

import os
import signal
import tempfile

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120, method="thread")]


def test_a_cluster_starts_and_leaves_nothing_behind_under_a_tmpdir_too_deep_for_rays_sockets(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    from mpreplay.testing import LoopbackRayCluster

    deep = tmp_path / ("d" * 50) / ("e" * 50)  # Ray's socket paths under it would pass 107 bytes
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again
    assert tempfile.gettempdir() == str(deep)
    with LoopbackRayCluster(1):
        assert ray.get(ray.put(41)) + 1 == 42
    assert os.listdir(deep) == []


def test_the_signal_handlers_the_process_had_are_back_once_the_cluster_is_gone():
    ray = pytest.importorskip("ray")
    from mpreplay.testing import LoopbackRayCluster

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    with LoopbackRayCluster(1):
        assert ray.is_initialized()
    assert {sig: signal.getsignal(sig) for sig in before} == before

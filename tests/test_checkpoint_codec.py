"""Deflated checkpoints (``checkpoint(compress=True)``): each chunk one raw deflate stream, ISA-L's
or zlib's -- either inflates what the other wrote --, smaller than the table's memory, described
by ``mpreplay inspect``, and refused by name when a stream is damaged."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from helpers import TAGGED_STACK_FIELDS, segments_of, tagged_episode

import mpreplay
from mpreplay import CheckpointError, Table
from mpreplay.checkpoint_codec import CODECS, deflate, inflate

pytestmark = pytest.mark.timeout(120, method="thread")

BOTH = ("isal", "zlib")


def _installed(name: str) -> str:
    if name not in CODECS:
        pytest.skip(f"{name}'s deflate is not installed (the checkpoint extra brings ISA-L's)")
    return name


def _frames(n: int = 300) -> bytes:
    """Bytes like a table's frames: mostly a dark background, some blocks of a few values."""
    rng = np.random.default_rng(5)
    frames = np.zeros((n, 84, 84), dtype=np.uint8)
    for k in range(n):
        y, x = rng.integers(0, 70, 2)
        frames[k, y : y + 14, x : x + 14] = rng.integers(0, 4, (14, 14)) * 60
    return frames.tobytes()


@pytest.mark.parametrize(("writer", "reader"), list(itertools.product(BOTH, BOTH)))
def test_a_stream_deflated_by_either_implementation_inflates_by_either(writer, reader):
    data = _frames()
    stream = deflate(data, using=_installed(writer))
    assert len(stream) < len(data) // 4
    assert inflate(stream, len(data), using=_installed(reader)) == data


@pytest.mark.parametrize("using", BOTH)
def test_inflate_refuses_a_stream_cut_short_followed_by_other_bytes_or_of_another_length(using):
    data = _frames(40)
    stream = deflate(data, using=_installed(using))
    with pytest.raises(ValueError, match="not one whole deflate stream"):
        inflate(stream[:-3], len(data), using=using)
    with pytest.raises(ValueError, match="not one whole deflate stream"):
        inflate(stream + b"\0", len(data), using=using)
    with pytest.raises(ValueError, match=f"a deflate stream of {len(data) - 1} bytes, expected {len(data)}"):
        inflate(deflate(data[:-1], using=using), len(data), using=using)
    with pytest.raises(ValueError, match="not one whole deflate stream"):  # longer than expected
        inflate(stream, len(data) - 1, using=using)


def test_inflate_refuses_bytes_that_are_not_deflate():
    with pytest.raises(ValueError, match="not a deflate stream"):
        inflate(b"\xff" * 64, 100)


def test_an_implementation_not_installed_is_refused_by_name():
    with pytest.raises(ValueError, match=r"using: expected one of the deflate implementations installed .*'lz4'"):
        deflate(b"abc", using="lz4")


def _table() -> Table:
    """A compressed table of mostly dark frames, sampled from."""
    table = Table(256, TAGGED_STACK_FIELDS, next_of="obs", stack_compress="obs", selector="prioritized", seed=4)
    for e in range(8):
        steps = tagged_episode(0, e, 30, rng=np.random.default_rng(e))
        steps["obs"] &= 3
        steps["next_obs"] &= 3
        table.add(**{name: steps[name] for name in TAGGED_STACK_FIELDS}, timeout=0)
    table.sample(8, timeout=0)
    return table


def _same(a: Table, b: Table) -> None:
    x, y = a.get_all_transitions(indexes=True), b.get_all_transitions(indexes=True)
    assert x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x)
    assert all(np.array_equal(p, q) for p, q in zip(a.sample(16)["indexes"], b.sample(16)["indexes"], strict=True))


def test_a_deflated_checkpoint_is_smaller_than_the_raw_one_and_restores_the_same_table(tmp_path):
    with _table() as table:
        raw = table.checkpoint(tmp_path / "raw")
        deflated = table.checkpoint(tmp_path / "deflated", compress=True)
        assert raw["compression"] is None and deflated["compression"]["format"] == "deflate"
        assert deflated["data_nbytes"] < raw["data_nbytes"] // 2
        assert (tmp_path / "deflated" / "data.bin").stat().st_size == deflated["data_nbytes"]
        with mpreplay.restore(tmp_path / "deflated", shared=False) as restored:
            _same(table, restored)


def test_a_checkpoint_deflated_by_zlib_restores_the_table_as_one_deflated_by_the_default(tmp_path):
    """The chunks of a deflated checkpoint deflated again by zlib (where they lie, how many bytes:
    the manifest's records, signed again) restore the same table: restoring inflates with whichever
    implementation is installed."""
    with _table() as table:
        table.checkpoint(tmp_path / "ck", compress=True)
        manifest = tmp_path / "ck" / "manifest.json"
        doc = json.loads(manifest.read_text())
        old = (tmp_path / "ck" / "data.bin").read_bytes()
        new = bytearray()
        for entry in doc["arrays"]:
            for chunk in entry["chunks"]:
                n, _, at, stored = chunk
                stream = deflate(inflate(old[at : at + stored], n), using="zlib")
                chunk[2:] = [len(new), len(stream)]
                new += stream
        (tmp_path / "ck" / "data.bin").write_bytes(bytes(new))
        del doc["checksum"]
        doc.update(data_nbytes=len(new), compression={"format": "deflate", "by": "zlib"})
        doc["checksum"] = zlib.crc32(json.dumps(doc, sort_keys=True).encode())
        manifest.write_text(json.dumps(doc))
        with mpreplay.restore(tmp_path / "ck", shared=True) as restored:
            _same(table, restored)


def test_inspect_says_a_checkpoint_is_deflated_and_by_how_much(tmp_path):
    with _table() as table:
        doc = table.checkpoint(tmp_path / "ck", compress=True)
    raw = sum(c[0] for e in doc["arrays"] for c in e["chunks"])
    out = subprocess.run(
        [sys.executable, "-m", "mpreplay", "inspect", str(tmp_path / "ck")], capture_output=True, text=True, check=True
    ).stdout
    by = doc["compression"]["by"]
    ratio = raw / doc["data_nbytes"]
    assert f"compression: deflate by {by}, {raw / 2**20:.1f} MiB stored in" in out
    assert f"(ratio {ratio:.1f}x)" in out and "arrays (MiB as in memory, then as stored):" in out


def test_compress_other_than_a_bool_is_refused_by_name_and_writes_nothing(tmp_path):
    with _table() as table:
        before = table.get_all_transitions(indexes=True)
        with pytest.raises(TypeError, match="compress: expected a bool, got 'yes'"):
            table.checkpoint(tmp_path / "ck", compress="yes")
        assert list(tmp_path.iterdir()) == []
        after = table.get_all_transitions(indexes=True)
        assert all(np.array_equal(before[k], after[k]) for k in before)


def _damaged(path: Path, match: str) -> None:
    before = segments_of(os.getpid())
    with pytest.raises(CheckpointError, match=match):
        mpreplay.restore(path)
    assert segments_of(os.getpid()) == before


def test_a_deflated_chunk_moved_in_the_file_is_refused_naming_it(tmp_path):
    """Stored bytes that do not follow one another from the data's start (a manifest that says
    chunk 0 begins later, signed again) are refused before any is inflated."""
    with _table() as table:
        table.checkpoint(tmp_path / "ck", compress=True)
    manifest = tmp_path / "ck" / "manifest.json"
    doc = json.loads(manifest.read_text())
    first = min((c[2], e["name"], j) for e in doc["arrays"] for j, c in enumerate(e["chunks"]))
    entry = next(e for e in doc["arrays"] if e["name"] == first[1])
    entry["chunks"][first[2]][2] += 1
    del doc["checksum"]
    doc["checksum"] = zlib.crc32(json.dumps(doc, sort_keys=True).encode())
    manifest.write_text(json.dumps(doc))
    name, j = first[1:]
    _damaged(tmp_path / "ck", rf"array '{name}', chunk {j} .*its stored bytes begin at 1, not at the data.s start")

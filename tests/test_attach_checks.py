"""A handle attaches only to a segment whose manifest describes the layout it computes: another
mpreplay version, another layout or a damaged manifest raise IncompatibleSegmentError naming both
versions and the first difference, in a spawned or a forked child as in the creator.

These tests damage the manifest of a real segment in /dev/shm (attaching needs one) and put it back."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import random
from collections.abc import Callable
from typing import Any

import damage  # tests/damage.py: real segments and the fuzzers' damage
import pytest
from helpers import EACH_START_METHOD

import mpreplay
from mpreplay import IncompatibleSegmentError, SharedMemoryError, manifest
from mpreplay._ext.schema import OWNER_ARRAY, STATE_ARRAY

pytestmark = pytest.mark.timeout(120, method="thread")


OTHER_VERSION = "0.0.1+other"


def _attach_in_child(pickled: bytes, results: Any) -> None:
    try:
        handle = pickle.loads(pickled)
    except Exception as exc:  # the test says which it expected
        results.put((type(exc).__name__, str(exc)))
    else:
        handle.close()
        results.put(("attached", ""))


def _attach_in(method: str, pickled: bytes) -> tuple[str, str]:
    """``(exception name or "attached", message)`` of unpickling ``pickled`` in a child process."""
    ctx = mp.get_context(method)
    results = ctx.Queue()
    child = ctx.Process(target=_attach_in_child, args=(pickled, results))
    child.start()
    try:
        return results.get(timeout=60)
    finally:
        child.join(30)


def _shift_generation(d: dict[str, Any]) -> None:
    damage.entry(d, "generation")[3] += 64


@EACH_START_METHOD
def test_a_handle_refuses_a_segment_another_mpreplay_version_made_and_names_both_versions(method):
    other_version = damage.setting("mpreplay_version", OTHER_VERSION)
    with damage.prioritized() as buffer, damage.manifest_rewritten(buffer.name, other_version):
        kind, message = _attach_in(method, pickle.dumps(buffer))
    assert kind == "IncompatibleSegmentError", message
    assert f"made by mpreplay {OTHER_VERSION} (manifest format {manifest.VERSION})" in message
    assert f"this process runs mpreplay {mpreplay.__version__} (manifest format {manifest.VERSION})" in message


@EACH_START_METHOD
def test_a_handle_refuses_a_segment_of_another_layout_and_names_the_first_difference(method):
    with damage.prioritized() as buffer:
        offset = damage.entry(damage.document(damage.segment_bytes(buffer)), "generation")[3]
        with damage.manifest_rewritten(buffer.name, _shift_generation):
            kind, message = _attach_in(method, pickle.dumps(buffer))
    assert kind == "IncompatibleSegmentError", message
    assert (
        f"array 5: 'generation' of shape (64,) <u8 at offset {offset + 64} in the segment, "
        f"'generation' of shape (64,) <u8 at offset {offset} expected"
    ) in message


def _renamed(name: str, new: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: damage.entry(d, name).__setitem__(0, new)


def _dropped(name: str) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["arrays"].remove(damage.entry(d, name))


@EACH_START_METHOD
@pytest.mark.parametrize(
    "change, found, expected",
    [(_renamed(OWNER_ARRAY, "owners"), "owners", OWNER_ARRAY), (_dropped(STATE_ARRAY), "tree", STATE_ARRAY)],
    ids=["renamed", "dropped"],
)
def test_a_handle_refuses_a_segment_whose_list_of_arrays_differs_and_names_the_array(method, change, found, expected):
    with damage.prioritized() as buffer:
        arrays = damage.document(damage.segment_bytes(buffer))["arrays"]
        at = [entry[0] for entry in arrays].index(expected)
        offset = arrays[at][3]
        with damage.manifest_rewritten(buffer.name, change):
            kind, message = _attach_in(method, pickle.dumps(buffer))
    assert kind == "IncompatibleSegmentError", message
    assert f"array {at}: {found!r} of shape" in message
    assert f"{expected!r} of shape (64,) {arrays[at][2]} at offset {offset} expected" in message


@pytest.mark.parametrize(
    "change, found",
    [
        (damage.setting("version", manifest.VERSION + 1), f"manifest format {manifest.VERSION + 1}"),
        (lambda d: d["fields"]["obs"].__setitem__("shape", [5]), "'fields' is {'obs': {'shape': [5],"),
        (damage.setting("class", "MPReplayBuffer"), "'class' is 'MPReplayBuffer' in the segment"),
        (damage.setting("nbytes", 10**6), "the manifest describes 1000000 bytes, the segment holds"),
        (damage.DAMAGE["dtype-byte-flip"], "dtype ',i8' is not a numeric dtype"),
    ],
    ids=["format", "fields", "class", "size", "damaged"],
)
def test_a_handle_refuses_a_segment_whose_manifest_differs_in_any_entry(change, found):
    with (
        damage.prioritized() as buffer,
        damage.manifest_rewritten(buffer.name, change),
        pytest.raises(IncompatibleSegmentError, match="refusing to attach") as refused,
    ):
        pickle.loads(pickle.dumps(buffer))
    assert found in str(refused.value) and isinstance(refused.value, SharedMemoryError)


def _read_by_older_installs(head: bytes) -> bool:
    """Whether ``head`` claims the manifest format older mpreplay installs read (1): such a damaged
    manifest must not sit in /dev/shm, where their ``mpreplay ls`` would read it."""
    try:
        document = damage.document(head)
    except (ValueError, RecursionError):
        return False
    return isinstance(document, dict) and document.get("version") == 1


def _compared(head: bytes) -> dict[str, Any]:
    """What an attaching handle compares of a manifest: all but its owner and creation time."""
    return {key: value for key, value in damage.document(head).items() if key not in ("owner", "created")}


def test_a_handle_attaches_or_refuses_whatever_its_segments_manifest_holds():
    rng = random.Random("attach")
    with damage.prioritized() as buffer:
        pickled = pickle.dumps(buffer)
        fd = os.open(damage.path(buffer.name), os.O_RDWR)
        original = os.pread(fd, manifest.NBYTES, 0)
        try:
            for _ in range(1000):
                damaged = damage.damaged_manifest(original, rng)
                if _read_by_older_installs(damaged):
                    continue
                os.pwrite(fd, damaged, 0)
                try:
                    handle = pickle.loads(pickled)
                except IncompatibleSegmentError:
                    continue
                handle.close()
                # Only the owner and the creation time are the segment's own: nothing else changed.
                assert _compared(damaged) == _compared(original)
        finally:
            os.pwrite(fd, original, 0)
            os.close(fd)
        with pickle.loads(pickled) as handle:
            assert handle.get_stored_size() == 40

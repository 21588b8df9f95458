"""Segments and files are shared across patch versions: the manifest and file formats decide,
not the package version (docs/stability.md).  The other version here is this code with another
``__version__``, installed as a package of its own in a temporary folder and run in a child
interpreter: what a fleet mid-upgrade from X.Y.W to X.Y.Z runs, as far as the check can tell."""

from __future__ import annotations

import base64
import contextlib
import pickle
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import mpreplay
from mpreplay import IncompatibleSegmentError

pytestmark = pytest.mark.timeout(180, method="thread")

# The child: a shared buffer of one row, pickled (its handle) to stdout; it keeps the segment
# until its stdin closes.  With a file argument it saves the row there instead.
CREATOR = """
import base64, pickle, sys
import numpy as np
import mpreplay
rb = mpreplay.MPPrioritizedReplayBuffer(16, {"obs": {"shape": 2}}, alpha=0.6)
rb.add(obs=np.array([1.0, 2.0]), priorities=3.0)
if len(sys.argv) > 1:
    rb.save_transitions(sys.argv[1])
print(mpreplay.__version__, base64.b64encode(pickle.dumps(rb)).decode(), flush=True)
sys.stdin.read()
rb.close()
"""


def other_version(ours: str, *, patch: bool) -> str:
    """Another patch version of ``ours`` (``patch``) or the next minor version."""
    major, minor, micro = (int(part) for part in re.match(r"(\d+)\.(\d+)\.(\d+)", ours).groups())
    return f"{major}.{minor}.{micro + 7}" if patch else f"{major}.{minor + 1}.0"


@pytest.fixture
def installed_as(tmp_path: Path):
    """A copy of the mpreplay under test whose ``__version__`` is the one given: its folder."""

    def install(version: str) -> Path:
        root = tmp_path / version
        shutil.copytree(Path(mpreplay.__file__).parent, root / "mpreplay", ignore=shutil.ignore_patterns("__pycache__"))
        (root / "mpreplay" / "_version.py").write_text(f'__version__ = "{version}"\n')
        return root

    return install


@contextlib.contextmanager
def created_by(root: Path, *args: str) -> Iterator[tuple[str, bytes]]:
    """Run the creator from the package at ``root``: yields its version and its buffer's pickle
    while the child holds the segment."""
    child = subprocess.Popen(
        [sys.executable, "-c", CREATOR, *args],
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        version, pickled = child.stdout.readline().split()
        yield version, base64.b64decode(pickled)
    finally:
        child.stdin.close()
        assert child.wait(60) == 0


def test_a_handle_attaches_to_a_segment_another_patch_version_made(installed_as):
    theirs = other_version(mpreplay.__version__, patch=True)
    with created_by(installed_as(theirs)) as (version, pickled):
        assert version == theirs
        handle = pickle.loads(pickled)
        batch = handle.sample(1, beta=0.4)
        np.testing.assert_array_equal(batch["obs"], [[1.0, 2.0]])
        handle.close()


def test_a_handle_refuses_a_segment_another_minor_version_made_naming_both(installed_as):
    theirs = other_version(mpreplay.__version__, patch=False)
    with created_by(installed_as(theirs)) as (_, pickled), pytest.raises(IncompatibleSegmentError) as refused:
        pickle.loads(pickled)
    message = str(refused.value)
    assert f"made by mpreplay {theirs}" in message and f"this process runs mpreplay {mpreplay.__version__}" in message
    assert "within a minor version only" in message


def test_a_file_another_patch_version_saved_loads(installed_as, tmp_path):
    theirs = other_version(mpreplay.__version__, patch=True)
    with created_by(installed_as(theirs), str(tmp_path / "rows.npz")):
        pass
    rb = mpreplay.PrioritizedReplayBuffer(16, {"obs": {"shape": 2}})
    assert rb.load_transitions(tmp_path / "rows.npz") == 1
    np.testing.assert_array_equal(rb.get_all_transitions()["obs"], [[1.0, 2.0]])
    rb.close()

"""A quick check that an installed mpreplay works: run it from outside a checkout.

    python tools/smoke.py [--installed]

It imports mpreplay and its compiled kernels; a spawned process attaches to an
MPPrioritizedReplayBuffer and writes rows into it, which this process then finds there, samples
and re-prioritizes; the rows go through save_transitions and load_transitions into another buffer
and come back the same.  Any failure raises.  ``--installed`` also requires mpreplay to be
imported from this interpreter's site-packages, not from a checkout on sys.path.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import sys
import sysconfig
import tempfile

import numpy as np

ROWS = 500
# Every field of a row encodes the row's id, so a row mixed from two writes is visible.
ENV = {"obs": {"shape": (8,), "dtype": np.float32}, "id": {"dtype": np.int64}, "rew": {}}


def rows(ids: np.ndarray) -> dict[str, np.ndarray]:
    return {"obs": np.repeat(ids[:, None], 8, axis=1).astype(np.float32), "id": ids, "rew": ids.astype(np.float64)}


def write(buffer) -> None:
    """The child: attach (the buffer arrives as a handle) and add ROWS rows, in batches and alone."""
    ids = np.arange(ROWS, dtype=np.int64)
    buffer.add(**rows(ids[:-1]), priorities=1.0 + ids[:-1] % 7)
    buffer.add(obs=np.full(8, ids[-1], np.float32), id=int(ids[-1]), rew=float(ids[-1]), priorities=3.0)
    buffer.close()


def expect(condition: bool, failure: str) -> None:
    """Raise with ``failure`` unless ``condition`` (not assert: it must hold under python -O too)."""
    if not condition:
        raise RuntimeError(f"smoke check failed: {failure}")


def check_rows(batch: dict[str, np.ndarray]) -> None:
    ids = batch["id"]
    expect(((ids >= 0) & (ids < ROWS)).all(), f"ids out of range: {ids}")
    expect((batch["obs"] == ids[:, None]).all() and (batch["rew"] == ids).all(), "a row mixes two transitions")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--installed",
        action="store_true",
        help="fail unless mpreplay is imported from this interpreter's site-packages",
    )
    args = parser.parse_args(argv)

    import mpreplay
    from mpreplay import MPPrioritizedReplayBuffer, PrioritizedReplayBuffer

    where = os.path.dirname(os.path.abspath(mpreplay.__file__))
    print(f"mpreplay {mpreplay.__version__} from {where}; Python {platform.python_version()}, numpy {np.__version__}")
    if args.installed:
        site = {os.path.realpath(sysconfig.get_paths()[key]) for key in ("purelib", "platlib")}
        expect(os.path.dirname(os.path.realpath(where)) in site, f"mpreplay imported from {where}, not from {site}")

    with MPPrioritizedReplayBuffer(1024, ENV, seed=0) as buffer:
        child = mp.get_context("spawn").Process(target=write, args=(buffer,), daemon=True)  # ended at exit if stuck
        child.start()
        child.join(timeout=120)
        expect(child.exitcode == 0, f"the writer process ended with {child.exitcode}")
        expect(buffer.get_stored_size() == ROWS, f"{buffer.get_stored_size()} rows stored, {ROWS} written")
        batch = buffer.sample(64, beta=0.4)
        check_rows(batch)
        weights = batch["weights"]
        expect(weights.shape == (64,) and ((weights > 0) & (weights <= 1)).all(), f"importance weights {weights}")
        buffer.update_priorities(batch["indexes"], np.full(64, 0.5))
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "rows.npz")
            buffer.save_transitions(path, priorities=True)
            copy = PrioritizedReplayBuffer(1024, ENV)
            copy.load_transitions(path)
        saved = buffer.get_all_transitions()
    loaded = copy.get_all_transitions()
    expect(set(loaded) == set(saved), f"fields {sorted(loaded)} loaded, {sorted(saved)} saved")
    for name in saved:
        expect(
            loaded[name].dtype == saved[name].dtype and np.array_equal(loaded[name], saved[name]),
            f"field {name!r} loaded differs from the one saved",
        )
    check_rows(copy.sample(64))
    print(f"smoke: ok ({ROWS} rows written by a spawned process, sampled, saved and loaded back)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The figures of ``mpreplay bench checkpoint`` (:mod:`mpreplay.bench.checkpoint`) and their tables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mpreplay.bench.apex_measures import print_table

__all__ = ["MB", "SLOW", "Case", "Deflated", "Waits", "report"]

MB = 1e6

SLOW = 0.050  # a call's seconds the target allows


@dataclass
class Waits:
    """The longest, the 99th and 99.9th percentiles of a call's seconds in a window, how many
    calls, and how many of them took over SLOW."""

    longest: float
    p99: float
    p999: float
    calls: int
    slow: int

    @classmethod
    def of(cls, seconds: np.ndarray) -> Waits:
        if not len(seconds):
            return cls(float("nan"), float("nan"), float("nan"), 0, 0)
        p99, p999 = np.percentile(seconds, [99, 99.9])
        return cls(float(seconds.max()), float(p99), float(p999), len(seconds), int((seconds > SLOW).sum()))


@dataclass
class Deflated:
    """``checkpoint(compress=True)`` of a case's table: the deflate implementation, the
    checkpoint's bytes, and the seconds of each run of the checkpoint and the restore."""

    by: str
    size: int
    checkpoint: list[float]
    restore: list[float]


@dataclass
class Case:
    capacity: int
    segment: int  # the table's memory, bytes
    size: int  # the checkpoint's bytes
    checkpoint: list[float]  # seconds, one per repeat
    restore: list[float]
    floor_write: list[float]
    floor_read: list[float]
    save_transitions: float | None  # seconds, None: not timed (a table above --save-max)
    save_bytes: int
    waits: dict[str, Waits]  # "<role> <window>"
    left_out: list[int]  # rows each live checkpoint left out
    cut: float  # the longest lock hold of a live checkpoint's cut, seconds
    live: int  # live checkpoints taken
    deflated: Deflated  # the same table checkpointed with compress=True
    reverb: dict[str, Any] | str | None = None  # Reverb's figures (reverb_checkpoint.py), why not, or not run


def _export(c: Case) -> str:
    if c.save_transitions is None:
        return "not timed"
    return f"{c.save_transitions:.2f} ({c.save_bytes / MB:,.0f} MB, {c.save_transitions / _median(c.checkpoint):.1f}x)"


def _median(seconds: list[float]) -> float:
    return float(np.median(seconds))


def _runs(c: Case, what: str, checkpoint: list[float], restore: list[float]) -> str:
    """Each run's seconds and ratios to its floor, in the order run."""

    def each(values: list[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    def ratios(a: list[float], b: list[float]) -> str:
        return " ".join(f"{x / y:.2f}" for x, y in zip(a, b, strict=True))

    return (
        f"capacity {c.capacity:,}{what}, each run: checkpoint s {each(checkpoint)}, write floor s "
        f"{each(c.floor_write)} (ratios {ratios(checkpoint, c.floor_write)}); restore s {each(restore)}, "
        f"read floor s {each(c.floor_read)} (ratios {ratios(restore, c.floor_read)})"
    )


def report(cases: list[Case]) -> None:
    """Print the tables of ``cases``' figures."""
    rows = []
    for c in cases:
        checkpoint, restore = _median(c.checkpoint), _median(c.restore)
        write, read = _median(c.floor_write), _median(c.floor_read)
        rows.append(
            [
                f"{c.capacity:,}",
                f"{c.segment / MB:,.0f}",
                f"{c.size / MB:,.0f} ({c.size / c.segment:.3f}x)",
                f"{checkpoint:.2f} ({c.size / MB / checkpoint:,.0f} MB/s)",
                f"{write:.2f} ({checkpoint / write:.2f}x)",
                f"{restore:.2f} ({c.size / MB / restore:,.0f} MB/s)",
                f"{read:.2f} ({restore / read:.2f}x)",
                _export(c),
            ]
        )
    print_table(
        "Checkpoint and restore (seconds, medians) against the disk's sequential write and cold read of the same bytes",
        [
            "capacity",
            "segment MB",
            "checkpoint MB",
            "checkpoint s",
            "write floor s (ratio)",
            "restore s",
            "read floor s (ratio)",
            "save_transitions s",
        ],
        rows,
    )
    for c in cases:
        print(_runs(c, "", c.checkpoint, c.restore))
    _report_deflated(cases)
    rows = []
    for c in cases:
        for name, w in c.waits.items():
            rows.append(
                [
                    f"{c.capacity:,}",
                    name,
                    f"{w.calls:,}",
                    f"{w.longest * 1e3:.1f}",
                    f"{w.p99 * 1e3:.2f}",
                    f"{w.p999 * 1e3:.2f}",
                    f"{w.slow:,}",
                ]
            )
    print_table(
        "Waits of a writer's add and a learner's sample + update (ms)",
        ["capacity", "call", "calls", "longest", "p99", "p99.9", f"over {SLOW * 1e3:.0f} ms"],
        rows,
    )
    _report_reverb(cases)
    for c in cases:
        print(
            f"capacity {c.capacity:,}: {c.live} live checkpoints, rows left out {c.left_out}, "
            f"longest cut (lock held) {c.cut * 1e3:.1f} ms"
        )


def _report_deflated(cases: list[Case]) -> None:
    """The deflated checkpoints' figures, against the same floors (the segment's bytes written and read)."""
    rows = []
    for c in cases:
        d = c.deflated
        checkpoint, restore = _median(d.checkpoint), _median(d.restore)
        rows.append(
            [
                f"{c.capacity:,}",
                d.by,
                f"{d.size / MB:,.1f} ({d.size / c.segment:.3f}x segment, {c.size / d.size:.1f}x smaller)",
                f"{checkpoint:.2f} ({checkpoint / _median(c.checkpoint):.2f}x raw)",
                f"{_median(c.floor_write):.2f} ({checkpoint / _median(c.floor_write):.2f}x)",
                f"{restore:.2f} ({restore / _median(c.restore):.2f}x raw)",
                f"{_median(c.floor_read):.2f} ({restore / _median(c.floor_read):.2f}x)",
            ]
        )
    print_table(
        "Deflated checkpoint (compress=True) and its restore (seconds, medians) against the same floors: "
        "the segment's bytes written and read cold",
        [
            "capacity",
            "deflate",
            "checkpoint MB",
            "checkpoint s",
            "write floor s (ratio)",
            "restore s",
            "read floor s (ratio)",
        ],
        rows,
    )
    for c in cases:
        print(_runs(c, " deflated", c.deflated.checkpoint, c.deflated.restore))


def _report_reverb(cases: list[Case]) -> None:
    """Reverb's figures beside mpreplay's, for the tables it ran."""
    rows, waits = [], []
    for c in cases:
        if isinstance(c.reverb, str):
            print(f"capacity {c.capacity:,}: Reverb not measured: {c.reverb}")
        if not isinstance(c.reverb, dict):
            continue
        r = c.reverb
        d = c.deflated
        live = r["live_checkpoints_s"]
        rows.append(
            [
                f"{c.capacity:,}",
                f"{r['stored']:,}",
                _against(r["checkpoint_bytes"] / MB, c.size / MB, d.size / MB, "{:,.1f}"),
                _against(r["checkpoint_s"], _median(c.checkpoint), _median(d.checkpoint)),
                _against(r["restore_s"], _median(c.restore), _median(d.restore)),
                f"{len(live)}, longest {max(live):.2f}",
            ]
        )
        for name, w in r["waits"].items():
            waits.append(
                [
                    f"{c.capacity:,}",
                    f"reverb {name}",
                    f"{w['calls']:,}",
                    f"{w.get('longest', float('nan')) * 1e3:.1f}",
                    f"{w.get('p99', float('nan')) * 1e3:.2f}",
                    f"{w.get('p999', float('nan')) * 1e3:.2f}",
                    f"{w.get('slow', 0):,}",
                ]
            )
    if not rows:
        return
    version = next(c.reverb["reverb"] for c in cases if isinstance(c.reverb, dict))
    print_table(
        f"Reverb {version} checkpointing the same transitions (obs + next_obs items); x: Reverb's over mpreplay's "
        "raw and deflated checkpoint's",
        ["capacity", "stored", "checkpoint MB", "checkpoint s", "restore s", "live checkpoints"],
        rows,
    )
    print_table(
        "Waits of Reverb's writer (one transition per call) and learner (sample 256 + mutate_priorities) (ms)",
        ["capacity", "call", "calls", "longest", "p99", "p99.9", f"over {SLOW * 1e3:.0f} ms"],
        waits,
    )


def _against(reverb: float, raw: float, deflated: float, form: str = "{:.2f}") -> str:
    """Reverb's figure and its ratios to mpreplay's raw and deflated checkpoint's."""
    return f"{form.format(reverb)} ({reverb / raw:.1f}x raw, {reverb / deflated:.1f}x deflated)"

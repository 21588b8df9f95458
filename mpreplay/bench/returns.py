"""Discounted cumulative sums and n-step folding vs scipy's lfilter, numba loops and numpy.

``mpreplay bench returns [--quick] [--repeat K] [--clock cpu|wall]``

Every figure is the median of repeated timings in this run; ratios compare
baselines with mpreplay (above 1 means mpreplay is faster).  Every method runs
on one thread, so the default clock is the CPU time of that thread, which
other load on the machine barely disturbs; ``--clock wall`` uses elapsed time.  ``np.cumsum`` of
the same array is the memory-bound floor a one-pass sum cannot beat by much.
The precision table is the largest absolute error of float32 results against
a float64 reference on the same (float32) inputs; lfilter computes in float64
and returns float64, so its result is rounded to float32 first.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable

import numpy as np

from mpreplay._ext import discount as _kernel
from mpreplay.bench._report import print_table
from mpreplay.returns import discounted_cumsum_left, discounted_cumsum_right, n_step_returns

GAMMA = 0.99
TARGETS = (
    "targets (reported, not asserted): N >= 1e4 within 1.2x of the numba loop and >= 3x faster than lfilter; "
    "(256, 1000) batch >= 10x faster than lfilter; n-step folding within 1.2x of a numba loop"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mpreplay bench returns", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes and few repeats")
    parser.add_argument("--repeat", type=int, default=None, help="timings per median (default 15, quick 5)")
    parser.add_argument("--clock", choices=sorted(_CLOCKS), default="cpu", help="what a timing measures")
    args = parser.parse_args(argv)
    repeat = args.repeat or (5 if args.quick else 15)
    clock = _CLOCKS[args.clock]
    print(f"clock: {args.clock} ({clock.__name__}); medians of {repeat} timings")
    baselines = _baselines()
    print(
        f"baselines found: {', '.join(n for n in ('lfilter', 'numba') if n in baselines) or 'none'}; "
        f"missing: {_missing(baselines)}"
    )
    sizes = [10**3, 10**4, 10**5] if args.quick else [10**3, 10**4, 10**5, 10**6, 10**7]
    print_table(
        "discounted cumulative sum, gamma=0.99 (median time; ratio = baseline / mpreplay)",
        *_speed_rows(sizes, (256, 100) if args.quick else (256, 1000), baselines, repeat, clock),
    )
    print_table("float32 precision, 10,000 steps, gamma=0.99 (L_inf vs float64 reference)", *_precision_rows(baselines))
    print_table(
        "n-step folding, float32 rewards, 1% dones, gamma=0.99 (median time)",
        *_n_step_rows(10**5 if args.quick else 10**6, baselines, repeat, clock),
    )
    print(TARGETS)
    return 0


# --- baselines ----------------------------------------------------------------------------------


def _baselines() -> dict[str, Callable]:
    """Sum functions ``f(x, right) -> y`` along the last axis, for what is installed."""
    found: dict[str, Callable] = {}
    try:
        from scipy.signal import lfilter
    except ImportError:
        pass
    else:

        def scipy_lfilter(x, right):
            if right:
                return lfilter([1.0], [1.0, -GAMMA], x[..., ::-1], axis=-1)[..., ::-1]
            return lfilter([1.0], [1.0, -GAMMA], x, axis=-1)

        found["lfilter"] = scipy_lfilter
    loops = _numba_loops()
    if loops is not None:
        found["numba"] = lambda x, right: loops[0](x, GAMMA, right)
        found["numba n-step into"] = loops[1]
    return found


def _missing(baselines: dict) -> str:
    return ", ".join(name for name in ("lfilter", "numba") if name not in baselines) or "none"


def _numba_loops():
    try:
        import numba
    except ImportError:
        return None

    @numba.njit(cache=False)
    def discounted(x, gamma, right):
        # The plain loop most code writes, accumulating in the array's dtype.
        y = np.empty_like(x)
        g = x.dtype.type(gamma)
        steps = x.shape[-1]
        for row in range(x.shape[0]):
            acc = x.dtype.type(0)
            for i in range(steps):
                t = steps - 1 - i if right else i
                acc = x[row, t] + g * acc
                y[row, t] = acc
        return y

    @numba.njit(cache=False)
    def n_step_into(rewards, dones, gamma, n, returns, discounts, steps):
        size = rewards.shape[0]
        for t in range(size):
            acc, power, m = 0.0, 1.0, 0
            while m < n and t + m < size:
                acc += power * rewards[t + m]
                power *= gamma
                m += 1
                if dones[t + m - 1]:
                    break
            returns[t], discounts[t], steps[t] = acc, power, m

    def discounted_any_rank(x, gamma, right):
        return discounted(x.reshape(-1, x.shape[-1]), gamma, right).reshape(x.shape)

    return discounted_any_rank, n_step_into


def _numpy_loop(x: np.ndarray, right: bool) -> np.ndarray:
    """Python loop over time, numpy across rows."""
    y = np.empty_like(x)
    acc = np.zeros(x.shape[:-1], x.dtype)
    steps = x.shape[-1]
    for t in range(steps - 1, -1, -1) if right else range(steps):
        acc = x[..., t] + x.dtype.type(GAMMA) * acc
        y[..., t] = acc
    return y


def _mpreplay(x: np.ndarray, right: bool) -> np.ndarray:
    return (discounted_cumsum_right if right else discounted_cumsum_left)(x, GAMMA)


# --- measurements -------------------------------------------------------------------------------


_CLOCKS = {"cpu": time.thread_time, "wall": time.perf_counter}


def _median_seconds(fn: Callable[[], object], repeat: int, clock: Callable[[], float]) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return float(np.median(times))


def _speed_rows(sizes, batch_shape, baselines, repeat, clock):
    names = ["mpreplay", *(n for n in ("numba", "lfilter") if n in baselines), "numpy loop", "np.cumsum"]
    ratio_names = [n for n in ("numba", "lfilter") if n in baselines]
    header = ["case", "dtype", "dir", *names, *(f"{n}/mp" for n in ratio_names)]
    rows = []
    rng = np.random.default_rng(0)
    cases = [(f"N={n:.0e}", rng.standard_normal(n)) for n in sizes]
    cases.append((f"batch {batch_shape[0]}x{batch_shape[1]}", rng.standard_normal(batch_shape)))
    for label, data in cases:
        for dtype in (np.float32, np.float64):
            x = data.astype(dtype)
            for right in (True, False):
                methods = {"mpreplay": _mpreplay, **{n: baselines[n] for n in ("numba", "lfilter") if n in baselines}}
                if x.size <= 10**4 or x.ndim == 2:
                    methods["numpy loop"] = _numpy_loop
                # Fewer repeats where one call already takes long enough for a stable median.
                reps = max(3, repeat // 3) if x.size >= 10**7 else repeat
                seconds = {
                    name: _median_seconds(functools.partial(f, x, right), reps, clock) for name, f in methods.items()
                }
                seconds["np.cumsum"] = _median_seconds(functools.partial(np.cumsum, x, axis=-1), reps, clock)
                rows.append(
                    [
                        label,
                        np.dtype(dtype).name,
                        "right" if right else "left",
                        *(_format_seconds(seconds.get(name)) for name in names),
                        *(f"{seconds[n] / seconds['mpreplay']:.2f}" for n in ratio_names),
                    ]
                )
    return header, rows


def _precision_rows(baselines):
    rng = np.random.default_rng(1)
    inputs = {"ones": np.ones(10_000, np.float32), "normal": rng.standard_normal(10_000).astype(np.float32)}
    methods = {"mpreplay": _mpreplay, **{n: baselines[n] for n in ("numba", "lfilter") if n in baselines}}
    methods["numpy loop"] = _numpy_loop
    header = ["method", *(f"{kind} {d}" for kind in inputs for d in ("right", "left"))]
    rows = []
    for name, f in methods.items():
        cells = []
        for x in inputs.values():
            for right in (True, False):
                exact = _numpy_loop(x.astype(np.float64), right)
                # lfilter hands back float64 for float32 input: judge what a float32 caller keeps.
                result = np.asarray(f(x, right)).astype(x.dtype)
                cells.append(f"{np.abs(result.astype(np.float64) - exact).max():.2e}")
        rows.append([name, *cells])
    return header, rows


def _n_step_rows(size, baselines, repeat, clock):
    """Folding into preallocated outputs, then whole calls that allocate them.

    Fresh output pages fault on first touch, and whether the allocator keeps
    freed pages between calls varies, so the whole-call figures mix the fold
    with the operating system's page-fault cost.
    """
    rng = np.random.default_rng(2)
    rewards = rng.standard_normal(size).astype(np.float32)
    dones = rng.random(size) < 0.01
    outputs = (np.empty_like(rewards), np.empty_like(rewards), np.empty(size, np.int64))
    into = baselines.get("numba n-step into")

    def numba_call(n):
        fresh = (np.empty_like(rewards), np.empty_like(rewards), np.empty(size, np.int64))
        into(rewards, dones, GAMMA, n, *fresh)
        return fresh

    def mpreplay_into(n):
        _kernel.n_step_fold(rewards[None], dones.view(np.uint8)[None], GAMMA, n, *(a[None] for a in outputs))

    header = ["n", "what", "mpreplay", "numba loop", "numba/mp"]
    rows = []
    for n in (3, 10):
        for what, mine, theirs in (
            ("fold into outputs", lambda n=n: mpreplay_into(n), lambda n=n: into(rewards, dones, GAMMA, n, *outputs)),
            ("whole call", lambda n=n: n_step_returns(rewards, dones, GAMMA, n), lambda n=n: numba_call(n)),
        ):
            mp = _median_seconds(mine, repeat, clock)
            nb = _median_seconds(theirs, repeat, clock) if into else None
            rows.append([str(n), what, _format_seconds(mp), _format_seconds(nb), f"{nb / mp:.2f}" if nb else "-"])
    return header, rows


# --- output -------------------------------------------------------------------------------------


def _format_seconds(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"

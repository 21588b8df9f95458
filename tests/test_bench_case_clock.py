"""The multi-process benchmarks' clock (mpreplay.bench.case_clock): what a case's processes report.

No figure is judged: a test checks what is counted, never how fast.
"""

from __future__ import annotations

import multiprocessing
import os
import time

import pytest

from mpreplay.bench import case_clock
from mpreplay.bench.mp_peers import window_of
from mpreplay.bench.peer_mp import window_json

pytestmark = pytest.mark.timeout(120, method="thread")
START_METHODS = ("fork", "spawn")
TIMING = case_clock.Timing(seconds=0.3, warmup=0.1, slices=3)


def _counting_child(conn) -> None:
    case_clock.serve_window(conn, lambda: ((lambda: None), 64))


def _failing_child(conn) -> None:
    def build():
        raise ValueError("this role cannot be built")

    case_clock.serve_window(conn, build)


def _busy_loop(conn) -> None:
    conn.recv()  # until told to stop
    conn.close()


@pytest.mark.parametrize("method", START_METHODS)
def test_every_child_reports_its_calls_at_every_mark(method):
    ctx = multiprocessing.get_context(method)
    window = case_clock.run_window(ctx, [("a", _counting_child, ()), ("b", _counting_child, ())], TIMING)
    assert len(window.reports) == 2
    for trace in window.reports:
        assert len(trace.counts) == TIMING.slices + 1
        assert trace.counts == sorted(trace.counts) and trace.counts[-1] > trace.counts[0]
        assert trace.cpu > 0


@pytest.mark.parametrize("method", START_METHODS)
def test_a_child_that_cannot_build_its_work_fails_the_case_with_its_traceback(method):
    ctx = multiprocessing.get_context(method)
    with pytest.raises(RuntimeError, match=r"(?s)broken failed:.*this role cannot be built"):
        case_clock.run_window(ctx, [("fine", _counting_child, ()), ("broken", _failing_child, ())], TIMING)


def test_a_local_unit_of_work_runs_to_the_same_marks_and_reports_last():
    ctx = multiprocessing.get_context("fork")
    calls = []
    window = case_clock.run_window(ctx, [("child", _counting_child, ())], TIMING, local=(lambda: calls.append(1), 8))
    mine = window.reports[-1]
    assert len(window.reports) == 2
    assert mine.counts[-1] == len(calls)
    assert all(b is not None for b in window.busy)


def test_a_watched_process_has_its_cpu_read_at_the_first_and_the_last_mark():
    ctx = multiprocessing.get_context("fork")
    mine, theirs = ctx.Pipe()
    server = ctx.Process(target=_busy_loop, args=(theirs,), daemon=True)
    server.start()
    try:
        window = case_clock.run_window(ctx, [("child", _counting_child, ())], TIMING, watch=[server.pid])
    finally:
        mine.send("stop")
        server.join(10)
    first, last = window.watched
    assert first is not None and last is not None
    assert last[0] >= first[0] and last[1] >= first[1]


def test_a_process_that_is_gone_has_no_cpu_figure():
    ctx = multiprocessing.get_context("fork")
    child = ctx.Process(target=time.sleep, args=(0,))
    child.start()
    child.join()
    assert case_clock.process_cpu(child.pid) is None
    assert case_clock.process_cpu(os.getpid()) is not None


def test_a_window_survives_the_workers_json_unchanged():
    ctx = multiprocessing.get_context("fork")
    window = case_clock.run_window(ctx, [("child", _counting_child, ())], TIMING, watch=[os.getpid()])
    again = window_of(window_json(window))
    assert again.marks == window.marks
    assert again.reports == window.reports
    assert again.busy == window.busy
    assert again.watched == window.watched

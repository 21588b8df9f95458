"""launch(): processes, ranks, results, failures, restarts, signals and clean-up."""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import EACH_START_METHOD, START_METHODS, segment_exists, segments_of

from mpreplay.launcher import ChildFailed, StopFlag, launch
from mpreplay.memory import Layout, SharedMemory
from mpreplay.params import ParameterStore


class Board:
    """A picklable handle on a shared int64 array: the tests' stand-in for a
    shared replay buffer (the creator owns the segment; a pickle attaches)."""

    def __init__(self, size: int, name: str | None = None):
        layout = Layout()
        layout.add("cells", (size,), np.int64)
        self.memory = SharedMemory(layout, name=name)
        self.cells = self.memory.arrays["cells"]  # stays readable after close: the mapping lives on
        self.name = self.memory.name

    def __reduce__(self):
        return Board, (len(self.cells), self.name)

    def close(self) -> None:
        self.memory.close()


def process_exists(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")  # a zombie still has an entry: it must be reaped too


@pytest.fixture
def assert_all_gone():
    """``assert_all_gone(pids, creator=None)``: none of ``pids`` is left, and /dev/shm holds
    the same segments of this process as when the test began (with ``creator``, a
    process that has ended: none of its segments)."""
    before = segments_of(os.getpid())

    def check(pids: list[int], creator: int | None = None) -> None:
        assert segments_of(creator or os.getpid()) == (set() if creator else before), "segments left in /dev/shm"
        assert [pid for pid in pids if pid and process_exists(pid)] == [], "processes left behind"
        assert multiprocessing.active_children() == []

    return check


def wait_until(condition, ctx, what: str) -> None:
    """For a learner: wait for a condition on shared state, giving up if the run stops."""
    while not condition():
        if ctx.stop.wait(0.005):
            raise RuntimeError(f"stopped while waiting for {what}")


def idle_actor(ctx):
    ctx.buffer.cells[ctx.rank] = os.getpid()
    ctx.stop.wait()


def deaf_actor(ctx):
    """Never looks at ctx.stop: only terminate() ends it."""
    ctx.buffer.cells[ctx.rank] = os.getpid()
    while True:
        time.sleep(0.01)


# ------------------------------------------------------------------ results


@pytest.mark.timeout(30)
@pytest.mark.parametrize("method", [*START_METHODS, "forkserver"])
def test_actors_get_ranks_0_to_n_minus_1_and_the_actor_count(method):
    board = Board(6)

    def actor(ctx):
        ctx.buffer.cells[ctx.rank] += 1
        ctx.buffer.cells[3 + ctx.rank] = ctx.num_actors

    launch(board, actors=(actor, 3), start_method=method)
    assert board.cells.tolist() == [1, 1, 1, 3, 3, 3]


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_run_without_learner_ends_when_every_actor_returns(method):
    board = Board(2)
    result = launch(board, actors=[lambda ctx: None, lambda ctx: None], start_method=method)
    assert result.reason == "actors"
    assert result.value is None


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_learner_return_value_comes_back(method):
    board = Board(1)

    def learner(ctx):
        return {"role": ctx.role, "weights": np.arange(4.0)}

    result = launch(board, learner=learner, start_method=method)
    assert result.reason == "learner"
    assert result.value["role"] == "learner"
    np.testing.assert_array_equal(result.value["weights"], np.arange(4.0))


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_lambdas_and_closures_run(method):
    board = Board(1)
    offset = 40  # captured by the closure below

    def actor(ctx):
        ctx.buffer.cells[ctx.rank] = offset + ctx.rank

    result = launch(board, actors=(actor, 1), learner=lambda ctx: offset * 2, start_method=method)
    assert result.value == 80
    assert board.cells.tolist() == [40]


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_args_follow_the_context(method):
    result = launch(Board(1), learner=lambda ctx, a, b: (a, b), args=(3, "x"), start_method=method)
    assert result.value == (3, "x")


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_params_reach_the_processes_as_ctx_params(method):
    store = ParameterStore({"w": np.zeros(3)})

    def learner(ctx):
        ctx.params.publish({"w": np.full(3, 7.0)})
        return ctx.params.version

    result = launch(Board(1), learner=learner, params=store, start_method=method, close=False)
    params, version = store.read()
    store.close()
    assert result.value == version == 1
    np.testing.assert_array_equal(params["w"], np.full(3, 7.0))


# ------------------------------------------------------------------ ending


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_timeout_stops_the_run_and_keeps_what_the_learner_returns_in_the_grace_period(method):
    def learner(ctx):
        ctx.stop.wait()
        return "returned after stop"

    result = launch(Board(1), learner=learner, timeout=0.3, start_method=method)
    assert result.reason == "timeout"
    assert result.value == "returned after stop"


@pytest.mark.timeout(30)
def test_timeout_0_stops_the_run_at_once():
    def learner(ctx):
        ctx.stop.wait()
        return "returned after stop"

    started = time.monotonic()
    result = launch(Board(1), learner=learner, timeout=0, start_method="fork")
    assert result.reason == "timeout"
    assert result.value == "returned after stop"
    assert time.monotonic() - started < 5.0  # well inside the grace period: nobody was killed


def test_stop_wait_with_timeout_0_does_not_wait():
    flag = StopFlag(multiprocessing.get_context("fork"))
    started = time.monotonic()
    assert flag.wait(0) is False
    assert time.monotonic() - started < 0.5
    flag.set()
    assert flag.wait(0) is True


def test_stop_wait_refuses_a_negative_timeout():
    with pytest.raises(ValueError, match="timeout: expected None"):
        StopFlag(multiprocessing.get_context("fork")).wait(-1)


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_a_process_setting_stop_ends_the_run(method):
    def actor(ctx):
        ctx.stop.set()

    result = launch(Board(1), actors=(actor, 1), learner=lambda ctx: ctx.stop.wait(), start_method=method)
    assert result.reason == "stopped"
    assert result.value is True


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_a_process_ignoring_stop_and_sigterm_is_killed(assert_all_gone, method):
    board = Board(1)

    def stubborn(ctx):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        ctx.buffer.cells[0] = os.getpid()
        while True:
            time.sleep(0.01)

    def learner(ctx):
        wait_until(lambda: ctx.buffer.cells[0] != 0, ctx, "the actor")

    launch(board, actors=(stubborn, 1), learner=learner, start_method=method, grace=0.1)
    assert_all_gone(board.cells.tolist())


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_resources_stay_open_with_close_false(method):
    board = Board(1)
    launch(board, learner=lambda ctx: None, start_method=method, close=False)
    assert segment_exists(board.name)
    board.close()
    assert not segment_exists(board.name)


@pytest.mark.timeout(30)
def test_signal_handlers_are_restored_after_the_run():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    launch(Board(1), learner=lambda ctx: None, start_method="fork")
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


@pytest.mark.timeout(60)
@pytest.mark.usefixtures("default_termination_signals")
def test_after_a_run_a_forked_child_stuck_in_c_still_ends_on_sigterm():
    board = Board(1)  # this process owns a segment: its SIGTERM handler unlinks it, guarded
    launch(board, learner=lambda ctx: None, start_method="fork")  # puts that handler back at the end
    child = multiprocessing.get_context("fork").Process(target=sum, args=(itertools.repeat(1),))
    child.start()
    try:
        time.sleep(0.5)  # into the endless sum, the GIL held, by then
        child.terminate()
        child.join(20)
        assert child.exitcode == -signal.SIGTERM
    finally:
        child.kill()
        child.join()
        board.close()


@pytest.mark.timeout(30)
def test_runs_outside_the_main_thread_without_touching_signals():
    results = []
    thread = threading.Thread(
        target=lambda: results.append(launch(Board(1), learner=lambda ctx: "from a thread", start_method="spawn"))
    )
    thread.start()
    thread.join()
    assert [r.value for r in results] == ["from a thread"]


# ------------------------------------------------------------------ failures


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_actor_exception_is_raised_with_role_rank_and_traceback(assert_all_gone, method):
    board = Board(3)

    def explode():
        raise ValueError("actor exploded")

    def actor(ctx):
        ctx.buffer.cells[ctx.rank] = os.getpid()
        if ctx.rank == 1:
            wait_until(ctx.buffer.cells.all, ctx, "every process")
            explode()
        ctx.stop.wait()

    def learner(ctx):
        ctx.buffer.cells[2] = os.getpid()
        ctx.stop.wait()

    with pytest.raises(ChildFailed) as failure:
        launch(board, actors=(actor, 2), learner=learner, start_method=method)
    assert (failure.value.role, failure.value.rank) == ("actor", 1)
    message = str(failure.value)
    assert message.startswith("actor 1 (pid ")
    assert "in explode" in message and "ValueError: actor exploded" in message
    assert_all_gone(board.cells.tolist())


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_learner_exception_is_raised_with_its_role(assert_all_gone, method):
    board = Board(1)

    def learner(ctx):
        wait_until(lambda: ctx.buffer.cells[0] != 0, ctx, "the actor")
        return {}["missing"]

    with pytest.raises(ChildFailed, match=r"(?s)^learner \(pid \d+\) raised.*KeyError: 'missing'") as failure:
        launch(board, actors=(idle_actor, 1), learner=learner, start_method=method)
    assert failure.value.role == "learner"
    assert_all_gone(board.cells.tolist())


def kill_actor_0(ctx) -> int:
    """For a learner: SIGKILL actor 0 once it has written its pid to cell 0; return that pid."""
    wait_until(lambda: ctx.buffer.cells[0] != 0, ctx, "actor 0")
    pid = int(ctx.buffer.cells[0])
    os.kill(pid, signal.SIGKILL)
    return pid


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_killed_actor_is_restarted_with_its_rank(assert_all_gone, method):
    board = Board(4)  # pid of the first start, rank and pid of the restart, learner pid

    def actor(ctx):
        if ctx.restarts == 0:
            ctx.buffer.cells[0] = os.getpid()
        else:
            ctx.buffer.cells[1:3] = ctx.rank, os.getpid()
        ctx.stop.wait()

    def learner(ctx):
        ctx.buffer.cells[3] = os.getpid()
        kill_actor_0(ctx)
        wait_until(lambda: ctx.buffer.cells[2] != 0, ctx, "the restarted actor")
        return "done"

    result = launch(board, actors=(actor, 1), learner=learner, max_restarts=1, start_method=method)
    assert (result.value, result.restarts) == ("done", {0: 1})
    assert board.cells[1] == 0  # the same rank
    assert_all_gone([board.cells[0], board.cells[2], board.cells[3]])


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_killed_actor_without_restart_fails_the_run(assert_all_gone, method):
    board = Board(2)

    def learner(ctx):
        ctx.buffer.cells[1] = os.getpid()
        kill_actor_0(ctx)
        ctx.stop.wait()

    with pytest.raises(ChildFailed, match=r"^actor 0 \(pid \d+\) was killed by SIGKILL; pass max_restarts") as failure:
        launch(board, actors=(idle_actor, 1), learner=learner, start_method=method)
    assert failure.value.exitcode == -signal.SIGKILL
    assert failure.value.remote_traceback is None
    assert_all_gone(board.cells.tolist())


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_restarts_stop_at_max_restarts(assert_all_gone, method):
    board = Board(1)

    def actor(ctx):
        os.kill(os.getpid(), signal.SIGKILL)

    with pytest.raises(ChildFailed, match=r"restarted 2 times \(max_restarts=2\)"):
        launch(board, actors=(actor, 1), learner=lambda ctx: ctx.stop.wait(), max_restarts=2, start_method=method)
    assert_all_gone([])


@pytest.mark.timeout(30)
@EACH_START_METHOD
def test_actor_exception_is_not_retried_even_with_restarts(method):
    def buggy(ctx):
        raise RuntimeError("a bug")

    with pytest.raises(ChildFailed, match="RuntimeError: a bug") as failure:
        launch(Board(1), actors=(buggy, 1), learner=lambda ctx: ctx.stop.wait(), max_restarts=5, start_method=method)
    assert failure.value.exitcode in (None, 1)  # reported before or after it exited, never restarted


# ------------------------------------------------------------------ arguments


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"actors": 3}, TypeError, "actors: expected a function"),
        ({"actors": (print, -1)}, ValueError, r"actors: the count in \(function, count\) must be >= 0"),
        ({"learner": "fn"}, TypeError, "learner: expected a function"),
        ({}, ValueError, "nothing to run"),
        ({"learner": print, "max_restarts": -1}, ValueError, "max_restarts: expected an integer >= 0"),
        ({"learner": print, "timeout": -1}, ValueError, r"timeout: expected None \(no limit\) or a finite number"),
        ({"learner": print, "timeout": float("nan")}, ValueError, "timeout: expected None"),
        ({"learner": print, "grace": -1.0}, ValueError, "grace: expected a finite number of seconds >= 0"),
        ({"learner": print, "grace": None}, TypeError, "grace: expected a finite number of seconds >= 0"),
        ({"learner": print, "args": [1]}, TypeError, "args: expected a tuple"),
        ({"learner": print, "start_method": "thread"}, ValueError, "start_method: expected one of"),
        ({"learner": print, "params": threading.Lock()}, TypeError, "buffer, params, args: cannot be pickled"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_starts_or_closes(kwargs, error, match):
    board = Board(1)
    with pytest.raises(error, match=match):
        launch(board, **kwargs)
    assert segment_exists(board.name)
    board.close()


# ------------------------------------------------------------------ signals

SCRIPT = textwrap.dedent("""
    import json, os, signal, sys
    import numpy as np
    from mpreplay.launcher import launch
    from mpreplay.params import ParameterStore
    from test_launcher import Board, deaf_actor, idle_actor, kill_actor_0, wait_until

    if __name__ == "__mp_main__" and os.environ["SCENARIO"] == "ctrl-c-at-import":
        os.killpg(0, signal.SIGINT)  # a spawned child, still importing, presses Ctrl-C for the whole group

    def say(line):
        # One write: a Ctrl-C between print's text and its newline would glue this line to the next one.
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()

    def report_and_wait(ctx):
        # Once the actor is up, tell the test which processes to check.
        ctx.buffer.cells[1] = os.getpid()
        wait_until(lambda: ctx.buffer.cells[0] != 0, ctx, "the actor")
        say(json.dumps({"pids": ctx.buffer.cells.tolist()}))
        ctx.stop.wait()

    def kill_and_finish(ctx):
        killed = kill_actor_0(ctx)
        wait_until(lambda: ctx.buffer.cells[0] != killed, ctx, "the restarted actor 0")
        return killed

    if __name__ == "__main__":
        scenario = os.environ["SCENARIO"]
        board, store = Board(2), ParameterStore({"w": np.zeros(4)})  # actor and learner pids; weights
        learner = kill_and_finish if scenario == "kill" else report_and_wait
        actor, grace = (deaf_actor, 600.0) if scenario == "deaf-actors" else (idle_actor, 2.0)
        try:
            result = launch(board, actors=(actor, 1), learner=learner, params=store, start_method=sys.argv[1],
                            max_restarts=1, grace=grace)
        except KeyboardInterrupt:
            say("interrupted")
            sys.exit(130)
        pids = board.cells.tolist() + [result.value]
        say(json.dumps({"pids": pids}))
""")


def start_script(tmp_path: Path, method: str, scenario: str) -> subprocess.Popen:
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = dict(
        os.environ,
        SCENARIO=scenario,
        PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]),
    )
    return subprocess.Popen(
        [sys.executable, str(script), method],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_ctrl_c_to_the_process_group_stops_everything_and_cleans_up(tmp_path, assert_all_gone, method):
    run = start_script(tmp_path, method, "report")
    started = json.loads(run.stdout.readline())
    os.killpg(run.pid, signal.SIGINT)  # what a terminal does: every process of the group gets it
    stdout, stderr = run.communicate(timeout=30)
    assert (run.returncode, stdout, stderr) == (130, "interrupted\n", "")  # no traceback from any child
    assert_all_gone(started["pids"], creator=run.pid)


@pytest.mark.timeout(60)
def test_ctrl_c_while_spawned_children_import_gives_no_child_tracebacks(tmp_path):
    # spawn only: the long start-up (a fresh interpreter importing) is spawn's.
    run = start_script(tmp_path, "spawn", "ctrl-c-at-import")
    stdout, stderr = run.communicate(timeout=30)
    assert (run.returncode, stdout.splitlines()[-1], stderr) == (130, "interrupted", "")


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_a_second_signal_skips_the_grace_period(tmp_path, assert_all_gone, method):
    run = start_script(tmp_path, method, "deaf-actors")  # actors that would use all of a 600 s grace period
    started = json.loads(run.stdout.readline())
    run.send_signal(signal.SIGINT)
    run.send_signal(signal.SIGTERM)  # another kind: two SIGINTs can merge into one delivery
    stdout, stderr = run.communicate(timeout=30)
    assert (run.returncode, stdout, stderr) == (130, "interrupted\n", "")
    assert_all_gone(started["pids"], creator=run.pid)


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_sigterm_to_the_parent_stops_everything_cleans_up_and_ends_it(tmp_path, assert_all_gone, method):
    run = start_script(tmp_path, method, "report")
    started = json.loads(run.stdout.readline())
    run.send_signal(signal.SIGTERM)
    stdout, stderr = run.communicate(timeout=30)
    assert (run.returncode, stdout, stderr) == (-signal.SIGTERM, "", "")
    assert_all_gone(started["pids"], creator=run.pid)


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"  # an orphan's zombie is init's to reap
    except FileNotFoundError:
        return False


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_children_die_with_a_parent_killed_before_it_can_clean_up(tmp_path, method):
    run = start_script(tmp_path, method, "report")
    started = json.loads(run.stdout.readline())
    run.kill()
    run.communicate(timeout=30)
    while any(running(pid) for pid in started["pids"]):  # bounded by the test's timeout
        time.sleep(0.01)


@pytest.mark.timeout(60)
@EACH_START_METHOD
def test_killed_and_restarted_actor_leaves_no_resource_tracker_warnings(tmp_path, assert_all_gone, method):
    run = start_script(tmp_path, method, "kill")
    stdout, stderr = run.communicate(timeout=30)
    assert (run.returncode, stderr) == (0, "")
    finished = json.loads(stdout)
    assert_all_gone(finished["pids"], creator=run.pid)

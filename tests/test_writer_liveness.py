"""Dead writers are recognised however pids were reused."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import time

import numpy as np
import pytest
from helpers import EACH_START_METHOD, OBS_OF_4

from mpreplay import MPReplayBuffer
from mpreplay._ext.processes import process_token, token_alive

ENV = OBS_OF_4
_LAST_PID = "/proc/sys/kernel/ns_last_pid"
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # the unit of a process start time


def _reserve_and_die(buffer) -> None:
    buffer.inspection().reserve(4)  # as if killed while copying its rows
    os._exit(0)


def _add(buffer) -> None:
    buffer.add(obs=np.full((4, 4), 5.0), timeout=10)


def _start_with_pid(pid: int) -> subprocess.Popen | None:
    """A stranger process that gets ``pid`` (Linux, with the right to set the next pid), or None.

    It starts in a later clock tick than the process that had the pid: a token tells processes
    apart by pid and start tick, and a real pid comes round only after the whole pid space has,
    never within the tick its last holder started in (forcing the next pid here can)."""
    time.sleep(2 * _TICK_S)
    for _ in range(20):
        try:
            with open(_LAST_PID, "w") as f:
                f.write(str(pid - 1))
        except OSError:
            return None
        proc = subprocess.Popen(["sleep", "60"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
    return None


def test_a_token_tells_a_process_from_a_later_one_with_its_pid():
    me = process_token(os.getpid())
    assert token_alive(me)
    assert not token_alive(me + (1 << 22))  # same pid, another start time


@EACH_START_METHOD
@pytest.mark.timeout(120)
def test_a_stranger_reusing_a_dead_writers_pid_does_not_block_writers(method):
    ctx = mp.get_context(method)
    with MPReplayBuffer(4, ENV) as buffer:
        dead = ctx.Process(target=_reserve_and_die, args=(buffer,))
        dead.start()
        dead.join(30)
        assert dead.exitcode == 0
        stranger = _start_with_pid(dead.pid)
        if stranger is None:
            pytest.skip(f"cannot choose the next pid here (writing {_LAST_PID} needs CAP_SYS_ADMIN)")
        try:
            writer = ctx.Process(target=_add, args=(buffer,))
            writer.start()
            writer.join(60)
            assert writer.exitcode == 0, "the writer waited for the stranger holding the dead writer's pid"
        finally:
            stranger.kill()
            stranger.wait()
        assert (buffer.get_all_transitions()["obs"] == 5.0).all()

# cython: language_level=3
"""Processes as a shared buffer sees them: writer tokens, liveness, a state to print.

Kernels and the library name writer processes by token (see docs/architecture.md,
"Concurrency protocol").
"""
import os


# Writers are named by a token, never by a bare pid: pids wrap around within
# minutes on a busy machine, so a dead writer's pid may belong to a stranger.
# A token packs the pid with the process's start time (clock ticks since boot),
# which no later process with the same pid shares.
cdef int _PID_BITS = 22  # pid_max is at most 2**22 on Linux
cdef int64_t _PID_MASK = (1 << _PID_BITS) - 1


def _process_stat(int pid):
    """``(state, start_time)`` of process ``pid`` from /proc, or None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


cpdef int64_t process_token(int pid) except? -1:
    """The token of the running process ``pid``: its pid and start time (just the pid without /proc)."""
    stat = _process_stat(pid)
    return pid if stat is None else (stat[1] << _PID_BITS) | pid


cpdef int64_t token_pid(int64_t token) noexcept:
    """The pid a writer token names."""
    return token & _PID_MASK


cpdef bint token_alive(int64_t token) except -1:
    """Whether the process a token names still runs: not gone, not a zombie, not a newer process with its pid."""
    cdef int64_t pid = token & _PID_MASK, start = token >> _PID_BITS
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    stat = _process_stat(pid)
    if stat is None:
        return True  # exists, but /proc cannot tell more
    return stat[0] not in (b"Z", b"X") and (start == 0 or stat[1] == start)


_STATES = {b"R": "running", b"S": "sleeping", b"D": "in uninterruptible sleep", b"T": "stopped",
           b"t": "stopped by a debugger", b"Z": "a zombie", b"X": "dead", b"I": "idle"}


cpdef str describe_process(int pid):
    """``"process 123 (stopped)"``: a pid with its state from /proc, for error messages."""
    stat = _process_stat(pid)
    state = "gone" if stat is None else _STATES.get(stat[0], stat[0].decode(errors="replace"))
    return f"process {pid} ({state})"

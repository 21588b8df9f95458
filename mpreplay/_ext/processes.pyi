# Types of the compiled module built from ext/processes.pyx (keep the two in step).

def process_token(pid: int) -> int:
    """The token of the running process ``pid``: its pid and start time (just the pid without /proc)."""

def token_pid(token: int) -> int:
    """The pid a writer token names."""

def token_alive(token: int) -> bool:
    """Whether the process a token names still runs: not gone, not a zombie, not a newer process with its pid."""

def describe_process(pid: int) -> str:
    """``"process 123 (stopped)"``: a pid with its state from /proc, for error messages."""

# Types of the compiled module built from ext/termination.pyx (keep the two in step).

def guard(sig: int) -> bool:
    """Make sure a process told to end by ``sig`` ends, its segments unlinked."""

def own(name: str) -> None:
    """Note that this process created segment ``name`` (as shm_open names it, with its leading slash)."""

def disown(name: str) -> None:
    """Forget segment ``name`` (this process unlinked it, or will not)."""

def owned() -> list[str]:
    """The names of the segments this process owns."""

def unlink_owned() -> list[str]:
    """Unlink every segment this process owns, and return their names."""

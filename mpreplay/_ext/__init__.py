"""Compiled kernels (built from ext/).

Importing this package checks that they are here: a checkout of the source
that was never built (or was built for another Python) has the Python files
of mpreplay but none of its kernels, and must say so -- in every process,
launched children included -- rather than fail later on some ``_ext`` module.
"""

import importlib.machinery
import os

# The kernels every buffer imports (setup.py builds every ext/*.pyx; a selector's kernel beyond
# these is checked when a buffer is built with it, see mpreplay/selectors.py).
KERNELS = (
    "schema",
    "processes",
    "sumtree",
    "selector",
    "remover",
    "fifo_remover",
    "uniform",
    "prioritized",
    "episode_state",
    "frame_planner",
    "frames",
    "episode",
    "sequences",
    "gate",
    "slots",
    "codec",
    "outputs",
    "handle_state",
    "table_parts",
    "writes",
    "gather",
    "draws",
    "table_handle",
    "calls",
    "lock",
    "thread_lock",
    "discount",
    "termination",
)


def _missing() -> list[str]:
    here = os.path.dirname(os.path.abspath(__file__))
    return [
        name
        for name in KERNELS
        if not any(
            os.path.exists(os.path.join(here, name + suffix)) for suffix in importlib.machinery.EXTENSION_SUFFIXES
        )
    ]


if _missing():
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    raise ImportError(
        f"mpreplay's compiled kernels ({', '.join(_missing())}) are missing from "
        f"{os.path.dirname(os.path.abspath(__file__))}: this is a source checkout that was not built "
        f"(or was built for another Python). Run: pip install -e {_root}"
    )

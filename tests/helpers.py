"""What several test files share: the start methods and buffer classes tests run under.

Import it as ``from helpers import ...``: pytest puts this folder on ``sys.path`` (the test files and
``conftest.py`` sit in it without an ``__init__.py``), from the repository's root or from a copy of
``tests/`` elsewhere, and a spawned child inherits that path.  Fixtures live in ``conftest.py``;
``damage.py`` holds what the damage tests share.
"""

from __future__ import annotations

import pytest

from mpreplay import PrioritizedReplayBuffer, ReplayBuffer

# -- what a test runs under ------------------------------------------------------------------------

# The start methods every multi-process test runs its children under.
START_METHODS = ("spawn", "fork")
# Runs the test once per start method, as its ``method`` argument.
EACH_START_METHOD = pytest.mark.parametrize("method", START_METHODS)


def uniform_and_prioritized(uniform: type, prioritized: type) -> pytest.MarkDecorator:
    """Runs the test with each class as its ``cls`` argument, ids ``uniform`` and ``prioritized``."""
    return pytest.mark.parametrize("cls", [uniform, prioritized], ids=["uniform", "prioritized"])


# Runs the test with each local buffer class as its ``cls`` argument.
EACH_BUFFER_CLASS = uniform_and_prioritized(ReplayBuffer, PrioritizedReplayBuffer)

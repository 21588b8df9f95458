"""Every public class's docstring teaches by example: an ``Examples`` section whose doctests
run here (and so in CI), in the order written, each class's in a namespace of its own."""

from __future__ import annotations

import doctest
import inspect

import pytest

import mpreplay

pytestmark = pytest.mark.timeout(120, method="thread")

# Public classes with no example of their own, and why: exceptions (raised, not built), base
# classes built through their subclasses, and what launch() builds and hands to its callers.
NO_EXAMPLE = {
    "BufferClosed": "an exception",
    "CorruptBufferError": "an exception",
    "CheckpointError": "an exception",
    "SharedMemoryError": "an exception",
    "IncompatibleSegmentError": "an exception",
    "TableGone": "an exception",
    "ReadOnlyError": "an exception",
    "ParameterStoreTimeout": "an exception",
    "ChildFailed": "an exception",
    "RateLimiter": "the base of MinSize and SampleToInsertRatio, which have examples",
    "ExactlyOnce": "the base of Queue and Stack, which have examples",
    "Context": "what launch() hands each child",
    "RunResult": "what launch() returns",
    "StopFlag": "what launch() makes",
    "NStepReturns": "what n_step_returns() returns",
}
CLASSES = [name for name in mpreplay.__all__ if inspect.isclass(getattr(mpreplay, name))]
TAUGHT = [name for name in CLASSES if name not in NO_EXAMPLE]


def test_the_list_of_classes_without_an_example_names_public_classes_only():
    assert set(NO_EXAMPLE) <= set(CLASSES)


@pytest.mark.parametrize("name", TAUGHT)
def test_a_public_class_has_an_examples_section(name):
    doc = inspect.getdoc(getattr(mpreplay, name)) or ""
    assert ">>> " in doc.partition("\nExamples\n--------\n")[2]


@pytest.mark.parametrize("name", TAUGHT)
def test_the_examples_of_a_public_class_run_as_written(name):
    tests = doctest.DocTestFinder(recurse=False).find(getattr(mpreplay, name), name, globs={})
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    report: list[str] = []
    for test in tests:
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0 and result.failed == 0, "".join(report)

"""The public API's signatures say what they take and return: no ``Any`` where a precise type
exists (a user's ``mypy --disallow-any-expr`` refuses every ``Any`` that reaches their code).  The
few that remain are listed here, each with why no precise type fits."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator

import pytest
from helpers import stability_modules

# Public callables whose parameters (or "return") are typed Any, and why.
ANY_ALLOWED = {
    # gymnasium is optional, and its observations and spaces are any nesting of arrays and dicts.
    "mpreplay.vector_env.VectorTransitions.__init__": {"env", "autoreset_mode"},
    "mpreplay.vector_env.VectorTransitions.reset": {"obs", "mask"},
    "mpreplay.vector_env.VectorTransitions.step": {"actions", "obs", "rewards", "terminated", "truncated", "infos"},
    "mpreplay.vector_env.VectorWriter.__init__": {"buffer"},  # a Table, or a writer of one
    "mpreplay.vector_spaces.env_dict": {"observation_space", "action_space"},
    # The launcher and the parameter store carry the user's own objects: any function's result,
    # any picklable buffer, weights of any array or tensor type.
    "mpreplay.launcher.launch": {"buffer", "actors", "learner", "params"},
    "mpreplay.supervision.Context.__init__": {"buffer", "params"},
    "mpreplay.supervision.RunResult.__init__": {"value"},
    "mpreplay.supervision.StopFlag.__init__": {"mp_context"},
    "mpreplay.params.ParameterStore.__init__": {"template"},
    "mpreplay.params.ParameterStore.publish": {"params"},
    "mpreplay.params.ParameterStore.read": {"out", "return"},
    "mpreplay.params.ParameterStore.read_if_newer": {"out", "return"},
    # Ray: actor handles, actor options and remote calls' results are Ray's, untyped.
    "mpreplay.sharded.server.ShardServer.describe": {"return"},
    "mpreplay.sharded.server.ShardServer.sample": {"return"},
    "mpreplay.sharded.server.ShardServer.save_transitions": {"args", "kwargs", "return"},
    "mpreplay.sharded.client.ShardedReplay.__init__": {"shards"},
    "mpreplay.sharded.client.ShardedReplay.add_shard": {"shard"},
    "mpreplay.sharded.client.ShardedReplay.stats": {"return"},
    "mpreplay.sharded.client.ShardedReplay.save_transitions": {"kwargs", "return"},
    "mpreplay.sharded.deploy.start_shard_servers": {"buffer", "actor_options", "return"},
    # JSON documents: a file's metadata record and a selector's options as the kernel takes them.
    "mpreplay.fileformat.read_metadata": {"return"},
    "mpreplay.table.Table.checkpoint": {"return"},  # the checkpoint's manifest
    "mpreplay.selectors.SelectorSpec.kernel_options": {"return"},
}


# cpprb's API, which mpreplay.compat.cpprb reproduces, is untyped: its buffers take cpprb's
# `**kwargs` and any layout cpprb reshapes.  The native API is the typed one.
UNTYPED_MODULES = {"mpreplay.compat.cpprb"}


def public_callables() -> Iterator[tuple[str, Callable[..., object]]]:
    """Every function of the public modules' ``__all__`` and every public method (and
    ``__init__``) of their classes, each once, by its qualified name."""
    seen: set[int] = set()
    for module_name in sorted(set(stability_modules("Public")) - UNTYPED_MODULES):
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj):
                members = [(f"{obj.__qualname__}.{key}", value) for key, value in vars(obj).items()]
                members = [(q, v.fget if isinstance(v, property) else v) for q, v in members]
                found = [(q, v) for q, v in members if callable(v) and not q.split(".")[-1].startswith("_")]
                found += [(q, v) for q, v in members if q.endswith(".__init__")]
            else:
                found = [(name, obj)] if callable(obj) else []
            for qualname, function in found:
                if id(function) not in seen and inspect.isfunction(function):
                    seen.add(id(function))
                    yield f"{function.__module__}.{qualname}", function


def any_typed(function: Callable[..., object]) -> set[str]:
    """The parameters (and "return") whose annotation names Any."""
    return {name for name, note in inspect.get_annotations(function).items() if "Any" in str(note)}


def test_the_public_api_has_callables_to_check():
    assert len(list(public_callables())) > 100


@pytest.mark.parametrize("qualname, function", list(public_callables()), ids=lambda x: x if isinstance(x, str) else "")
def test_a_public_signature_names_no_any_but_the_ones_listed(qualname, function):
    assert any_typed(function) <= ANY_ALLOWED.get(qualname, set()), (
        f"{qualname}: {sorted(any_typed(function) - ANY_ALLOWED.get(qualname, set()))} typed Any"
    )


def test_every_listed_exception_is_still_typed_any():
    # An entry whose Any was made precise goes from the list.
    found = dict(public_callables())
    stale = {q: sorted(names - any_typed(found[q])) for q, names in ANY_ALLOWED.items() if names - any_typed(found[q])}
    assert stale == {}

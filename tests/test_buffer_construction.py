"""What a local buffer is made of: its fields, capacity and options as given (cpprb's conventions
included), the arguments it refuses, and its arrays in files of their own (``mmap_prefix``)."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from helpers import EACH_BUFFER_CLASS, NUMBERED_FIELDS

from mpreplay import MPReplayBuffer, PrioritizedReplayBuffer, ReplayBuffer

ENV = NUMBERED_FIELDS


def test_missing_shape_means_scalar_and_missing_dtype_means_float32():
    buffer = ReplayBuffer(4, {"rew": {}, "obs": {"shape": 2}, "act": {"shape": (2, 3), "dtype": np.int16}})
    assert buffer.get_env_dict() == {
        "rew": {"shape": (), "dtype": np.float32},
        "obs": {"shape": (2,), "dtype": np.float32},
        "act": {"shape": (2, 3), "dtype": np.int16},
    }


def test_default_dtype_applies_to_fields_without_a_dtype():
    buffer = PrioritizedReplayBuffer(4, {"rew": {}, "act": {"dtype": np.int32}}, default_dtype=np.float64)
    assert buffer.get_env_dict()["rew"]["dtype"] == np.float64
    assert buffer.get_env_dict()["act"]["dtype"] == np.int32


@EACH_BUFFER_CLASS
def test_new_buffer_is_empty(cls):
    buffer = cls(6, ENV)
    assert (buffer.get_buffer_size(), buffer.get_stored_size(), buffer.get_next_index()) == (6, 0, 0)
    assert buffer.get_all_transitions()["obs"].shape == (0, 3)


@pytest.mark.parametrize("size", [1e3, 1000.0, np.float64(1000)], ids=["1e3", "float", "numpy-float"])
def test_an_integral_float_size_is_a_capacity(size):
    assert ReplayBuffer(size, ENV).get_buffer_size() == 1000


def test_the_env_dict_given_is_not_changed():
    env_dict = {"obs": {"shape": 3}, "rew": {}}
    copy = {name: dict(options) for name, options in env_dict.items()}
    ReplayBuffer(8, env_dict).add(obs=np.zeros(3), rew=1.0)
    assert env_dict == copy


def test_an_env_dict_cpprb_has_annotated_with_add_shape_is_accepted():
    env_dict = {"obs": {"shape": 3, "add_shape": np.array([-1, 3])}, "rew": {"add_shape": np.array([-1, 1])}}
    buffer = ReplayBuffer(8, env_dict)
    assert buffer.get_env_dict() == {
        "obs": {"shape": (3,), "dtype": np.float32},
        "rew": {"shape": (), "dtype": np.float32},
    }


def test_an_add_shape_that_disagrees_with_the_shape_is_refused():
    with pytest.raises(ValueError, match="add_shape"):
        ReplayBuffer(8, {"obs": {"shape": 3, "add_shape": [-1, 4]}})


_BAD_CONSTRUCTION = [
    pytest.param(dict(size=0), "size", id="size-zero"),
    pytest.param(dict(size=-4), "size", id="size-negative"),
    pytest.param(dict(size=4.5), "size", id="size-fraction"),
    pytest.param(dict(size=math.inf), "size", id="size-infinite"),
    pytest.param(dict(size="4"), "size", id="size-string"),
    pytest.param(dict(size=True), "size", id="size-bool"),
    pytest.param(dict(env_dict=None), "env_dict", id="env-dict-none"),
    pytest.param(dict(env_dict={}), "env_dict", id="env-dict-empty"),
    pytest.param(dict(env_dict=[("obs", {})]), "env_dict", id="env-dict-not-a-mapping"),
    pytest.param(dict(env_dict={"obs": 3}), "obs", id="env-dict-options-not-a-mapping"),
    pytest.param(dict(env_dict={"2obs": {}}), "2obs", id="env-dict-name-not-identifier"),
    pytest.param(dict(env_dict={"weights": {}}), "weights", id="env-dict-reserved-name"),
    pytest.param(dict(env_dict={"obs": {"shap": 3}}), "shap", id="env-dict-unknown-option"),
    pytest.param(dict(env_dict={"obs": {"shape": 0}}), "shape", id="env-dict-zero-dimension"),
    pytest.param(dict(env_dict={"obs": {"shape": (3, -1)}}), "shape", id="env-dict-negative-dimension"),
    pytest.param(dict(env_dict={"obs": {"shape": 2.5}}), "shape", id="env-dict-float-shape"),
    pytest.param(dict(env_dict={"obs": {"shape": (2.5,)}}), "shape", id="env-dict-float-dimension"),
    pytest.param(dict(env_dict={"obs": {"shape": "x"}}), "shape", id="env-dict-string-shape"),
    pytest.param(dict(env_dict={"obs": {"dtype": "nonsense"}}), "dtype", id="env-dict-unknown-dtype"),
    pytest.param(dict(env_dict={"obs": {"dtype": "U3"}}), "dtype", id="env-dict-string-dtype"),
    pytest.param(dict(env_dict={"obs": {"dtype": "M8[s]"}}), "dtype", id="env-dict-datetime-dtype"),
    pytest.param(dict(env_dict={"obs": {"dtype": object}}), "dtype", id="env-dict-object-dtype"),
    pytest.param(dict(default_dtype="nonsense"), "dtype", id="default-dtype-unknown"),
    pytest.param(dict(alpha=-0.5), "alpha", id="alpha-negative"),
    pytest.param(dict(alpha=math.nan), "alpha", id="alpha-nan"),
    pytest.param(dict(alpha=math.inf), "alpha", id="alpha-inf"),
    pytest.param(dict(alpha=None), "alpha", id="alpha-none"),
    pytest.param(dict(alpha="high"), "alpha", id="alpha-string"),
    pytest.param(dict(eps=-1e-3), "eps", id="eps-negative"),
    pytest.param(dict(eps=math.nan), "eps", id="eps-nan"),
    pytest.param(dict(eps=None), "eps", id="eps-none"),
]


@pytest.mark.parametrize("options, name", _BAD_CONSTRUCTION)
def test_bad_construction_raises_naming_the_argument(options, name):
    arguments = {"size": 8, "env_dict": ENV, **options}
    cls = PrioritizedReplayBuffer if {"alpha", "eps"} & set(options) else ReplayBuffer
    with pytest.raises((TypeError, ValueError), match=name):
        cls(arguments.pop("size"), arguments.pop("env_dict"), **arguments)


def test_an_unknown_new_priority_rule_is_refused_by_name():
    with pytest.raises(ValueError, match="new_priority: expected one of 'max_stored', 'max_ever', got 'max'"):
        PrioritizedReplayBuffer(4, {"x": {}}, new_priority="max")


@pytest.mark.parametrize(
    "option, value", [("weights_dtype", np.int32), ("indexes_dtype", np.int32), ("indexes_dtype", "not a dtype")]
)
def test_an_unsupported_sample_dtype_is_refused_by_name(option, value):
    with pytest.raises(ValueError, match=f"{option}: expected one of the dtypes"):
        PrioritizedReplayBuffer(4, {"x": {}}, **{option: value})


def test_mmap_prefix_keeps_every_array_in_a_file_and_the_data_survives_close(tmp_path):
    prefix = str(tmp_path / "rb")
    rb = PrioritizedReplayBuffer(8, {"obs": {"shape": (2,)}, "done": {}}, mmap_prefix=prefix)
    rb.add(obs=np.ones((3, 2)), done=np.zeros(3))
    assert rb.sample(4)["obs"].tolist() == [[1.0, 1.0]] * 4
    rb.close()
    assert np.fromfile(f"{prefix}_obs.dat", dtype=np.float32)[:6].tolist() == [1.0] * 6
    assert os.path.exists(f"{prefix}.header.dat") and os.path.exists(f"{prefix}.tree.dat")


def test_an_episode_writer_of_a_file_mapped_buffer_writes_into_the_same_files(tmp_path):
    rb = ReplayBuffer(
        64,
        {"obs": {"shape": (2,)}, "next_obs": {"shape": (2,)}, "done": {}},
        next_of="obs",
        lanes=2,
        mmap_prefix=str(tmp_path / "rb"),
    )
    rb.episode_writer().add(obs=np.zeros(2), next_obs=np.ones(2), done=1.0)
    assert rb.get_stored_size() == 1


def test_a_shared_buffer_refuses_mmap_prefix():
    with pytest.raises(ValueError, match="mmap_prefix: a shared buffer lives in a shared-memory segment"):
        MPReplayBuffer(8, {"x": {}}, mmap_prefix="rb")


def test_mmap_prefix_must_be_a_path():
    with pytest.raises(TypeError, match="mmap_prefix: expected a path prefix"):
        ReplayBuffer(8, {"x": {}}, mmap_prefix=3)

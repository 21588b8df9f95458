"""The Nature CNN of ``mpreplay demo --env atari``: stacks in as the buffer stores them, Q-values out."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mpreplay.demo.nature_cnn import nature_cnn

ACTIONS = 4


def stacks(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


def test_it_gives_one_q_value_per_action_for_each_stack():
    net = nature_cnn(ACTIONS)
    assert net(torch.from_numpy(stacks(3))).shape == (3, ACTIONS)


def test_the_stack_axis_is_the_channel_axis_scaled_to_one():
    torch.manual_seed(0)
    net = nature_cnn(ACTIONS)
    x = stacks(2)
    channels_first = torch.from_numpy(np.ascontiguousarray(np.moveaxis(x, -1, 1))).float() / 255.0
    expected = net.advantage(net.torso(channels_first))
    torch.testing.assert_close(net(torch.from_numpy(x)), expected)


def test_a_strided_view_of_channels_first_frames_gives_the_same_q_values():
    # An actor holds (N, 4, 84, 84) frames and passes np.moveaxis(frames, 1, -1): no copy.
    net = nature_cnn(ACTIONS)
    x = stacks(2)
    frames = np.ascontiguousarray(np.moveaxis(x, -1, 1))
    view = np.moveaxis(frames, 1, -1)
    torch.testing.assert_close(net(torch.from_numpy(view)), net(torch.from_numpy(x)))


def test_a_dueling_head_averages_its_q_values_to_the_state_value():
    net = nature_cnn(ACTIONS, dueling=True)
    x = torch.from_numpy(stacks(2))
    value = net.value(net.torso(x.permute(0, 3, 1, 2).float() / 255.0))[:, 0]
    torch.testing.assert_close(net(x).mean(1), value)


@pytest.mark.parametrize(
    "bad",
    [torch.zeros(2, 84, 84, 4), torch.zeros(2, 4, 84, 84, dtype=torch.uint8)],
    ids=["float frames", "channels first"],
)
def test_stacks_other_than_uint8_with_the_stack_last_are_refused_naming_them(bad):
    with pytest.raises(ValueError, match="stacks: expected uint8 of shape"):
        nature_cnn(ACTIONS)(bad)


def test_a_network_without_actions_is_refused_naming_the_argument():
    with pytest.raises(ValueError, match="num_actions"):
        nature_cnn(0)

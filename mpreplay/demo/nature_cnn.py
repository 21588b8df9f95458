"""The Nature DQN network (Mnih et al., 2015) over stacked 84x84 frames, optionally dueling.

It takes the stacks as the replay buffer stores and samples them -- ``(N, 84, 84, depth)``
uint8, the stack on the last axis -- and scales them to [0, 1] itself, so a sampled batch
and an actor's own stacks go in as they are, without a copy made to reorder or convert them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FRAME", "nature_cnn"]

FRAME = (84, 84)  # the frames the network's convolutions are sized for


def nature_cnn(num_actions: int, depth: int = 4, *, dueling: bool = False) -> Any:
    """A fresh Q-network: three convolutions (32 8x8 stride 4, 64 4x4 stride 2, 64 3x3 stride 1),
    a hidden layer of 512 and one Q-value per action; ``dueling`` splits the head into a value
    and advantages (Wang et al., 2016), ``Q = V + A - mean(A)``."""
    import torch
    from torch import nn

    if not isinstance(num_actions, int) or num_actions < 1:
        raise ValueError(f"num_actions: expected an integer >= 1, got {num_actions!r}")
    if not isinstance(depth, int) or depth < 1:
        raise ValueError(f"depth: expected an integer >= 1, got {depth!r}")

    def head(outputs: int) -> nn.Module:
        return nn.Sequential(nn.Linear(64 * 7 * 7, 512), nn.ReLU(), nn.Linear(512, outputs))

    class NatureCNN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.depth = depth
            self.torso = nn.Sequential(
                nn.Conv2d(depth, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
            )
            self.value = head(1) if dueling else None
            self.advantage = head(num_actions)

        def forward(self, stacks: torch.Tensor) -> torch.Tensor:
            if stacks.dtype != torch.uint8 or tuple(stacks.shape[1:]) != (*FRAME, depth):
                raise ValueError(
                    f"stacks: expected uint8 of shape (N, {FRAME[0]}, {FRAME[1]}, {depth}), "
                    f"got {stacks.dtype} of shape {tuple(stacks.shape)}"
                )
            # The stack axis becomes the channels: a strided view, which the convolution reads
            # as channels-last memory, no transposed copy.
            x = stacks.permute(0, 3, 1, 2).float().div_(255.0)
            features = self.torso(x)
            advantage = self.advantage(features)
            if self.value is None:
                return advantage
            return self.value(features) + advantage - advantage.mean(1, keepdim=True)

    return NatureCNN()

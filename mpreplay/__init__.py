"""mpreplay: prioritized experience replay in shared memory for multi-process RL."""

from ._version import __version__
from .attach import attach
from .buffers import (
    MPPrioritizedReplayBuffer,
    MPPrioritizedSequenceReplayBuffer,
    MPReplayBuffer,
    MPSequenceReplayBuffer,
    PrioritizedReplayBuffer,
    PrioritizedSequenceReplayBuffer,
    ReplayBuffer,
    SequenceReplayBuffer,
)
from .errors import (
    BufferClosed,
    CheckpointError,
    CorruptBufferError,
    IncompatibleSegmentError,
    ReadOnlyError,
    RowsDroppedWarning,
    TableGone,
)
from .launcher import ChildFailed, Context, RunResult, StopFlag, launch
from .limiter import ExactlyOnce, MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from .memory import SharedMemoryError
from .nstep import NstepBuffer
from .params import ParameterStore, ParameterStoreTimeout
from .restore import restore
from .returns import NStepReturns, discounted_cumsum_left, discounted_cumsum_right, gae, n_step_returns
from .selectors import SelectorSpec
from .sequences import SequenceSpec, sequence_priority
from .spec import Array, Batch, EnvDict, FieldOptions, TensorBatch
from .table import Table

__all__ = [
    "__version__",
    "Table",
    "attach",
    "restore",
    "EnvDict",
    "FieldOptions",
    "Batch",
    "TensorBatch",
    "Array",
    "ReplayBuffer",
    "PrioritizedReplayBuffer",
    "MPReplayBuffer",
    "MPPrioritizedReplayBuffer",
    "SequenceReplayBuffer",
    "PrioritizedSequenceReplayBuffer",
    "MPSequenceReplayBuffer",
    "MPPrioritizedSequenceReplayBuffer",
    "sequence_priority",
    "SequenceSpec",
    "SelectorSpec",
    "BufferClosed",
    "TableGone",
    "ReadOnlyError",
    "CheckpointError",
    "CorruptBufferError",
    "SharedMemoryError",
    "IncompatibleSegmentError",
    "RowsDroppedWarning",
    "RateLimiter",
    "MinSize",
    "SampleToInsertRatio",
    "ExactlyOnce",
    "Queue",
    "Stack",
    "NstepBuffer",
    "launch",
    "ChildFailed",
    "Context",
    "RunResult",
    "StopFlag",
    "ParameterStore",
    "ParameterStoreTimeout",
    "discounted_cumsum_right",
    "discounted_cumsum_left",
    "n_step_returns",
    "NStepReturns",
    "gae",
]

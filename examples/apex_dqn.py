"""Ape-X DQN on CartPole: many actor processes, one learner, one shared prioritized replay buffer.

Each actor process plays its own CartPole-v1 with its own exploration rate
(the Ape-X ladder 0.4 ** (1 + 7 i / (N - 1))), folds 3-step returns with
NstepBuffer, computes initial priorities |TD| for a few dozen transitions at
a time with its copy of the network, and adds them to one
MPPrioritizedReplayBuffer in shared memory.  The learner samples by priority,
trains a double DQN with a target network (PyTorch, CPU), writes the new
|TD| back as priorities and publishes its weights to the actors through a
ParameterStore.  A SampleToInsertRatio rate limiter keeps the learner and the
actors in step.  A live table shows the throughput of every stage; at the end
the run writes summary.json and learning_curve.png to --out.

Needs torch, gymnasium (and optionally rich and matplotlib)::

    python examples/apex_dqn.py --actors 2 --seconds 300 --out ./mpreplay-demo
    python examples/apex_dqn.py --help

The code lives in mpreplay/demo/apex.py (``mpreplay demo`` runs the same thing).
"""

from mpreplay.demo import main

if __name__ == "__main__":  # the worker processes import this file again: only the parent runs the demo
    raise SystemExit(main())

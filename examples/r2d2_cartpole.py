"""R2D2 on CartPole with the velocities hidden: recurrent actors, one learner, one shared sequence buffer.

The actors observe only the cart position and the pole angle, a partially
observed task: each actor process steps a vector of CartPoles with an LSTM
Q-network (the Ape-X ε ladder over all sub-environments) and stores every step
with the LSTM state it started from in one MPPrioritizedSequenceReplayBuffer,
which cuts the episodes into overlapping sequences.  The learner samples
sequences by priority, unrolls the LSTM from each sequence's stored state
(a burn-in refreshes it first), trains on double-Q n-step targets computed
inside each sequence, and writes R2D2's sequence priorities back.  The same
live view, summary.json and learning_curve.png as the Ape-X demo.

Needs torch, gymnasium (and optionally rich and matplotlib)::

    python examples/r2d2_cartpole.py --seconds 600 --out ./mpreplay-demo-r2d2
    python examples/r2d2_cartpole.py --help

The code lives in mpreplay/demo/r2d2.py (``mpreplay demo --agent r2d2`` runs the same thing);
``mpreplay demo --hide-velocity`` runs the feed-forward Ape-X agent on the same observations.
"""

import sys

from mpreplay.demo import main

if __name__ == "__main__":  # the worker processes import this file again: only the parent runs the demo
    raise SystemExit(main(["--agent", "r2d2", *sys.argv[1:]]))

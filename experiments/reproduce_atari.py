"""Christiano et al. 2017, Fig. 3, from one command: A2C from synthetic labels versus A2C on the
game's reward on seven Atari games, over seeds.

    python -m experiments.reproduce_atari                          # 7 games x 3 seeds x {3,300, 5,500 labels, RL}
    python -m experiments.reproduce_atari --tasks Pong --seeds 1   # Pong only (a GPU run)
    python -m experiments.reproduce_atari --dry-run                # the plan; nothing runs
    python -m experiments.reproduce_atari --plot-only              # redraw and rewrite the table
    python -m experiments.reproduce_atari --tasks Pong --seeds 1 --labels 6 --steps 320 \\
        --run-args='--iteration-steps 160 --pretrain-epochs 2 --ensemble.num-members 1 --agent-config num_envs=2'
                                                                   # a CPU smoke budget: the command end to end

Each cell is one ``python -m experiments.atari`` run with A.2's settings (the Atari preset): A2C,
16 environments, the A.2 reward CNN, 500 labels from the untrained policy, the rate
∝ 5·10⁶/(T + 5·10⁶) held in blocks of 5·10⁶ steps, the last 3,000 labels kept, one label per 10
RL steps; the RL arm trains on the game's reward clipped to [−1, 1].  The grid, its directories
(``ROOT/GAME-TAG-STEPS-seedS``), resuming, refusing runs of another configuration, ``--jobs`` and
the table markers work as in :mod:`experiments.reproduce_mujoco` (:mod:`experiments.grid`,
:mod:`experiments.figures`).

What is drawn and tabled is the game's score per episode (``episode_return``: the unclipped score
of the episodes that ended in an iteration), as Fig. 3 plots it; each seed is smoothed over 10
iterations (40,000 steps, 160,000 frames: Fig. 3 averages "about 150,000 consecutive frames").

Before starting, a short warm-up (three iterations of the grid's first learning run, without its
start-up phase) is timed on this device and the whole grid's wall time printed: A.2's 50M steps
per run want a GPU (``--no-estimate`` skips it).  Outputs: ``DOCS/atari_GAME.png`` per game,
``DOCS/atari_fig3.png`` with all, and a table in ``--results-md`` between
``<!-- reproduce_atari:table:begin -->`` and ``<!-- reproduce_atari:table:end -->``.
"""

from __future__ import annotations

import sys

from experiments.figures import Figure
from rlhp_jax import presets

# Fig. 3's seven games, in its order
TASKS = ("BeamRider", "Breakout", "Enduro", "Pong", "Qbert", "Seaquest", "SpaceInvaders")
STEPS = presets.BUDGETS["atari"][1]  # A.2: "runs were actually trained for only 50 million timesteps"
DEFAULT_STEPS = {task: STEPS for task in TASKS}
DEFAULT_SEEDS = 3  # Fig. 3: "All curves are the average of 3 runs"
DEFAULT_LABELS = (3300, 5500)  # §3.1.2: "synthetic labels match or come close to RL even with only 3,300"
TARGET_LABELS = 5500  # the budget of Fig. 3's human run and of the ablations (Fig. 5)

# What still differs from Christiano et al.'s appendix A.2 in these runs (written under the table).
A2_DIFFERENCES = (
    "the predictor is fitted between A2C iterations of 4,000 steps (one label per 10 RL steps), not "
    "asynchronously beside the agent",
    "the 500 first labels are chosen from 5,000 candidate pairs of a 250,000-step rollout of the untrained "
    "policy (A.2 gives no length for it)",
    "the size of the oracle's game-over penalty (appendix A: \"a penalty in all games except Pong\", of no "
    "stated size) and the rectangles of the score masks are ours (the task registry, rlhp_jax/atari_masks.py)",
    "the curves show the score of the episodes that ended in each 4,000-step iteration, smoothed over 10 "
    "iterations (Fig. 3: about 150,000 consecutive frames)",
    "no human-labeled arm: Fig. 3's purple curve needs people (python -m experiments.atari --teacher human)",
)

FIG3 = Figure(
    name="reproduce_atari", entry="atari", title="Christiano Fig. 3, seven Atari games", tasks=TASKS,
    default_steps=DEFAULT_STEPS, default_labels=DEFAULT_LABELS, target_labels=TARGET_LABELS, more_labels=None,
    differences=A2_DIFFERENCES, differences_from="appendix A.2", file_prefix="atari", combined="fig3",
    metric="episode_return", metric_text="game score",
    y_label="game score per episode\n(mean of 10 consecutive iterations)", default_seeds=DEFAULT_SEEDS, smooth=10,
    warmup_flags=("--pretrain-epochs", "0", "--no-distinct-initial-clips"),
    startup_note="each learning run also starts with the untrained policy's rollout for the first labels and "
                 "the predictor's pretraining, not in this estimate; with A.2's settings 250,000 steps and 200 epochs")


def main(argv=None) -> int:
    return FIG3.main(argv, doc=__doc__)


if __name__ == "__main__":
    sys.exit(main())

"""A run of Christiano et al.'s loop as data: :class:`RunConfig` (every setting, each checked
where it is made), the §3.3 ablations as changes to a config, and the config's JSON form (what a
run directory's ``config.json`` holds and ``--resume`` reads back, see :mod:`rlhp_jax.runs`).

The defaults are sized for the classic tasks; the papers' settings for Atari and MuJoCo are the
presets of ``experiments/atari.py`` and ``experiments/mujoco.py``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rlhp_jax import agents as agents_lib
from rlhp_jax import queries
from rlhp_jax.config_fields import check_ranges, conform, dataclass_from_json, describe
from rlhp_jax.ensemble import EnsembleConfig
from rlhp_jax.teachers import SyntheticTeacher

# Christiano §3.3's ablations (plus the true-reward baseline, which is reward_source="true").
ABLATIONS = {
    "random_queries": "queries chosen uniformly at random instead of by ensemble disagreement",
    "no_ensemble": "a single predictor, trained on every label (no bootstrap resample), and so random queries: "
                   "there is no disagreement to measure",
    "no_online_queries": "every label collected at the start, from the untrained policy",
    "no_regularization": "no adaptive L2 (dropout stays where the model has it)",
    "no_segments": "segments of length 1 (robotics tasks only)",
    "target": "r̂ regressed on the true segment return with squared error instead of preferences",
}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    env: str = "CartPole-v1"
    total_steps: int = 100_000  # environment steps of RL
    labels: int = 200  # query budget
    seed: int = 0
    agent: str = "ppo"  # "ppo", "a2c" (A.2) or "trpo" (A.1)
    agent_config: Any = None  # the agent's config dataclass; None: its preset for the task
    env_options: tuple = ()  # (name, value) pairs for the environment wrapper, e.g. (("noop_max", 90),)
    reward_source: str = "model"  # "model" (learn from preferences) or "true" (RL baseline)
    # the baseline's reward: "normalized" (the true reward shifted and scaled by a random policy's mean
    # and std) or "raw" (the task's true reward as it is: A.1's modified task, the MuJoCo preset)
    baseline_reward: str = "normalized"
    selection: str = "disagreement"  # "disagreement" (§2.2.4) or "random"
    candidate_factor: int = queries.CANDIDATE_FACTOR  # A: 10x more candidates than queries
    segment_length: int | None = None  # None: the task's default (EnvSpec.segment_length)
    initial_label_fraction: float | None = 0.25  # A.1: 25 % of labels from the untrained policy
    initial_label_count: int | None = None  # A.2: 500 (overrides the fraction)
    rate_constant: float | None = None  # c of c/(T+c) (A.1: 2e6, A.2: 5e6); None: a quarter of the label horizon
    label_horizon: int | None = None  # step by which the whole label budget is due; None: the run's last step
    label_capacity: int | None = None  # keep only the last N labels (A.2: 3,000); None: all
    # reward-model steps on the initial labels before RL; None: one iteration's share (fit_steps), what
    # a predictor trained asynchronously (A.1/A.2) has done by the time the first batch is scored
    pretrain_steps: int | None = 500
    pretrain_epochs: float | None = None  # A.2: 200 epochs over the initial labels (overrides pretrain_steps)
    fit_steps: int | None = 50  # reward-model steps per iteration; None: from labels_per_rl_step
    labels_per_rl_step: float = 0.1  # A.2: the predictor "processes 1 label per 10 RL timesteps"
    iteration_steps: int = 0  # at least this many env steps per driver iteration (agent updates batched)
    eval_every: int = 5  # iterations between evaluations (and reward-model validation)
    eval_episodes: int = 10
    correlation_segments: int = 256  # fresh segments for corr(r̂, true)
    ensemble: EnsembleConfig = EnsembleConfig()
    teacher: SyntheticTeacher = SyntheticTeacher()
    label_source: str = "synthetic"  # "synthetic" (the oracle above) or "human" (rlhp_jax.human: the web app)
    max_pending_queries: int = 20  # human: pairs waiting for people at once (beyond the initial batch)
    wait_for_initial_labels: bool = True  # human: answers to the initial batch before RL starts
    query_max_age_steps: int | None = None  # human: withdraw pairs unanswered for this many env steps
    ablation: str | None = None  # recorded; applied by ``with_ablation``
    checkpoint_every: int = 10  # iterations between checkpoints (0: only at the end)
    checkpoint_on_labels: bool = True  # also checkpoint every iteration that added labels
    keep_checkpoints: int = 3
    out: str = "runs/classic"

    def __post_init__(self):
        if self.reward_source not in ("model", "true"):
            raise ValueError(f"reward_source must be 'model' or 'true', got {self.reward_source!r}")
        if self.baseline_reward not in ("normalized", "raw"):
            raise ValueError(f"baseline_reward must be 'normalized' or 'raw', got {self.baseline_reward!r}")
        if self.selection not in ("disagreement", "random"):
            raise ValueError(f"selection must be 'disagreement' or 'random', got {self.selection!r}")
        if self.reward_source == "model" and self.labels < 1:
            raise ValueError(f"Learning from preferences needs at least 1 label, got --labels {self.labels}. "
                             "Use the true-reward baseline to train without labels.")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if self.candidate_factor < 1:
            raise ValueError(f"candidate_factor must be >= 1, got {self.candidate_factor}")
        if self.agent not in agents_lib.AGENTS:
            raise ValueError(f"Unknown agent {self.agent!r}. Available agents: {', '.join(agents_lib.AGENTS)}.")
        if self.ablation is not None and self.ablation not in ABLATIONS:
            raise ValueError(f"Unknown ablation {self.ablation!r}. Available: {', '.join(ABLATIONS)}.")
        if self.segment_length is not None and self.segment_length < 1:
            raise ValueError(f"segment_length must be >= 1, got {self.segment_length}")
        if self.label_source not in ("synthetic", "human"):
            raise ValueError(f"label_source must be 'synthetic' or 'human', got {self.label_source!r}")
        if self.max_pending_queries < 1:
            raise ValueError(f"max_pending_queries must be >= 1, got {self.max_pending_queries}")
        check_ranges(self, counts=("eval_every", "eval_episodes", "correlation_segments", "label_capacity", "label_horizon",
                                   "query_max_age_steps", "keep_checkpoints"),
                     nonnegative=("initial_label_count", "pretrain_steps", "pretrain_epochs", "fit_steps",
                                  "iteration_steps", "checkpoint_every"),
                     positive=("rate_constant", "labels_per_rl_step"), fractions=("initial_label_fraction",))
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if not all(isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str) for o in self.env_options):
            raise ValueError(f"env_options must be (name, value) pairs, got {describe(self.env_options)}")


def with_ablation(cfg: RunConfig, name: str | None) -> RunConfig:
    """``cfg`` changed as Christiano §3.3 describes the ablation ``name`` (None: unchanged)."""
    if name is None:
        return cfg
    if name not in ABLATIONS:
        raise ValueError(f"Unknown ablation {name!r}. Available: {', '.join(ABLATIONS)}.")
    ens = cfg.ensemble
    changes: dict[str, Any] = dict(ablation=name)
    if name == "random_queries":
        changes.update(selection="random")
    elif name == "no_ensemble":
        changes.update(selection="random", ensemble=dataclasses.replace(ens, num_members=1, bootstrap=False))
    elif name == "no_online_queries":
        changes.update(initial_label_fraction=1.0, initial_label_count=None)
    elif name == "no_regularization":
        changes.update(ensemble=dataclasses.replace(ens, adaptive_l2=False))
    elif name == "no_segments":
        changes.update(segment_length=1)
    elif name == "target":
        changes.update(ensemble=dataclasses.replace(ens, loss="target"))
    return dataclasses.replace(cfg, **changes)


def config_to_json(cfg) -> dict:
    """A run config (any dataclass) as JSON-ready values (what ``config.json`` holds)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def config_from_json(d: dict) -> RunConfig:
    """Inverse of ``config_to_json``: every field required and of its declared type (nested
    dataclasses and tuples rebuilt; ``agent_config`` as the config class of the saved ``agent``,
    or None).  Raises ``ValueError`` naming the field (see ``rlhp_jax.config_fields``)."""
    if not isinstance(d, dict):
        raise ValueError(f"the configuration must be a JSON object, got {describe(d)}")
    d = dict(d)
    saved = d.get("agent_config")
    if isinstance(saved, dict):
        agent, env = (conform(str, d.get(k), k) for k in ("agent", "env"))
        d["agent_config"] = dataclass_from_json(type(agents_lib.default_config(agent, env)), saved, "agent_config")
    elif saved is not None:
        raise ValueError(f"agent_config must be a JSON object or null, got {describe(saved)}")
    return dataclass_from_json(RunConfig, d)

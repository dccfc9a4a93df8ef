"""A run of Christiano et al.'s loop as data: :class:`RunConfig` (every setting, each checked
where it is made), the §3.3 ablations as changes to a config, and the config's JSON form (what a
run directory's ``config.json`` holds and ``--resume`` reads back, see :mod:`rlhp_jax.runs`); and
:class:`IbarzConfig`, the same for Ibarz et al.'s protocol (:mod:`rlhp_jax.ibarz`).

The defaults are sized for the classic tasks; the papers' settings for Atari and MuJoCo are
:mod:`rlhp_jax.presets`, reached as ``RunConfig.paper(task)`` / ``IbarzConfig.paper(task)``.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rlhp_jax import agents as agents_lib
from rlhp_jax import queries, tasks
from rlhp_jax.agents.dqfd import DQfDConfig
from rlhp_jax.config_fields import check_ranges, conform, dataclass_from_json, describe
from rlhp_jax.ensemble import EnsembleConfig
from rlhp_jax.replay import ReplayConfig
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
    # ours, a diagnosis rather than an ablation of the paper's: the learned arm whole, its agent on a reward exactly
    # affine in the true one (BUILD_NOTES, Swimmer)
    "true_at_rhat_scale": "labels, fits and r̂ as usual, but the agent trains on the true reward mapped each "
                          "iteration onto r̂'s scale and offset (least squares over the rollout): r̂'s per-step "
                          "error removed, everything else of the learned arm kept",
    # ours, the same diagnosis's other half: is it the residual's size or what it depends on?
    "shuffled_residual": "as true_at_rhat_scale, plus r̂'s residual from that line shuffled over the rollout's "
                         "steps: r̂'s per-step error kept at its size, no longer a function of the state",
}
BASELINE_REWARDS = ("normalized", "raw", "clipped_game")  # RunConfig.baseline_reward (loop.RunParts.baseline_rewards)


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
    # and std), "raw" (the task's true reward as it is: A.1's modified task, the MuJoCo preset) or
    # "clipped_game" (the game's own reward clipped to [-1, 1], no game-over penalty: A.2's wrappers, the
    # Atari preset)
    baseline_reward: str = "normalized"
    selection: str = "disagreement"  # "disagreement" (§2.2.4) or "random"
    candidate_factor: int = queries.CANDIDATE_FACTOR  # A: 10x more candidates than queries
    segment_length: int | None = None  # None: the task's default (EnvSpec.segment_length)
    initial_label_fraction: float | None = 0.25  # A.1: 25 % of labels from the untrained policy
    initial_label_count: int | None = None  # A.2: 500 (overrides the fraction)
    rate_constant: float | None = None  # c of c/(T+c) (A.1: 2e6, A.2: 5e6); None: a quarter of the label horizon
    # the label rate is held constant for blocks of this many steps (A.2: "decreased every 5*10^6 frames");
    # None: it falls continuously
    rate_step: int | None = None
    label_horizon: int | None = None  # step by which the whole label budget is due; None: the run's last step
    # keep only the last N labels (A.2: 3,000), but never fewer than the labels asked before RL (the
    # no_online_queries ablation asks them all up front: all are kept); None: all
    label_capacity: int | None = None
    # the untrained policy's first rollout is long enough to hold every candidate pair's clips without
    # overlap (schedules.initial_rollout_steps: 2 · candidate pairs · segment steps, in whole iterations'
    # rollouts, at most loop.MAX_INITIAL_STEPS; the Atari preset); off: one iteration's rollout
    distinct_initial_clips: bool = False
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
    # also checkpoint every iteration that added people's labels; the synthetic oracle's are replayed from
    # the seed by a resume, so its runs checkpoint every checkpoint_every iterations only (a save on every
    # labeled iteration slowed a 1M-step Reacher run from 106 s to 155 s: BUILD_NOTES)
    checkpoint_on_labels: bool = True
    keep_checkpoints: int = 3
    out: str = "runs/classic"

    def __post_init__(self):
        if self.reward_source not in ("model", "true"):
            raise ValueError(f"reward_source must be 'model' or 'true', got {self.reward_source!r}")
        if self.baseline_reward not in BASELINE_REWARDS:
            raise ValueError(f"baseline_reward must be {', '.join(map(repr, BASELINE_REWARDS))}, "
                             f"got {self.baseline_reward!r}")
        if self.selection not in ("disagreement", "random"):
            raise ValueError(f"selection must be 'disagreement' or 'random', got {self.selection!r}")
        if self.reward_source == "model" and self.labels < 1:
            raise ValueError(f"Learning from preferences needs at least 1 label, got --labels {self.labels}. "
                             "Use the true-reward baseline to train without labels.")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if self.candidate_factor < 1:
            raise ValueError(f"candidate_factor must be >= 1, got {self.candidate_factor}")
        check_ranges(self, counts=("total_steps", "candidate_factor", "segment_length", "max_pending_queries"),
                     nonnegative=("labels",))  # and each within MAX_COUNT: 10**20 steps is a refusal, not a traceback
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
        if self.label_source == "human" and self.ensemble.next_obs:
            raise ValueError("--ensemble.next-obs is for the synthetic oracle: people's clips are drawn from the "
                             "observations, and the transition's are twice as wide")
        check_ranges(self, counts=("eval_every", "eval_episodes", "correlation_segments", "label_capacity", "label_horizon",
                                   "rate_step", "query_max_age_steps", "keep_checkpoints"),
                     nonnegative=("initial_label_count", "pretrain_steps", "pretrain_epochs", "fit_steps",
                                  "iteration_steps", "checkpoint_every"),
                     positive=("rate_constant", "labels_per_rl_step"), fractions=("initial_label_fraction",))
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if not all(isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str) for o in self.env_options):
            raise ValueError(f"env_options must be (name, value) pairs, got {describe(self.env_options)}")

    @classmethod
    def paper(cls, task: str, labels: int | None = None, seed: int = 0, **options) -> RunConfig:
        """The papers' setup for ``task`` — Christiano A.1 (MuJoCo, TRPO), A.2 (Atari, A2C), or
        this repo's classic-control budgets — exactly what ``python -m experiments.<domain> --env
        TASK --labels N --seed S`` builds (``rlhp_jax.presets``).  ``labels`` None: the task's
        budget.  ``options``: ``steps``, ``agent``, ``baseline``, ``ablation`` (applied by
        :func:`with_ablation`), ``out``, ``agent_config`` (a dict of changes to the agent's
        preset), and field changes named like the fields: ``segment_length=10``,
        ``ensemble=dict(num_members=5)``, ``label_source="human"`` (:func:`rlhp_jax.presets.christiano`)."""
        from rlhp_jax import presets

        return with_ablation(presets.christiano(cls, task, labels, seed, **options), options.get("ablation"))


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


# Ibarz et al. 2018 (rlhp_jax.ibarz): its setups (§3) and the protocol's config
SETUPS = {
    "imitation": "the large-margin loss on the demonstrations only: no preferences, no RL",
    "no_demos": "preferences only (Christiano et al.'s setup, with DQN)",
    "demos+prefs": "demonstrations and preferences",
    "demos+prefs+autolabels": "demonstrations and preferences, plus demo-preferred labels on the initial clips",
}
FULL_SCHEDULE = 6800  # A.3: the full schedule's labels; 500 of them initial
FULL_INITIAL = 500

# Ibarz A.1 on Atari: all 18 actions, 0-90 no-ops at reset
ATARI_OPTIONS = (("full_action_space", True), ("noop_max", 90))
# Ibarz's synthetic oracle prefers the clip with the higher game score as the game counts it (§2.5: "the
# true reward of the underlying Atari game"; appendix D weighs 10 vs 11 vs 100 points), not A.2's reward
# clipped to [-1, 1]; the agent learns from r̂ only.  Applied on Atari unless env_options names it.
IBARZ_ORACLE = (("clip_oracle_reward", False),)


@dataclasses.dataclass(frozen=True)
class IbarzConfig:
    env: str = "Pong"
    setup: str = "demos+prefs"
    demos: str | None = None  # demo file (rlhp_jax.demos); required unless setup is no_demos
    demo_fraction: float = 1.0  # Ibarz Fig. 1: "20 % demos"
    total_steps: int = 50_000_000  # A.4: 500 iterations of 1e5 actor steps
    iteration_steps: int = 100_000  # A.4: actor steps per iteration (reward model fixed within)
    labels: int = FULL_SCHEDULE  # A.3: 6,800 (reduced: 3,400 / 1,700 / 1,133)
    initial_labels: int | None = None  # None: 500 · labels / 6,800 (A.4: 500 / 250 / 125 / 83)
    rate_constant: float = 5e6  # A.3: rate ∝ 5e6 / (T + 5e6)
    segment_length: int = 25  # A.3: clips of 25 actor steps
    bc_batches: int = 20_000  # A.4: first pretraining on the demos
    rm_pretrain_batches: int = 50_000  # A.4: reward model on the initial labels
    second_pretrain_batches: int = 60_000  # A.4: second pretraining, with r̂
    rm_batches_per_iteration: int = 6_250  # A.4
    # actor steps of the initial trajectories; None: 2 · initial · segment (schedules.initial_rollout_steps)
    initial_steps: int | None = None
    num_envs: int = 1  # actors stepping together (each its own replay lane)
    seed: int = 0
    # None of the Atari defaults (ATARI_OPTIONS) is applied when set; the unclipped oracle (IBARZ_ORACLE) is,
    # unless these name clip_oracle_reward
    env_options: tuple = ()
    agent_config: DQfDConfig = DQfDConfig()
    replay: ReplayConfig = ReplayConfig()
    reward_model: EnsembleConfig = EnsembleConfig(
        num_members=1,  # A.3: "We do not use an ensemble"
        bootstrap=False,  # A.4: batches "sampled uniformly from the annotation buffer"
        input_noise=0.1,  # A.3: Gaussian noise of amplitude 0.1 on [0, 1] inputs
        reward_l2=0.01,  # A.3: a loss ∝ squared predicted reward (the weight is not given)
        reward_std=0.05,  # A.3: normalized to std 0.05 over the annotation buffer
    )
    reward_dropout: float = 0.2  # A.3: per-channel dropout "with α = 0.8" (keep probability)
    teacher: SyntheticTeacher = SyntheticTeacher()
    label_source: str = "synthetic"  # "synthetic" (the oracle above) or "human" (people, between iterations)
    wait_for_labels: bool = True  # human: each batch answered before training goes on; off: on with r̂ as it is
    frozen_reward: str | None = None  # a finished run's directory: its reward model, fixed
    model_reward_samples: int = 4096  # steps per iteration scored for the model-vs-true reward curves
    keep_checkpoints: int = 2
    checkpoint_replay: bool = True  # replay buffer in checkpoints (7 GB when full on Atari)
    out: str = "runs/ibarz"
    protocol: str = "ibarz"  # marks config.json for --resume

    def __post_init__(self):
        if self.setup not in SETUPS:
            raise ValueError(f"Unknown setup {self.setup!r}. Available: {', '.join(SETUPS)}.")
        if self.setup != "no_demos" and not self.demos:
            raise ValueError(f"The {self.setup} setup learns from demonstrations: give --demos PATH "
                             "(record some with python -m rlhp_jax.demos_cli record or python -m rlhp_jax.human play).")
        if self.setup == "no_demos" and self.demos:
            raise ValueError("--setup no_demos uses no demonstrations: drop --demos (or choose another setup).")
        if self.total_steps < 1 or self.iteration_steps < 1:
            raise ValueError("total_steps and iteration_steps must be positive")
        if self.setup not in ("imitation",) and self.frozen_reward is None and self.labels < 1:
            raise ValueError(f"Learning from preferences needs labels; got --labels {self.labels}.")
        if self.frozen_reward is not None and self.setup == "imitation":
            raise ValueError("--frozen-reward trains on a reward model; the imitation setup uses none.")
        for name in ("bc_batches", "rm_pretrain_batches", "second_pretrain_batches", "rm_batches_per_iteration"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        check_ranges(self, counts=("segment_length", "initial_steps", "model_reward_samples", "keep_checkpoints"),
                     nonnegative=("initial_labels",), positive=("rate_constant", "demo_fraction"),
                     fractions=("demo_fraction", "reward_dropout"))
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        if not all(isinstance(o, tuple) and len(o) == 2 and isinstance(o[0], str) for o in self.env_options):
            raise ValueError(f"env_options must be (name, value) pairs, got {self.env_options!r:.60}")

    @property
    def learns_rewards(self) -> bool:
        return self.setup != "imitation" and self.frozen_reward is None

    @property
    def uses_reward_model(self) -> bool:
        return self.setup != "imitation"

    @property
    def uses_demos(self) -> bool:
        return self.setup != "no_demos"

    def initial_count(self) -> int:
        if self.initial_labels is not None:
            return min(int(self.initial_labels), self.labels)
        return min(self.labels, max(1, round(FULL_INITIAL * self.labels / FULL_SCHEDULE)))

    def env_kwargs(self) -> dict:
        """The environment wrapper's options: ``env_options``, or where none are set and the task
        is not a pure-JAX one (Atari), Ibarz A.1's (``ATARI_OPTIONS``); on Atari the oracle judges
        the unclipped game score (``IBARZ_ORACLE``) unless ``env_options`` says otherwise."""
        task = tasks.find(self.env)
        if task is None or task.backend == "gymnax":
            return dict(self.env_options)
        return dict(IBARZ_ORACLE, **dict(self.env_options or ATARI_OPTIONS))

    @classmethod
    def paper(cls, task: str, labels: int | None = None, seed: int = 0, **options) -> IbarzConfig:
        """Ibarz et al.'s protocol for ``task``: exactly what ``--agent dqfd --env TASK`` builds
        (:func:`rlhp_jax.presets.ibarz`; ``options``: ``steps``, ``out``, ``agent_config`` and
        field changes such as ``setup="no_demos"``, ``demos="demos.npz"``)."""
        from rlhp_jax import presets

        return presets.ibarz(cls, task, labels, seed, **options)


def ibarz_config_from_json(d: dict) -> IbarzConfig:
    """Inverse of ``config_to_json`` for an Ibarz run (the saved ``config.json`` of a run): every field
    required and of its declared type, nested configs rebuilt.  Raises ``ValueError`` naming the field."""
    return dataclass_from_json(IbarzConfig, d)

"""Christiano's loop, written once, as pure functions: what the host driver and the compiled loop share.

``RunParts(config)`` builds, from a ``config.RunConfig``, everything a run is made of (the
environments, the agent, the reward ensemble, the label schedule, the sizes of an iteration)
and exposes the steps of Christiano et al. 2017, §2.2 as pure, jit-friendly functions over the
run's state, a :class:`TrainState` pytree:

    fresh(key)                                   new agent, ensemble, environments, empty label set
    initial_rollout(state)                       the untrained policy's clips (Christiano A): one
                                                 iteration's rollout, or ``initial_blocks`` of them
    step_keys(key)                               one iteration's keys (module function)
    act(state, key)                              act on r̂ and update ``updates_per_iter`` times
                                                 (``iteration``: one ``lax.scan``)
    candidates(member_r, rollout, key, n, q)     q·10 candidate pairs → the q selected (disagreement or random)
    query_chunk(buffer, member_r, rollout, keys, n, q)   select → oracle labels → label set
    ask_oracle(buffer, member_r, rollout, key, n, max_n)  a traced number of queries, in chunks
    score_episodes(sums, rollout)                the task's own episode returns
    progress_metrics(it, state, rollout, ...)    the columns every metrics row has
    correlation, fall_diagnostics                diagnostics of r̂ against the true reward
    reward_scale(key)                            the RL baseline's (shift, scale) of the true reward
    baseline_rewards(rollout, scale)             the reward the RL baseline trains on

Each iteration is: ``step_keys`` → ``act`` → the labels due (``chunk_keys`` per chunk of
queries: candidates → teacher → ``labels.add_labels``) → the ensemble's fit → diagnostics and
``progress_metrics``.  Two compositions run it: ``rlhp_jax.driver.PreferenceRun`` on the host
(each piece jitted; any ``teachers.Teacher`` — the oracle or people; checkpoints, logging,
progress) and ``rlhp_jax.compiled.CompiledRun`` (the whole run in one XLA program, the oracle
only, many lanes).  Same keys, same shapes, same functions: for the oracle they produce the same
labels and, within float tolerance, the same reward model (``tests/test_compiled.py``).

``member_r`` is every member's *raw* reward on each step of a rollout, computed once per
rollout: the agent trains on r̂ = the mean of the members normalized on their own
(``agent_rewards``, A.1/A.2: std 1 or 0.05), while query selection (§2.2.4) measures the variance
of each member's own prediction P[σ¹ ≻ σ²], Bradley-Terry on the member's raw clip sums — the
scale the member was trained at, not squashed or stretched by the agent's normalization.

The RL baseline (``reward_source="true"``) trains on the task's true reward, as it is
(``baseline_reward="raw"``: the MuJoCo preset, A.1's modified task) or shifted and scaled by a
uniformly random policy's mean and std (``"normalized"``, the default for the classic tasks), or
on the game's own reward clipped to [−1, 1] with no game-over penalty (``"clipped_game"``: the
Atari preset, A.2's A2C on Mnih et al.'s wrappers; the penalty is the oracle's, appendix A).

The first labels are asked about one iteration's worth of the untrained policy's acting, or, with
``distinct_initial_clips`` (the Atari preset), about ``initial_blocks`` such rollouts laid end to
end in one scan: enough steps for every candidate pair's clips to fit without overlap
(``schedules.initial_rollout_steps``), at most ``MAX_INITIAL_STEPS``.  One iteration of A2C on
Atari is 16 × 250 steps from reset, too few and too alike for A.2's 5,000 candidate pairs.

The label set keeps the last ``label_capacity`` labels (A.2: 3,000), never fewer than the labels
asked before RL: the ``no_online_queries`` ablation asks its whole budget up front and keeps it.

A run takes whole iterations of ``steps_per_iter`` environment steps, at least one: ``total_steps``
is rounded down to them, and ``steps_note`` says so when that changes the number.

Queries are asked in chunks of one compiled size per phase of a run, so that two shapes are
compiled, not one per count: ``initial_chunk`` for the labels asked before RL, ``online_chunk``
for those asked after each iteration, each the phase's largest count (the label schedule's, or
people's ``max_pending_queries``) rounded up to a power of two, at most ``MAX_QUERY_CHUNK``.  The
first ``n_live`` pairs of a chunk are real, the rest are masked out; selection ranks candidates
by disagreement, highest first, and only the first ``n_live·factor`` candidates compete, so a
chunk with fewer live pairs picks what a smaller compiled size would have picked (its random
draws differ: the candidates' starts are drawn for the compiled size).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlhp_jax import agents as agents_lib
from rlhp_jax.compile_cache import jit as program
from rlhp_jax import labels as labels_lib
from rlhp_jax.labels import bucket
from rlhp_jax import queries
from rlhp_jax.agents.common import random_reward_stats, weighted_mean
from rlhp_jax.ensemble import RewardEnsemble
from rlhp_jax import tasks
from rlhp_jax.envs import make_env
from rlhp_jax.metrics import segment_return_correlation
from rlhp_jax.preferences import preference_probability
from rlhp_jax.reward_models import reward_model_spec_for
from rlhp_jax.rollout import collect_rollout, transition_obs
from rlhp_jax.core import Rollout, clip_action, episode_ends, loop_body_is_slow
from rlhp_jax.schedules import initial_rollout_steps, label_schedule

MAX_QUERY_CHUNK = 1024  # pairs selected and labeled in one compiled call
# environment steps of the untrained policy's first rollout with distinct_initial_clips, at most: 300,000
# Atari steps are 8.5 GB of frames (84 × 84 × 4 bytes each).  A.2's 500 first labels need 250,000; the
# no_online_queries ablation's 5,500 would need 2,750,000 (78 GB) and gets this many
MAX_INITIAL_STEPS = 300_000
FALL_PROBE_PAIRS = 64  # pairs the fall diagnostics select (from 10x as many candidates) per iteration


class TrainState(struct.PyTreeNode):
    """Everything a run carries from one iteration to the next (the driver's checkpoints hold it)."""

    agent: Any
    ensemble: Any
    buffer: labels_lib.LabelBuffer
    env_state: Any
    obs: jax.Array
    key: jax.Array
    reward_scale: jax.Array  # (shift, scale) of the baseline's true reward (RunParts.reward_scale)
    queries: jax.Array  # int32 pairs asked
    labels: jax.Array  # int32 labels answered and kept
    episode_sums: jax.Array  # [N] running returns of the task's episodes


class StepKeys(NamedTuple):
    """The keys one iteration draws from the run's key, in the order both loops split them."""

    iteration: jax.Array  # acting and the agent's updates
    queries: jax.Array  # selecting (and, for the oracle, labeling) this iteration's queries
    fit: jax.Array  # the reward model's fit
    correlation: jax.Array  # the corr(r̂, true return) and fall diagnostics
    evaluation: jax.Array  # evaluation episodes


def _split(key, num: int) -> tuple[jax.Array, ...]:
    return tuple(jax.random.split(key, num))


split_keys = program(_split, static_argnums=1, quick=True)
"""``tuple(jax.random.split(key, num))``: on the host one kept program per ``num`` (run op by op,
the split and the unpacking were two programs, each traced, lowered and loaded at every start:
~0.2-0.4 s of the README job's warm start); inside a program, the split."""
fold_in = program(jax.random.fold_in, quick=True)
"""``jax.random.fold_in`` as a kept program (see ``split_keys``)."""


def step_keys(key) -> tuple[jax.Array, StepKeys]:
    """(the run's next key, this iteration's keys)."""
    key, *keys = split_keys(key, 6)
    return key, StepKeys(*keys)


def chunk_size(most: int) -> int:
    """The compiled size of a run's query chunks when at most ``most`` queries are asked at once: a
    power of two (``labels.bucket``), at most ``MAX_QUERY_CHUNK``."""
    return min(bucket(max(most, 1)), MAX_QUERY_CHUNK)


def query_chunks(n: int, size: int) -> list[tuple[int, int]]:
    """``(q, take)`` of each chunk ``n`` queries are asked in: every chunk compiled at ``q = size``
    (one shape per phase of a run: ``RunParts.initial_chunk``, ``RunParts.online_chunk``), the
    first ``take`` of its pairs live."""
    return [(size, min(size, n - lo)) for lo in range(0, n, size)]


def chunk_keys(key, count: int) -> list[tuple[jax.Array, jax.Array, jax.Array]]:
    """The (candidates, teacher, label set) keys of each of ``count`` query chunks drawn from
    ``key``: one schedule for the host driver and the compiled loop."""
    out = []
    for _ in range(count):
        key, k_c, k_t, k_a = split_keys(key, 4)
        out.append((k_c, k_t, k_a))
    return out


def steps_note(requested: int, run: int, per_iteration: int) -> str | None:
    """What a run tells the user when it takes ``run`` environment steps (whole iterations of
    ``per_iteration``) where ``requested`` were asked for; None when they are the same."""
    if run == requested:
        return None
    if requested < per_iteration:
        return (f"the run's budget of {requested} steps (--steps) is less than one iteration ({per_iteration} steps): "
                f"running {run}")
    how = "rounded down" if run < requested else "rounded up"
    return (f"the run's budget of {requested} steps (--steps) is not a multiple of the {per_iteration} steps of an iteration: "
            f"{how} to {run}")


def per_episode(values, valid, horizon: int):
    """The mean of ``values`` [T, N] over the valid steps, times ``horizon``: a return per episode
    of the task's fixed length.  envpool's deferred-reset step (``valid`` False, reward 0) is one
    step in ``horizon + 1``; counting it would read InvertedPendulum's 25-step episodes at most 24.04."""
    valid = jnp.asarray(valid, bool)
    total = jnp.sum(jnp.where(valid, jnp.asarray(values, jnp.float32), 0.0))
    return total / jnp.maximum(jnp.sum(valid.astype(jnp.float32)), 1.0) * horizon


def finished_episodes(sums, raw_reward, ends, valid):
    """Episode scores over a ``[T, N]`` stretch of steps: adds each valid step's raw reward to the
    running ``sums`` [N] and closes an episode where ``ends``.  Returns (sums, episodes finished,
    sum of their returns); pure, so the host driver and the compiled loop count alike."""
    raw = jnp.where(valid, jnp.asarray(raw_reward, jnp.float32), 0.0)

    def step(carry, x):
        sums, count, total = carry
        r, end = x
        sums = sums + r
        count = count + jnp.sum(end.astype(jnp.int32))
        total = total + jnp.sum(jnp.where(end, sums, 0.0))
        return (jnp.where(end, 0.0, sums), count, total), None

    init = (jnp.asarray(sums, jnp.float32), jnp.zeros((), jnp.int32), jnp.zeros((), jnp.float32))
    return jax.lax.scan(step, init, (raw, jnp.asarray(ends, bool)))[0]


def end_to_end(rollouts: Rollout, member_r):
    """K consecutive rollouts stacked by a scan (fields ``[K, T, N, ...]``, member rewards
    ``[K, M, T, N]``) as one: ``[K·T, N, ...]`` and ``[M, K·T, N]``, the last rollout's
    ``last_obs`` and ``last_value``."""
    cat = lambda x: x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])
    rollout = rollouts._replace(**{f: cat(getattr(rollouts, f)) for f in Rollout._fields
                                   if f not in ("last_obs", "last_value")},
                                last_obs=rollouts.last_obs[-1], last_value=rollouts.last_value[-1])
    member_r = jnp.moveaxis(member_r, 1, 0)
    member_r = member_r.reshape(member_r.shape[0], member_r.shape[1] * member_r.shape[2], *member_r.shape[3:])
    return rollout, member_r


class RunParts:
    """The components and pure steps of a run of ``config`` (a ``config.RunConfig``)."""

    def __init__(self, config):
        self.cfg = config
        agent_cfg = config.agent_config or agents_lib.default_config(config.agent, config.env)
        self.updates_per_iter = max(1, math.ceil(config.iteration_steps / agent_cfg.batch_size))
        self.steps_per_iter = self.updates_per_iter * agent_cfg.batch_size
        self.rollout_len = self.updates_per_iter * agent_cfg.num_steps
        env_options = dict(config.env_options)
        if self.shows_native_frames(config):  # people see Atari clips in colour (render.atari)
            from rlhp_jax.render.atari import NativeFrames

            env_options.setdefault("native_frames", NativeFrames(agent_cfg.num_envs, self.rollout_len + 1))
        self.env = make_env(config.env, agent_cfg.num_envs, **env_options)  # raises on unknown names
        self.spec = self.env.spec
        agents_lib.check_compatible(config.agent, self.spec)
        self.seg_len = config.segment_length or self.spec.segment_length
        if self.seg_len > self.rollout_len:
            enough = math.ceil(self.seg_len / agent_cfg.num_steps) * agent_cfg.batch_size
            raise ValueError(f"segment_length {self.seg_len} exceeds the {self.rollout_len} steps each environment "
                             f"takes in an iteration: give --iteration-steps {enough} or more, or a shorter "
                             f"--segment-length")
        self.num_iters = max(1, config.total_steps // self.steps_per_iter)  # whole iterations, at least one
        self.steps_note = steps_note(config.total_steps, self.num_iters * self.steps_per_iter, self.steps_per_iter)
        self.agent = agents_lib.make_agent(config.agent, self.spec, agent_cfg, self.num_iters * self.updates_per_iter)
        std = config.ensemble.reward_std if config.ensemble.reward_std is not None else self.spec.reward_std
        ens_cfg = dataclasses.replace(config.ensemble, reward_std=std)
        self.ensemble = RewardEnsemble(reward_model_spec_for(self.spec, next_obs=ens_cfg.next_obs), ens_cfg)
        self.learn = config.reward_source == "model"
        self.true_at_rhat_scale = self.learn and config.ablation == "true_at_rhat_scale"
        self.shuffled_residual = self.learn and config.ablation == "shuffled_residual"
        self.schedule = None
        if self.learn:
            self.schedule = label_schedule(
                config.labels, self.num_iters * self.steps_per_iter,
                initial_fraction=None if config.initial_label_count is not None else config.initial_label_fraction,
                initial_count=config.initial_label_count, rate_constant=config.rate_constant,
                budget_steps=config.label_horizon, rate_step=config.rate_step)
        if config.fit_steps is not None:
            self.fit_steps = int(config.fit_steps)
        else:
            self.fit_steps = max(1, math.ceil(self.steps_per_iter * config.labels_per_rl_step / ens_cfg.batch_size))
        if config.pretrain_epochs is not None and self.learn:
            self.pretrain_steps = math.ceil(config.pretrain_epochs * max(self.schedule.initial, 1) / ens_cfg.batch_size)
        else:
            # None: the fit an asynchronous predictor does while the first batch is collected, so the first
            # update is not scored by an untrained network (every later one lags by the same one iteration)
            self.pretrain_steps = self.fit_steps if config.pretrain_steps is None else int(config.pretrain_steps)
        # the last label_capacity labels, never fewer than those asked before RL (no_online_queries: all of
        # them), never more than the budget
        capacity = config.label_capacity or config.labels
        if self.learn:
            capacity = max(capacity, self.schedule.initial)
        self.label_capacity = min(capacity, config.labels)
        # the first rollout: one iteration's, or as many as hold every candidate's clips apart (module docstring)
        self.initial_blocks = 1
        if self.learn and config.distinct_initial_clips and not self.shows_native_frames(config):
            block = self.rollout_len * self.env.num_envs
            wanted = initial_rollout_steps(self.schedule.initial * config.candidate_factor, self.seg_len)
            self.initial_blocks = max(1, min(math.ceil(wanted / block), MAX_INITIAL_STEPS // block))
        # one compiled size per phase for the query chunks (module docstring)
        initial, new = self.query_counts()
        self.initial_chunk = chunk_size(initial)
        most = config.max_pending_queries if config.label_source == "human" else int(new.max(initial=0))
        self.online_chunk = chunk_size(most)
        self.can_evaluate = hasattr(self.env, "episodic_reset")
        # a CNN policy on CPU (core.loop_body_is_slow): the driver runs an iteration's updates as a host loop
        network = getattr(getattr(self.agent, "pi", None), "network", "")
        self.iteration_loop = "host" if self.updates_per_iter > 1 and loop_body_is_slow(network) else "scan"

    @functools.cached_property
    def _new_models(self):
        """``(agent key, ensemble key) -> (agent state, ensemble state, empty label set)`` compiled as
        one program: run op by op, the initializers, optimizer states and empty arrays were ~45
        programs of one operation each, every one traced, lowered and loaded (or compiled) at every
        start."""
        def new_models(k_agent, k_ens):
            return (self.agent.init(k_agent), self.ensemble.init(k_ens),
                    self.ensemble.empty_buffer(self.label_capacity, self.seg_len))

        return program(new_models, quick=True)

    @functools.cached_property
    def _reset(self):
        """The environments' reset: one compiled program for a pure-JAX task (op by op, ~10), as it is
        for envpool's emulators, which step outside any program."""
        return program(self.env.reset, quick=True) if self.can_evaluate else self.env.reset

    def query_counts(self) -> tuple[int, np.ndarray]:
        """The label schedule as counts, as the driver asks the synthetic oracle: (labels asked
        before RL, new queries after each iteration [iterations])."""
        new = np.zeros(self.num_iters, np.int32)
        if not self.learn:
            return 0, new
        asked = initial = int(self.schedule.initial)
        for it in range(1, self.num_iters + 1):
            due = int(self.schedule.due(it * self.steps_per_iter))
            new[it - 1] = max(0, due - asked)
            asked = max(asked, due)
        return initial, new

    # ------------------------------------------------------------------ the run's state
    def fresh(self, key, reward_scale: bool = True) -> TrainState:
        """A new agent, ensemble and environments and an empty label set.  ``reward_scale=False``
        skips the baseline's random-policy statistics (a run about to be restored from a
        checkpoint: they are in its metadata) and leaves (0, 1)."""
        key, k_agent, k_ens, k_env, k_scale = split_keys(key, 5)
        agent_state, ens_state, buffer = self._new_models(k_agent, k_ens)
        scale = self.reward_scale(k_scale) if reward_scale else jnp.asarray((0.0, 1.0), jnp.float32)
        # after reward_scale: its statistics step the environments
        env_state, obs = self._reset(k_env)
        return TrainState(agent=agent_state, ensemble=ens_state, buffer=buffer,
                          env_state=env_state, obs=obs, key=key, reward_scale=scale,
                          queries=jnp.zeros((), jnp.int32), labels=jnp.zeros((), jnp.int32),
                          episode_sums=jnp.zeros((self.env.num_envs,), jnp.float32))

    @staticmethod
    def shows_native_frames(config) -> bool:
        """People label an Atari run: the environments keep the emulator's colour frames of the last
        rollout (a ``render.atari.NativeFrames`` ring of ``rollout_len + 1`` steps, 405 MB at 16 × 250)
        for their clips.  The first labels are then asked about one iteration's rollout, as before
        ``distinct_initial_clips``: a ring for ``initial_blocks`` of them would not fit in memory."""
        task = tasks.find(config.env)
        return config.label_source == "human" and config.reward_source == "model" and task is not None \
            and task.backend == "atari"

    def initial_rollout(self, state: TrainState, rollout_only=None):
        """Christiano A: the first comparisons are of clips from the untrained policy.  Acts for an
        iteration without updates (``rollout_only``: this object's, or a compiled stand-in), or for
        ``initial_blocks`` iterations (``long_rollout``, compiled here); returns (state, rollout,
        member rewards, (queries key, fit key))."""
        rollout_only = self.rollout_only if rollout_only is None else rollout_only
        if self.initial_blocks > 1:
            rollout_only = program(self.long_rollout)
        key, k_roll, k_q, k_fit = split_keys(state.key, 4)
        env_state, obs, rollout, member_r = rollout_only(state.agent, state.env_state, state.obs, state.ensemble,
                                                         k_roll)
        return state.replace(env_state=env_state, obs=obs, key=key), rollout, member_r, (k_q, k_fit)

    def act(self, state: TrainState, key, iteration=None):
        """One iteration of acting and agent updates from ``state`` (``iteration``: this object's
        ``iteration`` or a compiled stand-in for it): returns (state, rollout, r̂, member rewards,
        agent metrics, episodes finished, sum of their returns)."""
        iteration = self.iteration if iteration is None else iteration
        agent_state, env_state, obs, rollout, rewards, member_r, agent_m = iteration(
            state.agent, state.env_state, state.obs, state.ensemble, state.reward_scale, key)
        return state.replace(agent=agent_state, env_state=env_state, obs=obs), rollout, rewards, member_r, agent_m

    def score_episodes(self, sums, rollout: Rollout):
        """Add a rollout's steps to the running episode returns ``sums`` [N]: (sums, episodes
        finished, the sum of their returns)."""
        return finished_episodes(sums, rollout.raw_reward, self.episode_ends(rollout), rollout.valid)

    def progress_metrics(self, it, state: TrainState, rollout: Rollout, rewards, agent_m, episodes, total) -> dict:
        """The columns every iteration's metrics row has, as arrays (both loops log these):
        counts, the true and predicted return per episode length, the task's own episode scores
        (NaN when none finished), terminations, the policy's entropy, and the rest of the agent's
        own update metrics as ``agent_*`` (e.g. TRPO's ``agent_kl``, ``agent_step_accepted`` and
        ``agent_explained_var``, PPO's ``agent_approx_kl`` and ``agent_clip_frac``), averaged
        over the iteration's updates."""
        nan = jnp.asarray(jnp.nan, jnp.float32)
        horizon = self.spec.horizon
        return dict(
            iteration=jnp.asarray(it, jnp.int32),
            env_steps=jnp.asarray(it, jnp.int32) * self.steps_per_iter,
            labels=state.labels, queries=state.queries,
            true_return=per_episode(rollout.true_reward, rollout.valid, horizon),
            predicted_return=per_episode(rewards, rollout.valid, horizon),
            episodes=episodes,
            episode_return=jnp.where(episodes > 0, total / jnp.maximum(episodes, 1), nan),
            terminations=jnp.sum(rollout.terminated.astype(jnp.int32)),
            policy_entropy=jnp.asarray(agent_m.get("entropy", nan), jnp.float32),
            **{f"agent_{k}": jnp.asarray(v, jnp.float32) for k, v in agent_m.items() if k != "entropy"},
        )

    # ------------------------------------------------------------------ acting
    def reward_scale(self, key):
        """(shift, scale) [2] the baseline's agent reward is ``(true_reward - shift) / scale`` with:
        (0, 1) when learning from preferences or with ``baseline_reward`` "raw" or "clipped_game"
        (which scales nothing); else the mean and std of the true reward under uniformly random
        actions (this steps the environments: call it before their reset)."""
        if self.learn or self.cfg.baseline_reward != "normalized":
            return jnp.asarray((0.0, 1.0), jnp.float32)
        return jnp.asarray(random_reward_stats(self.env, key), jnp.float32)

    def baseline_rewards(self, rollout: Rollout, reward_scale):
        """[T, N] the RL baseline's reward (``baseline_reward``): the true reward shifted and scaled
        by ``reward_scale`` ("raw": by (0, 1)), or the game's own reward clipped to [-1, 1]
        ("clipped_game"; 0 on steps that are no real transition)."""
        if self.cfg.baseline_reward == "clipped_game":
            return jnp.where(rollout.valid, jnp.clip(rollout.raw_reward, -1.0, 1.0), 0.0)
        return (rollout.true_reward - reward_scale[0]) / reward_scale[1]

    def reward_obs(self, rollout: Rollout):
        """[T, N, ...] what r̂ sees of each step besides the action: the observation, or with
        ``ensemble.next_obs`` the observation and the next (``rollout.transition_obs``).  The
        clips of the label set store the same."""
        return transition_obs(self.spec, rollout) if self.ensemble.config.next_obs else rollout.obs

    def member_rewards(self, ens_state, rollout: Rollout):
        """[M, T, N] raw rewards of every member on a rollout (see the module docstring)."""
        features = self.reward_obs(rollout)
        obs = features.reshape(-1, *features.shape[2:])
        act = clip_action(self.spec, rollout.action)
        act = act.reshape(-1, *act.shape[2:])
        r = self.ensemble.member_rewards(ens_state, obs, act)
        return r.reshape(r.shape[0], *rollout.true_reward.shape)

    def agent_rewards(self, ens_state, member_r):
        """r̂ [T, N] the agent trains on: the members' raw rewards each normalized, then averaged."""
        return jnp.mean(self.ensemble.normalize(ens_state, member_r), axis=0)

    @staticmethod
    def affine_true(rewards, rollout: Rollout):
        """[T, N] the true reward mapped onto ``rewards``' scale and offset: the least-squares line of
        ``rewards`` on the true reward over the rollout's valid steps, evaluated at the true reward
        (the ``true_at_rhat_scale`` diagnosis)."""
        mean = weighted_mean(rollout.valid)
        true = rollout.true_reward
        m_true, m_r = mean(true), mean(rewards)
        slope = mean((true - m_true) * (rewards - m_r)) / jnp.maximum(mean(jnp.square(true - m_true)), 1e-12)
        return m_r + slope * (true - m_true)

    @staticmethod
    def shuffled_over_valid(x, valid, key):
        """``x`` [T, N] with its values on the valid steps permuted among those steps at random (from
        ``key``); the other steps keep theirs.  The ``shuffled_residual`` diagnosis: r̂'s residual
        from its line on the true reward, as large as it was, but no longer a function of the step's
        state."""
        flat, ok = x.reshape(-1), valid.reshape(-1)
        source = jnp.argsort(jnp.where(ok, jax.random.uniform(key, flat.shape), 2.0))  # valid steps first, shuffled
        target = jnp.argsort(~ok, stable=True)  # valid steps first, in order
        return jnp.zeros_like(flat).at[target].set(flat[source]).reshape(x.shape)

    def one_update(self, carry, key):
        """Collect one rollout on r̂ (or the baseline's true reward) and update the agent once."""
        return self.learn_once(*self.act_once(carry, key))

    def act_once(self, carry, key):
        """``one_update``'s acting: (carry with the environments stepped, the rollout, the update's key)."""
        agent_state, env_state, obs, ens_state, reward_scale = carry
        k_roll, k_upd = jax.random.split(key)
        env_state, obs, rollout = self.collect(agent_state, env_state, obs, k_roll)
        return (agent_state, env_state, obs, ens_state, reward_scale), rollout, k_upd

    def collect(self, agent_state, env_state, obs, key):
        """One agent update's rollout from ``key``: (env_state, obs, rollout)."""
        return collect_rollout(self.env, self.agent.policy, agent_state.params, env_state, obs, key,
                               self.agent.config.num_steps)

    def learn_once(self, carry, rollout, k_upd):
        """``one_update``'s learning: r̂ (or the baseline's reward) on the rollout, one agent update."""
        agent = self.agent
        agent_state, env_state, obs, ens_state, reward_scale = carry
        if self.learn:
            member_r = self.member_rewards(ens_state, rollout)
            rewards = self.agent_rewards(ens_state, member_r)
            if self.true_at_rhat_scale or self.shuffled_residual:
                line = self.affine_true(rewards, rollout)
                rewards = line if self.true_at_rhat_scale else line + self.shuffled_over_valid(
                    rewards - line, rollout.valid, jax.random.fold_in(k_upd, 1))
        else:
            member_r = jnp.zeros((0, *rollout.true_reward.shape), jnp.float32)
            rewards = self.baseline_rewards(rollout, reward_scale)
        agent_state, metrics = agent.update(agent_state, rollout, rewards, k_upd)
        return (agent_state, env_state, obs, ens_state, reward_scale), (rollout, rewards, member_r, metrics)

    def update_keys(self, key):
        """One key per agent update of an iteration (K = 1: the key as it is)."""
        k = self.updates_per_iter
        return key[None] if k == 1 else jax.random.split(key, k)

    def finish(self, carry, stacked):
        """The K updates' outputs laid end to end: (agent, env, obs, rollout [K·T, N], rewards,
        member rewards [M, K·T, N], mean agent metrics)."""
        agent_state, env_state, obs, _, _ = carry
        ro, rewards, member_r, metrics = stacked
        rollout, member_r = end_to_end(ro, member_r)
        rewards = rewards.reshape(rewards.shape[0] * rewards.shape[1], *rewards.shape[2:])
        return agent_state, env_state, obs, rollout, rewards, member_r, jax.tree.map(jnp.mean, metrics)

    def iteration(self, agent_state, env_state, obs, ens_state, reward_scale, key):
        """``updates_per_iter`` agent updates in one ``lax.scan`` (see ``finish`` for the outputs)."""
        carry = (agent_state, env_state, obs, ens_state, reward_scale)
        return self.finish(*jax.lax.scan(self.one_update, carry, self.update_keys(key)))

    def rollout_only(self, agent_state, env_state, obs, ens_state, key):
        """An iteration's worth of acting without updates: (env_state, obs, rollout, member rewards).
        With one update an iteration (``updates_per_iter`` 1) the acting is ``collect``'s."""
        env_state, obs, rollout = collect_rollout(self.env, self.agent.policy, agent_state.params, env_state, obs,
                                                  key, self.rollout_len)
        return env_state, obs, rollout, self.member_rewards(ens_state, rollout)

    def long_rollout(self, agent_state, env_state, obs, ens_state, key):
        """``initial_blocks`` iterations' worth of acting without updates, one ``rollout_only`` per
        key split from ``key``, laid end to end: (env_state, obs, rollout [B·T, N], member rewards
        [M, B·T, N]).  Member rewards are computed block by block (a CNN over 250,000 frames at once
        would not fit)."""
        def block(carry, k):
            env_state, obs = carry
            env_state, obs, rollout, member_r = self.rollout_only(agent_state, env_state, obs, ens_state, k)
            return (env_state, obs), (rollout, member_r)

        (env_state, obs), (rollout, member_r) = jax.lax.scan(block, (env_state, obs),
                                                             jax.random.split(key, self.initial_blocks))
        rollout, member_r = end_to_end(rollout, member_r)
        return env_state, obs, rollout, member_r

    # ------------------------------------------------------------------ queries
    def candidates(self, member_r, rollout: Rollout, key, n_live, q: int):
        """q·factor candidate pairs (the first n_live·factor are live); returns the chosen q pairs
        and what their clips need for rendering.

        Candidates are scored from the per-step raw member rewards already computed for the
        agent, through cumulative sums (only the chosen pairs' frames are ever gathered): each
        member's P[σ¹ ≻ σ²] on its own clip sums, the q of highest variance across members."""
        seg_len = self.seg_len
        t0, env_idx, idx = self._choose(member_r, rollout, key, n_live, q)
        pool = t0.shape[0] // 2
        t0, env_idx = t0.reshape(pool, 2)[idx].reshape(-1), env_idx.reshape(pool, 2)[idx].reshape(-1)
        take = lambda x: queries.gather_segments(x, t0, env_idx, seg_len).reshape(q, 2, seg_len, *x.shape[2:])
        pairs = labels_lib.SegmentPairs(obs=take(self.reward_obs(rollout)),
                                        action=take(clip_action(self.spec, rollout.action)),
                                        true_reward=take(rollout.true_reward))
        return pairs, take(rollout.render)  # render: what a clip of the pair needs (MuJoCo root position)

    def _choose(self, member_r, rollout: Rollout, key, n_live, q: int):
        """The candidate clips' starts ``(t0, env)`` [2·q·factor] (pair i = clips 2i, 2i+1) and the
        indices [q] of the pairs selection picks among them."""
        cfg, seg_len = self.cfg, self.seg_len
        k_pairs, k_sel = jax.random.split(key)
        pool = q * cfg.candidate_factor
        t0, env_idx = queries.sample_segment_starts(k_pairs, rollout.boundary, 2 * pool, seg_len,
                                                    excluded=~rollout.valid)
        live = jnp.arange(pool) < n_live * cfg.candidate_factor
        if cfg.selection == "disagreement" and self.ensemble.config.num_members > 1:
            ret = queries.segment_sums(member_r, t0, env_idx, seg_len).reshape(-1, pool, 2)
            probs = preference_probability(ret[..., 0], ret[..., 1], self.ensemble.config.error_rate)
            idx = queries.select_by_disagreement(probs, q, live)
        else:
            idx = queries.select_random(k_sel, pool, q, live)
        return t0, env_idx, idx

    def query_chunk(self, buffer, member_r, rollout: Rollout, keys, n_live, q: int):
        """One chunk of queries to the synthetic oracle: select q pairs (the first ``n_live`` real),
        label them and add the answered ones to the label set.

        ``keys`` = (candidates, teacher, label-set) keys.  Returns (buffer, mu [q], mask [q]):
        ``mask`` marks the pairs that were real and answered (those were added)."""
        k_c, k_t, k_a = keys
        pairs, _ = self.candidates(member_r, rollout, k_c, n_live, q)
        mu, ok = self.cfg.teacher.label_pairs(k_t, pairs)
        mask = (jnp.arange(q) < n_live) & ok
        return labels_lib.add_labels(buffer, k_a, pairs, mu, mask), mu, mask

    def ask_oracle(self, buffer, member_r, rollout: Rollout, key, n, max_n: int, size: int):
        """``n`` queries to the synthetic oracle inside a compiled program, ``n`` traced and at most
        ``max_n``: returns (buffer, labels added).  The driver's chunks (``query_chunks(n, size)``):
        chunk ``c`` takes ``chunk_keys``' c-th keys and runs, at the compiled ``size``, when any of
        its ``size`` queries is live, so the random draws agree with the driver's."""
        got = jnp.zeros((), jnp.int32)
        if max_n <= 0:
            return buffer, got
        for c, keys in enumerate(chunk_keys(key, math.ceil(max_n / size))):
            n_c = jnp.clip(n - c * size, 0, size)

            def asked(buffer, keys=keys, n_c=n_c):
                buffer, _, mask = self.query_chunk(buffer, member_r, rollout, keys, n_c, size)
                return buffer, jnp.sum(mask.astype(jnp.int32))

            buffer, added = jax.lax.cond(n_c > 0, asked, lambda b: (b, jnp.zeros((), jnp.int32)), buffer)
            got = got + added
        return buffer, got

    # ------------------------------------------------------------------ diagnostics
    def episode_ends(self, rollout: Rollout):
        """[T, N] where the task's own episodes end: the fixed horizon, and termination where the
        emulator resets silently (on_terminate="reset")."""
        return episode_ends(self.spec, rollout.boundary, rollout.terminated)

    @property
    def has_falls(self) -> bool:
        """Does the task penalize leaving a healthy range (Hopper, Walker2d, Ant, the pendulums, CartPole)?"""
        return self.spec.terminal_penalty != 0

    def fallen(self, rollout: Rollout):
        """[T, N] steps the task penalizes for being out of its healthy range: every such step where
        the task runs on (A.1's penalty replaces termination), the fall itself where it resets."""
        if self.spec.on_terminate == "continue":
            return (rollout.true_reward - rollout.raw_reward) <= 0.5 * self.spec.terminal_penalty
        return rollout.terminated

    def fall_diagnostics(self, rollout: Rollout, rewards, member_r, key) -> dict:
        """What the method sees of falls in one iteration's rollout (BUILD_NOTES, falling tasks):

        out_of_range     fraction of the agent's steps out of the healthy range
        candidate_falls  fraction of candidate clips (uniform over the rollout) holding such a step
        chosen_falls     the same among the clips of the FALL_PROBE_PAIRS pairs selection picks
                         from 10x as many candidates (what the queries of this rollout would show)
        rhat_fallen / rhat_healthy   mean r̂ (as the agent gets it) on out-of-range / healthy steps
        true_fallen / true_healthy   the same for the true reward (a forward fall can pay more than standing)
        corr_fall_clips / corr_healthy_clips   corr(r̂, true return) over clips with / without such a step
        """
        nan = jnp.float32(jnp.nan)
        valid = rollout.valid
        fallen = self.fallen(rollout) & valid
        healthy = valid & ~fallen
        mean_over = lambda x, m: jnp.where(m.any(), jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(m.sum(), 1), nan)
        k_sel, k_seg = jax.random.split(key)
        q = FALL_PROBE_PAIRS
        t0, env_idx, idx = self._choose(member_r, rollout, k_sel, q, q)
        in_clip = queries.segment_sums(fallen.astype(jnp.float32), t0, env_idx, self.seg_len) > 0  # [2·pool]
        chosen = in_clip.reshape(-1, 2)[idx]
        t0, env_idx = queries.sample_segment_starts(k_seg, rollout.boundary, self.cfg.correlation_segments,
                                                    self.seg_len, excluded=~valid)
        sums = lambda x: queries.segment_sums(x, t0, env_idx, self.seg_len)
        pred, true, has_fall = sums(rewards), sums(rollout.true_reward), sums(fallen.astype(jnp.float32)) > 0
        return dict(out_of_range=jnp.sum(fallen) / jnp.maximum(jnp.sum(valid), 1),
                    candidate_falls=jnp.mean(in_clip), chosen_falls=jnp.mean(chosen),
                    rhat_fallen=mean_over(rewards, fallen), rhat_healthy=mean_over(rewards, healthy),
                    true_fallen=mean_over(rollout.true_reward, fallen),
                    true_healthy=mean_over(rollout.true_reward, healthy),
                    corr_fall_clips=segment_return_correlation(pred, true, has_fall),
                    corr_healthy_clips=segment_return_correlation(pred, true, ~has_fall))

    def correlation(self, rollout: Rollout, rewards, key):
        """Pearson correlation of predicted and true returns over fresh segments of the rollout."""
        _, pred, true = queries.sample_segments(key, rollout.obs, rewards, rollout.true_reward,
                                                rollout.boundary, self.cfg.correlation_segments, self.seg_len,
                                                excluded=~rollout.valid)
        return segment_return_correlation(pred.sum(-1), true.sum(-1))

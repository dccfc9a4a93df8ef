"""The thin driver (layer 6): the loop of Christiano et al. 2017, §2.2, interleaved in one thread.

    act on r̂ → segments → candidate pairs (×10) → select queries → teacher labels → fit ensemble → repeat

Acting, labeling and fitting stay separate pure functions; this module only holds the state
between iterations, asks the label schedule how many queries are due, logs, and plots.
The same loop trains on the true reward when ``reward_source="true"`` (the RL baseline).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlhp_jax import labels as labels_lib
from rlhp_jax import queries
from rlhp_jax.agents.common import evaluate, random_reward_stats
from rlhp_jax.agents.ppo import PPO, PPOConfig, preset
from rlhp_jax.ensemble import EnsembleConfig, RewardEnsemble
from rlhp_jax.envs import make_env
from rlhp_jax.metrics import MetricsWriter, plot_learning_curve, read_jsonl, segment_return_correlation
from rlhp_jax.preferences import check_labels
from rlhp_jax.reward_models import reward_model_spec_for
from rlhp_jax.rollout import Rollout, clip_action, collect_rollout
from rlhp_jax.schedules import label_schedule
from rlhp_jax.teachers import SyntheticTeacher


@dataclasses.dataclass(frozen=True)
class RunConfig:
    env: str = "CartPole-v1"
    total_steps: int = 100_000  # environment steps of RL
    labels: int = 200  # query budget
    seed: int = 0
    reward_source: str = "model"  # "model" (learn from preferences) or "true" (RL baseline)
    selection: str = "disagreement"  # "disagreement" (§2.2.4) or "random"
    candidate_factor: int = queries.CANDIDATE_FACTOR  # A: 10x more candidates than queries
    segment_length: int | None = None  # None: the task's default (EnvSpec.segment_length)
    initial_label_fraction: float = 0.25  # A.1: 25 % of labels from the untrained policy
    rate_constant: float | None = None  # c of c/(T+c); None: total_steps / 4
    label_capacity: int | None = None  # keep only the last N labels (A.2: 3,000); None: all
    pretrain_steps: int = 500  # reward-model steps on the initial labels before RL
    fit_steps: int = 50  # reward-model steps per iteration (interleaved with RL)
    eval_every: int = 5  # iterations between evaluations on the unmodified task
    eval_episodes: int = 10
    correlation_segments: int = 256  # fresh segments for corr(r̂, true)
    ppo: PPOConfig | None = None  # None: the task's preset
    ensemble: EnsembleConfig = EnsembleConfig()
    teacher: SyntheticTeacher = SyntheticTeacher()
    out: str = "runs/classic"

    def __post_init__(self):
        if self.reward_source not in ("model", "true"):
            raise ValueError(f"reward_source must be 'model' or 'true', got {self.reward_source!r}")
        if self.selection not in ("disagreement", "random"):
            raise ValueError(f"selection must be 'disagreement' or 'random', got {self.selection!r}")
        if self.reward_source == "model" and self.labels < 1:
            raise ValueError(f"Learning from preferences needs at least 1 label, got --labels {self.labels}. "
                             "Use the true-reward baseline to train without labels.")
        if self.total_steps < 1:
            raise ValueError(f"total_steps must be >= 1, got {self.total_steps}")
        if self.candidate_factor < 1:
            raise ValueError(f"candidate_factor must be >= 1, got {self.candidate_factor}")


def _bucket(n: int) -> int:
    """Round a query count up to a power of two so few query shapes are ever compiled."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


class PreferenceRun:
    """Builds every component for a config and runs the loop. ``run()`` returns the summary."""

    def __init__(self, config: RunConfig, progress: bool = True, log: Callable[[str], None] = print):
        self.cfg = config
        self.progress = progress
        self.log = log
        ppo_cfg = config.ppo or preset(config.env)
        self.env = make_env(config.env, ppo_cfg.num_envs)  # raises on unknown names
        self.spec = self.env.spec
        self.seg_len = config.segment_length or self.spec.segment_length
        if self.seg_len > ppo_cfg.num_steps:
            raise ValueError(f"segment_length {self.seg_len} exceeds the rollout length {ppo_cfg.num_steps}")
        self.steps_per_iter = ppo_cfg.batch_size
        self.num_iters = max(1, config.total_steps // self.steps_per_iter)
        self.agent = PPO(self.spec, ppo_cfg, self.num_iters)
        ens_cfg = dataclasses.replace(config.ensemble, reward_std=config.ensemble.reward_std or self.spec.reward_std)
        self.ensemble = RewardEnsemble(reward_model_spec_for(self.spec), ens_cfg)
        if config.reward_source == "model":
            self.schedule = label_schedule(config.labels, self.num_iters * self.steps_per_iter,
                                           initial_fraction=config.initial_label_fraction,
                                           rate_constant=config.rate_constant)
        self._build_functions()

    # ------------------------------------------------------------------ compiled pieces
    def _build_functions(self):
        env, agent, ens, cfg = self.env, self.agent, self.ensemble, self.cfg
        T = agent.config.num_steps

        def model_rewards(ens_state, rollout: Rollout):
            obs = rollout.obs.reshape(-1, *rollout.obs.shape[2:])
            act = clip_action(self.spec, rollout.action)
            act = act.reshape(-1, *act.shape[2:])
            return ens.predict_reward(ens_state, obs, act).reshape(rollout.true_reward.shape)

        def iteration(ppo_state, env_state, obs, ens_state, reward_scale, key):
            k_roll, k_upd = jax.random.split(key)
            env_state, obs, rollout = collect_rollout(env, agent.policy, ppo_state.params, env_state, obs,
                                                      k_roll, T)
            if cfg.reward_source == "true":
                rewards = (rollout.true_reward - reward_scale[0]) / reward_scale[1]
            else:
                rewards = model_rewards(ens_state, rollout)
            ppo_state, ppo_metrics = agent.update(ppo_state, rollout, rewards, k_upd)
            return ppo_state, env_state, obs, rollout, rewards, ppo_metrics

        def rollout_only(ppo_state, env_state, obs, key):
            return collect_rollout(env, agent.policy, ppo_state.params, env_state, obs, key, T)

        def candidates(ens_state, rollout: Rollout, key, n_live, q: int):
            """q·factor candidate pairs (the first n_live·factor are live) and the chosen q."""
            k_pairs, k_sel = jax.random.split(key)
            pool = q * cfg.candidate_factor
            pairs = queries.sample_candidate_pairs(
                k_pairs, rollout.obs, clip_action(self.spec, rollout.action), rollout.true_reward,
                rollout.boundary, pool, self.seg_len, excluded=~rollout.valid)
            live = jnp.arange(pool) < n_live * cfg.candidate_factor
            if cfg.selection == "disagreement" and ens.config.num_members > 1:
                probs = ens.predict_preferences(ens_state, pairs)
                idx = queries.select_by_disagreement(probs, q, live)
            else:
                idx = queries.select_random(k_sel, pool, q, live)
            return queries.take_pairs(pairs, idx)

        def correlation(rollout: Rollout, rewards, key):
            _, pred, true = queries.sample_segments(key, rollout.obs, rewards, rollout.true_reward,
                                                    rollout.boundary, cfg.correlation_segments, self.seg_len,
                                                    excluded=~rollout.valid)
            return segment_return_correlation(pred.sum(-1), true.sum(-1))

        self._iteration = jax.jit(iteration)
        self._rollout_only = jax.jit(rollout_only)
        self._candidates = jax.jit(candidates, static_argnums=4)
        self._label = jax.jit(self.cfg.teacher.label_pairs)
        self._add = jax.jit(labels_lib.add_labels)
        self._fit = ens.fitter()
        self._evaluate_ensemble = jax.jit(ens.evaluate)
        self._correlation = jax.jit(correlation)
        self._eval = lambda params, key: evaluate(env, agent, params, key, cfg.eval_episodes, self.spec.horizon)

    # ------------------------------------------------------------------ labels
    def _query(self, ens_state, buffer, rollout, key, n: int):
        """Ask the teacher about ``n`` selected pairs from ``rollout``; returns (buffer, asked, answered)."""
        asked = answered = 0
        while n > 0:
            q = min(_bucket(n), 1024)
            take = min(n, q)
            key, k_c, k_t, k_a = jax.random.split(key, 4)
            pairs = self._candidates(ens_state, rollout, k_c, take, q)
            mu, ok = self._label(k_t, pairs)
            mask = (jnp.arange(q) < take) & ok
            check_labels(np.asarray(mu)[np.asarray(mask)])
            buffer = self._add(buffer, k_a, pairs, mu, mask)
            asked += take
            answered += int(mask.sum())
            n -= take
        return buffer, asked, answered

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        cfg, spec = self.cfg, self.spec
        out = Path(cfg.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))
        writer = MetricsWriter(out / "metrics.jsonl")
        key = jax.random.PRNGKey(cfg.seed)
        key, k_agent, k_ens, k_env, k_scale = jax.random.split(key, 5)
        ppo_state = jax.jit(self.agent.init)(k_agent)
        ens_state = jax.jit(self.ensemble.init)(k_ens)
        env_state, obs = self.env.reset(k_env)
        capacity = cfg.label_capacity or max(cfg.labels, 1)
        buffer = self.ensemble.empty_buffer(capacity, self.seg_len)
        reward_scale = jnp.asarray(random_reward_stats(self.env, k_scale) if cfg.reward_source == "true"
                                   else (0.0, 1.0), jnp.float32)
        learn = cfg.reward_source == "model"
        asked = answered = 0
        start = time.perf_counter()

        if learn and self.schedule.initial > 0:
            # Christiano A: the first comparisons are of clips from the untrained policy.
            key, k_roll, k_q, k_fit = jax.random.split(key, 4)
            env_state, obs, rollout = self._rollout_only(ppo_state, env_state, obs, k_roll)
            buffer, a, b = self._query(ens_state, buffer, rollout, k_q, self.schedule.initial)
            asked, answered = asked + a, answered + b
            if cfg.pretrain_steps > 0:
                ens_state, _ = self._fit(ens_state, buffer, k_fit, cfg.pretrain_steps)

        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=self.num_iters * self.steps_per_iter, unit="step", unit_scale=True,
                       desc=f"{spec.name} {'r̂' if learn else 'true r'}", dynamic_ncols=True)
        summary_row: dict[str, Any] = {}
        for it in range(1, self.num_iters + 1):
            key, k_it, k_q, k_fit, k_corr, k_eval = jax.random.split(key, 6)
            ppo_state, env_state, obs, rollout, rewards, ppo_m = self._iteration(
                ppo_state, env_state, obs, ens_state, reward_scale, k_it)
            env_steps = it * self.steps_per_iter
            row: dict[str, Any] = {"iteration": it, "env_steps": env_steps}
            if learn:
                due = int(self.schedule.due(env_steps))
                if due > asked:
                    buffer, a, b = self._query(ens_state, buffer, rollout, k_q, due - asked)
                    asked, answered = asked + a, answered + b
                if cfg.fit_steps > 0 and answered > 0:
                    ens_state, fit_m = self._fit(ens_state, buffer, k_fit, cfg.fit_steps)
                    row["rm_train_loss"] = float(jnp.nanmean(fit_m["train_loss"]))
                    row["rm_l2"] = float(jnp.mean(ens_state.l2))
                ev = self._evaluate_ensemble(ens_state, buffer)
                row["val_accuracy"] = _nanmean(ev["val_accuracy"])
                row["rm_val_loss"] = _nanmean(ev["val_loss"])
                row["reward_correlation"] = _finite(self._correlation(rollout, rewards, k_corr))
            row.update(
                labels=answered,
                queries=asked,
                true_return=float(jnp.mean(rollout.true_reward)) * spec.horizon,
                predicted_return=float(jnp.mean(rewards)) * spec.horizon,
                terminations=int(rollout.terminated.sum()),
                policy_entropy=float(ppo_m.get("entropy", jnp.nan)),
            )
            if it % cfg.eval_every == 0 or it == self.num_iters:
                row["eval_return"] = float(self._eval(ppo_state.params, k_eval))
            row["wall_s"] = time.perf_counter() - start
            row["steps_per_s"] = env_steps / row["wall_s"]
            writer.write(row)
            summary_row = row
            if bar is not None:
                bar.update(self.steps_per_iter)
                post = {"true": f"{row['true_return']:.1f}", "labels": answered}
                if "eval_return" in row:
                    post["eval"] = f"{row['eval_return']:.1f}"
                bar.set_postfix(post)
        if bar is not None:
            bar.close()
        writer.close()

        rows = read_jsonl(out / "metrics.jsonl")
        evals = [r["eval_return"] for r in rows if r.get("eval_return") is not None]
        summary = {
            "env": spec.name,
            "reward_source": cfg.reward_source,
            "seed": cfg.seed,
            "env_steps": summary_row.get("env_steps", 0),
            "labels": answered,
            "queries": asked,
            "final_eval_return": evals[-1] if evals else None,
            "best_eval_return": max(evals) if evals else None,
            "final_reward_correlation": summary_row.get("reward_correlation"),
            "final_val_accuracy": summary_row.get("val_accuracy"),
            "wall_s": summary_row.get("wall_s"),
            "steps_per_s": summary_row.get("steps_per_s"),
        }
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        plot_learning_curve(rows, out / "learning_curve.png",
                            title=f"{spec.name} — {'preferences' if learn else 'true reward'}, "
                                  f"{answered} labels, seed {cfg.seed}")
        self.final = dict(ppo_state=ppo_state, ens_state=ens_state, buffer=buffer)
        return summary


def _finite(x) -> float | None:
    v = float(x)
    return v if math.isfinite(v) else None


def _nanmean(x) -> float | None:
    a = np.asarray(x, np.float64)
    a = a[np.isfinite(a)]
    return float(a.mean()) if a.size else None

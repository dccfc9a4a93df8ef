"""The thin driver (layer 6): the loop of Christiano et al. 2017, §2.2, interleaved in one thread.

    act on r̂ → segments → candidate pairs (×10) → select queries → teacher labels → fit ensemble → repeat

Acting, labeling and fitting stay separate pure functions; this module only holds the state
between iterations, asks the label schedule how many queries are due, logs, checkpoints and
plots.  The same loop trains on the true reward when ``reward_source="true"`` (the RL baseline:
as it is, or shifted and scaled by a random policy's statistics, as ``baseline_reward`` says).

One driver iteration runs ``updates_per_iteration`` agent updates inside one compiled
``lax.scan`` (A2C's 5-step updates would otherwise pay the host round trip 80 env steps at a
time); their rollouts, laid end to end, are the pool that segments are drawn from.  The reward
predictor is trained *interleaved* with the agent (same thread, between iterations, at about
``labels_per_rl_step`` labels processed per environment step, A.2: 0.1), not asynchronously:
runs are reproducible from their seed, and resuming a killed run replays it exactly.

Checkpoints (orbax, ``rlhp_jax.checkpoint``) hold the agent, the ensemble, the label set, the
RNG key, the counters and — for pure-JAX environments — the environment state; envpool's
emulators cannot be saved, so a resumed Atari/MuJoCo run starts fresh episodes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlhp_jax import labels as labels_lib
from rlhp_jax.agents.common import evaluate
from rlhp_jax.config import RunConfig
from rlhp_jax.loop import RunParts, bucket, finished_episodes, query_chunks
from rlhp_jax.metrics import finite_or_none, nanmean_or_none, plot_learning_curve, read_jsonl
from rlhp_jax.runs import continues_from_checkpoint, open_run, write_summary
from rlhp_jax.preferences import check_labels

class EpisodeTracker:
    """Returns of the task's own episodes (raw reward, no penalty), accumulated on the host
    across iterations: what a person would call the agent's score."""

    def __init__(self, num_envs: int, sums=None):
        self.sums = np.zeros(num_envs, np.float32) if sums is None else np.asarray(sums, np.float32)

    def update(self, raw_reward, ends, valid) -> tuple[int, float | None]:
        """Add an iteration's steps; returns (episodes finished, their mean return or None)."""
        sums, count, total = _finished_episodes(self.sums, raw_reward, ends, valid)
        self.sums, count = np.asarray(sums), int(count)
        return count, (float(total) / count if count else None)


_finished_episodes = jax.jit(finished_episodes)


class PreferenceRun:
    """Builds every component for a config and runs the loop. ``run()`` returns the summary.

    ``resume=True`` continues the run in ``config.out`` from its newest checkpoint, or, if it was
    stopped before its first one, starts it again there (:func:`continues_from_checkpoint`).
    A start from the config truncates ``metrics.jsonl``, and TensorBoard hides the events a killed
    attempt logged beyond the checkpoint, so no row is ever logged twice.
    """

    def __init__(self, config: RunConfig, progress: bool = True, log: Callable[[str], None] = print,
                 resume: bool = False):
        self.cfg = config
        self.progress = progress
        self.log = log
        self.resume = resume
        self.parts = parts = RunParts(config)
        for name in ("env", "spec", "seg_len", "updates_per_iter", "steps_per_iter", "rollout_len", "num_iters",
                     "agent", "ensemble", "learn", "schedule", "fit_steps", "pretrain_steps", "can_evaluate",
                     "iteration_loop"):
            setattr(self, name, getattr(parts, name))
        self._build_functions()

    # ------------------------------------------------------------------ compiled pieces
    def _build_functions(self):
        parts, cfg = self.parts, self.cfg
        if self.iteration_loop == "host":  # a CNN policy on CPU: the K updates as a host loop (see loop.py)
            update_jit, finish_jit, keys_jit = jax.jit(parts.one_update), jax.jit(parts.finish), \
                jax.jit(parts.update_keys)

            def host_iteration(agent_state, env_state, obs, ens_state, reward_scale, key):
                carry, outs = (agent_state, env_state, obs, ens_state, reward_scale), []
                for k in keys_jit(key):
                    carry, out = update_jit(carry, k)
                    outs.append(out)
                return finish_jit(carry, jax.tree.map(lambda *xs: jnp.stack(xs), *outs))

            self._iteration = host_iteration
        else:
            self._iteration = jax.jit(parts.iteration)
        self._rollout_only = jax.jit(parts.rollout_only)
        self._candidates = jax.jit(parts.candidates, static_argnums=4)
        self._query_chunk = jax.jit(parts.query_chunk, static_argnums=5)
        self._add = jax.jit(labels_lib.add_labels)
        self._fit = self.ensemble.fitter()
        self._evaluate_ensemble = jax.jit(self.ensemble.evaluate)
        self._correlation = jax.jit(parts.correlation)
        self._falls = jax.jit(parts.fall_diagnostics)
        if self.can_evaluate:
            env, agent = self.env, self.agent
            self._eval = lambda params, key: evaluate(env, agent, params, key, cfg.eval_episodes, self.spec.horizon)

    # ------------------------------------------------------------------ labels
    def _selections(self, member_r, rollout, key, n: int):
        """``n`` selected pairs from ``rollout`` in chunks of a power-of-two size (few compiled
        shapes): yields ``(pairs, render, take, (k_label, k_add))``; the first ``take`` are live."""
        for q, take in query_chunks(n):
            key, k_c, k_t, k_a = jax.random.split(key, 4)
            pairs, render = self._candidates(member_r, rollout, k_c, take, q)
            yield pairs, render, take, (k_t, k_a)

    def _query(self, member_r, buffer, rollout, key, n: int):
        """Ask the synthetic teacher about ``n`` selected pairs from ``rollout`` (chunks as in
        ``_selections``); returns (buffer, asked, answered)."""
        asked = answered = 0
        for q, take in query_chunks(n):
            key, k_c, k_t, k_a = jax.random.split(key, 4)
            buffer, mu, mask = self._query_chunk(buffer, member_r, rollout, (k_c, k_t, k_a), take, q)
            check_labels(np.asarray(mu)[np.asarray(mask)])
            asked += take
            answered += int(mask.sum())
        return buffer, asked, answered

    # ------------------------------------------------------------------ human labels
    def _ask_people(self, member_r, rollout, key, n: int, env_steps: int) -> int:
        """Select ``n`` pairs as for the oracle and queue them for people (rendered off this thread)."""
        for pairs, render, take, _ in self._selections(member_r, rollout, key, n):
            arrays = dict(obs=np.asarray(pairs.obs[:take]), action=np.asarray(pairs.action[:take]),
                          true_reward=np.asarray(pairs.true_reward[:take]), render=np.asarray(render[:take]))
            self.human.ask(arrays, [dict(env_steps=env_steps)] * take)
        return n

    def _take_answers(self, buffer, key, cursor: int):
        """Add the answers recorded since ``cursor`` to the label set; "can't tell" is kept in
        the store but not trained on.  Returns (buffer, cursor, answers, trainable labels)."""
        labels, pairs, mu, cursor = self.human.collect(cursor)
        n = len(labels)
        trainable = 0
        for lo in range(0, n, 1024):
            hi = min(n, lo + 1024)
            q = bucket(hi - lo)
            pad = lambda x: np.concatenate([x[lo:hi], np.zeros((q - (hi - lo), *x.shape[1:]), x.dtype)])
            batch = labels_lib.SegmentPairs(obs=jnp.asarray(pad(pairs["obs"])), action=jnp.asarray(pad(pairs["action"])),
                                            true_reward=jnp.asarray(pad(pairs["true_reward"]), jnp.float32))
            m = pad(mu)
            mask = (np.arange(q) < hi - lo) & np.isfinite(m)
            key, k_a = jax.random.split(key)
            buffer = self._add(buffer, k_a, batch, jnp.asarray(np.nan_to_num(m)), jnp.asarray(mask))
            trainable += int(mask.sum())
        return buffer, cursor, n, trainable

    def _publish(self, **facts):
        """What the page shows about the trainer (labels due, answers used, progress)."""
        self.human.store.set_meta(updated=time.time(), **facts)

    # ------------------------------------------------------------------ checkpoints
    def _checkpointer(self):
        from rlhp_jax.checkpoint import Checkpointer

        return Checkpointer(Path(self.cfg.out) / "checkpoints", keep=self.cfg.keep_checkpoints)

    def _saveable(self, agent_state, ens_state, buffer, key, env_state, obs):
        state = dict(agent=agent_state, ensemble=ens_state, buffer=buffer, key=key)
        if self.can_evaluate:  # a pure-JAX environment: its state is a pytree we can save
            state.update(env_state=env_state, obs=obs)
        return state

    def restore_latest(self) -> tuple[dict, dict] | None:
        """The newest checkpoint in the run's directory as ``(state, meta)`` (state: ``agent``,
        ``ensemble``, ``buffer``, ``key`` and, for pure-JAX tasks, ``env_state``/``obs``), or
        None when the run has none yet.  For tools that read a trained run (demo recording,
        diagnostics); ``run`` restores through the same template."""
        ckpt = self._checkpointer()
        if ckpt.latest_step() is None:
            return None
        key = jax.random.PRNGKey(0)
        template = self._saveable(self.agent.init(key), jax.jit(self.ensemble.init)(key),
                                  self.ensemble.empty_buffer(self.parts.label_capacity, self.seg_len), key,
                                  *self.env.reset(key))
        return ckpt.restore(template)

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        cfg, spec = self.cfg, self.spec
        out = Path(cfg.out)
        learn = self.learn
        ckpt = self._checkpointer()
        restoring = continues_from_checkpoint(ckpt, out, self.resume, self.log)
        if self.parts.steps_note:
            self.log(self.parts.steps_note)
        if self.parts.schedule is not None:
            self.log(self.parts.schedule.describe())
        key = jax.random.PRNGKey(cfg.seed)
        key, k_agent, k_ens, k_env, k_scale = jax.random.split(key, 5)
        agent_state = self.agent.init(k_agent)
        ens_state = jax.jit(self.ensemble.init)(k_ens)
        reward_scale = jnp.asarray((0.0, 1.0), jnp.float32)
        if not restoring:  # before the reset: the baseline's random-policy statistics step the environments
            reward_scale = self.parts.reward_scale(k_scale)
        env_state, obs = self.env.reset(k_env)
        buffer = self.ensemble.empty_buffer(self.parts.label_capacity, self.seg_len)
        asked = answered = 0
        responses = cursor = 0  # human: answers consumed (incl. "can't tell") and the store id of the last one
        start_iter, wall_before = 1, 0.0
        tracker = EpisodeTracker(self.env.num_envs)

        if restoring:
            template = self._saveable(agent_state, ens_state, buffer, key, env_state, obs)
            state, meta = ckpt.restore(template)
            agent_state, ens_state, buffer, key = state["agent"], state["ensemble"], state["buffer"], state["key"]
            if self.can_evaluate:
                env_state, obs = state["env_state"], state["obs"]
            start_iter = int(meta["iteration"]) + 1
            asked, answered = int(meta["queries"]), int(meta["labels"])
            responses, cursor = int(meta.get("responses", answered)), int(meta.get("human_cursor", 0))
            wall_before = float(meta.get("wall_s", 0.0))
            tracker = EpisodeTracker(self.env.num_envs, meta.get("episode_sums"))
            reward_scale = jnp.asarray(meta["reward_scale"], jnp.float32)
            self.log(f"resuming {out} from iteration {start_iter - 1} ({asked} queries, {answered} labels)")
        writer, tb = open_run(out, cfg, restoring=restoring, resume=self.resume,
                              keep_row=lambda r: r["iteration"] < start_iter,
                              purge_step=start_iter * self.steps_per_iter)
        human = learn and cfg.label_source == "human"
        if human:
            from rlhp_jax.human.teacher import HumanTeacher, pair_shapes

            self.human = HumanTeacher(out, cfg.env, render_fields=getattr(self.env, "render_fields", ()),
                                      pair_shapes=pair_shapes(spec, self.seg_len))  # other pairs: skipped
        start = time.perf_counter()

        def save(it):
            meta = dict(iteration=it, queries=asked, labels=answered, responses=responses, human_cursor=cursor,
                        wall_s=wall_before + time.perf_counter() - start,
                        episode_sums=tracker.sums.tolist(), reward_scale=np.asarray(reward_scale).tolist())
            ckpt.save(it, self._saveable(agent_state, ens_state, buffer, key, env_state, obs), meta)

        if not restoring and learn and self.schedule.initial > 0:
            # Christiano A: the first comparisons are of clips from the untrained policy.
            key, k_roll, k_q, k_fit = jax.random.split(key, 4)
            env_state, obs, rollout, member_r = self._rollout_only(agent_state, env_state, obs, ens_state, k_roll)
            if human:
                initial = self.schedule.initial
                buffer, cursor, responses, answered = self._take_answers(buffer, k_q, cursor)
                earlier = responses + self.human.pending()  # an earlier start in this directory (same seed)
                if earlier:
                    self.log(f"reusing {responses} answers and {earlier - responses} open pairs already in {out}")
                asked = earlier + self._ask_people(member_r, rollout, k_q, max(0, initial - earlier), 0)
                self._publish(labels_due=initial, responses=responses, env_steps=0, total_steps=self.num_iters
                              * self.steps_per_iter, state="waiting for the first labels")
                last_log = 0.0
                while cfg.wait_for_initial_labels and responses < initial:
                    key, k_a = jax.random.split(key)
                    buffer, cursor, got, usable = self._take_answers(buffer, k_a, cursor)
                    responses, answered = responses + got, answered + usable
                    if time.monotonic() - last_log > 15:
                        self.log(f"waiting for people: {responses} of the first {initial} answers "
                                 f"(RL starts when they are in)")
                        last_log = time.monotonic()
                    time.sleep(0.5)
            else:
                buffer, a, b = self._query(member_r, buffer, rollout, k_q, self.schedule.initial)
                asked, answered = asked + a, answered + b
            # pretraining (0 steps: A.1) ends with r̂'s normalization over the initial labels
            ens_state, _ = self._fit(ens_state, buffer, k_fit, self.pretrain_steps)
            save(0)

        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=self.num_iters * self.steps_per_iter, initial=(start_iter - 1) * self.steps_per_iter,
                       unit="step", unit_scale=True, dynamic_ncols=True,
                       desc=f"{spec.name} {cfg.agent} {'r̂' if learn else 'true r'}")
        for it in range(start_iter, self.num_iters + 1):
            key, k_it, k_q, k_fit, k_corr, k_eval = jax.random.split(key, 6)
            t0 = time.perf_counter()
            agent_state, env_state, obs, rollout, rewards, member_r, agent_m = self._iteration(
                agent_state, env_state, obs, ens_state, reward_scale, k_it)
            jax.block_until_ready((rewards, agent_state))  # the update too: its time is the agent's
            t1 = time.perf_counter()
            env_steps = it * self.steps_per_iter
            row: dict[str, Any] = {"iteration": it, "env_steps": env_steps}
            new_labels = False
            evaluate_now = it % cfg.eval_every == 0 or it == self.num_iters
            if human:
                due = int(self.schedule.due(env_steps))
                k_q, k_a = jax.random.split(k_q)
                buffer, cursor, got, usable = self._take_answers(buffer, k_a, cursor)
                responses, answered, new_labels = responses + got, answered + usable, got > 0
                if cfg.query_max_age_steps:
                    self.human.withdraw_older_than(env_steps - cfg.query_max_age_steps)
                pending = self.human.pending()
                n = min(due - responses - pending, cfg.max_pending_queries - pending)
                if n > 0:
                    asked += self._ask_people(member_r, rollout, k_q, n, env_steps)
                row.update(labels_due=due, label_responses=responses, label_gap=due - responses,
                           labels_pending=self.human.pending(), label_cant_tell=responses - answered)
                self._publish(labels_due=due, responses=responses, env_steps=env_steps,
                              total_steps=self.num_iters * self.steps_per_iter, state="training")
            elif learn:
                due = int(self.schedule.due(env_steps))
                if due > asked:
                    buffer, a, b = self._query(member_r, buffer, rollout, k_q, due - asked)
                    asked, answered = asked + a, answered + b
                    new_labels = True
            if learn:
                row["labels_due"] = due
                t2 = time.perf_counter()
                if self.fit_steps > 0 and answered > 0:
                    ens_state, fit_m = self._fit(ens_state, buffer, k_fit, self.fit_steps)
                    row["rm_train_loss"] = float(jnp.nanmean(fit_m["train_loss"]))
                    row["rm_l2"] = float(jnp.mean(ens_state.l2))
                t3 = time.perf_counter()
                # validated with the evaluations and at iteration 1 (the model fitted on the initial labels),
                # not at a resumed run's first iteration: its rows are the uninterrupted run's
                if evaluate_now or it == 1:
                    ev = self._evaluate_ensemble(ens_state, buffer)
                    row["val_accuracy"] = nanmean_or_none(ev["val_accuracy"])
                    row["rm_val_loss"] = nanmean_or_none(ev["val_loss"])
                row["reward_correlation"] = finite_or_none(self._correlation(rollout, rewards, k_corr))
                # with the validation (sampling 10x candidates costs about as much as an agent update);
                # its own key: every other draw stays as it was
                if self.parts.has_falls and (evaluate_now or it == 1):
                    falls = self._falls(rollout, rewards, member_r, jax.random.fold_in(k_corr, 1))
                    row.update({f"fall_{k}": finite_or_none(v) for k, v in falls.items()})
                row.update(time_labels_s=t2 - t1, time_fit_s=t3 - t2, time_diagnostics_s=time.perf_counter() - t3)
            episodes, episode_return = tracker.update(rollout.raw_reward, self.parts.episode_ends(rollout),
                                                      rollout.valid)
            row.update(
                labels=answered,
                queries=asked,
                true_return=float(jnp.mean(rollout.true_reward)) * spec.horizon,
                predicted_return=float(jnp.mean(rewards)) * spec.horizon,
                episodes=episodes,
                episode_return=episode_return,
                terminations=int(rollout.terminated.sum()),
                policy_entropy=float(agent_m.get("entropy", jnp.nan)),
                time_agent_s=t1 - t0,
            )
            if self.can_evaluate and evaluate_now:
                row["eval_return"] = float(self._eval(agent_state.params, k_eval))
            row["wall_s"] = wall_before + time.perf_counter() - start
            row["steps_per_s"] = env_steps / row["wall_s"]
            writer.write(row)
            tb.scalars(env_steps, row)
            if it == self.num_iters or (cfg.checkpoint_every and it % cfg.checkpoint_every == 0) \
                    or (new_labels and cfg.checkpoint_on_labels):
                save(it)
            if bar is not None:
                bar.update(self.steps_per_iter)
                post = {"true": f"{row['true_return']:.1f}", "labels": answered}
                if row.get("eval_return") is not None:
                    post["eval"] = f"{row['eval_return']:.1f}"
                elif row.get("episode_return") is not None:
                    post["score"] = f"{row['episode_return']:.1f}"
                bar.set_postfix(post)
        if bar is not None:
            bar.close()
        if human:
            self.human.close()
            self._publish(state="finished")
        writer.close()
        tb.close()
        summary = self._summary(read_jsonl(out / "metrics.jsonl"), answered, asked)
        self.final = dict(agent_state=agent_state, ens_state=ens_state, buffer=buffer)
        return summary

    def _summary(self, rows, answered, asked) -> dict[str, Any]:
        cfg, out = self.cfg, Path(self.cfg.out)
        last = rows[-1] if rows else {}
        values = lambda k: [r[k] for r in rows if r.get(k) is not None]
        evals, scores = values("eval_return"), values("episode_return")
        summary = {
            "env": self.spec.name,
            "agent": cfg.agent,
            "reward_source": cfg.reward_source,
            "ablation": cfg.ablation,
            "seed": cfg.seed,
            "env_steps": last.get("env_steps", 0),
            "requested_steps": cfg.total_steps,  # env_steps is whole iterations of it (RunParts.steps_note)
            "labels": answered,
            "queries": asked,
            "final_eval_return": evals[-1] if evals else None,
            "best_eval_return": max(evals) if evals else None,
            "final_episode_return": scores[-1] if scores else None,
            "final_true_return": last.get("true_return"),
            "final_reward_correlation": last.get("reward_correlation"),
            "final_val_accuracy": next((r["val_accuracy"] for r in reversed(rows) if r.get("val_accuracy") is not None),
                                       None),
            "wall_s": last.get("wall_s"),
            "steps_per_s": last.get("steps_per_s"),
        }
        write_summary(out, summary)
        what = "preferences" if self.learn else "true reward"
        plot_learning_curve(rows, out / "learning_curve.png",
                            title=f"{self.spec.name} — {cfg.agent.upper()} on {what}, {answered} labels, seed {cfg.seed}"
                                  + (f", ablation {cfg.ablation}" if cfg.ablation else ""))
        return summary


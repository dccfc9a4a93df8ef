"""The thin driver (layer 6): the loop of Christiano et al. 2017, §2.2, interleaved in one thread.

    act on r̂ → segments → candidate pairs (×10) → select queries → teacher labels → fit ensemble → repeat

Acting, labeling and fitting are the pure steps of ``rlhp_jax.loop.RunParts`` over a
``loop.TrainState`` (the compiled loop runs the same ones); this module only jits them, holds
the state between iterations, asks the label schedule how many queries are due and poses them
to a ``teachers.Teacher`` (the oracle, answering at once, or people through the label store,
answering when they do: the same code path), logs, checkpoints and plots.  The same loop trains on the true reward when ``reward_source="true"`` (the RL baseline:
as it is, or shifted and scaled by a random policy's statistics, as ``baseline_reward`` says).

One driver iteration runs ``updates_per_iter`` agent updates, their rollouts laid end to end as
the pool that segments are drawn from.  On a pure-JAX task they run inside one compiled
``lax.scan`` (A2C's 5-step updates would otherwise pay the host round trip 80 env steps at a
time); with ``iteration_loop="host"`` (a CNN policy on CPU) and on an envpool task, whose acting
compiles at every start, a host loop calls one compiled update at a time (``_build_functions``).  The reward
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
from rlhp_jax.compile_cache import jit as program
from rlhp_jax.agents.common import evaluate
from rlhp_jax.config import RunConfig
from rlhp_jax.loop import RunParts, TrainState, chunk_keys, fold_in, query_chunks, split_keys, step_keys
from rlhp_jax.metrics import finite_or_none, import_plotting_ahead, nanmean_or_none, plot_learning_curve, read_jsonl
from rlhp_jax.runs import claimed, continues_from_checkpoint, finished_line, open_run, write_summary
from rlhp_jax.teachers import OracleTeacher, Teacher, await_answers


def host_values(metrics: dict) -> dict:
    """A metrics dict of arrays as a row's plain values: ints stay ints, NaN becomes None."""
    out = {}
    for k, v in jax.device_get(metrics).items():
        v = np.asarray(v)
        out[k] = int(v) if v.dtype.kind in "iub" else finite_or_none(v)
    return out


class PreferenceRun:
    """Builds every component for a config and runs the loop. ``run()`` returns the summary.

    ``resume=True`` continues the run in ``config.out`` from its newest checkpoint, or, if it was
    stopped before its first one, starts it again there (:func:`continues_from_checkpoint`).
    A start from the config truncates ``metrics.jsonl``, and TensorBoard hides the events a killed
    attempt logged beyond the checkpoint, so no row is ever logged twice.

    ``pause_at=N`` stops after iteration N, once its checkpoint is committed, and returns
    ``{"paused_at": N, ...}`` instead of the summary (none is written): the directory is a run
    stopped there, which ``resume=True`` continues; it is the uninterrupted run's state at N, so
    its reward model and policy can be read part-way (BUILD_NOTES, "Early on, r̂ pays").
    """

    def __init__(self, config: RunConfig, progress: bool = True, log: Callable[[str], None] = print,
                 resume: bool = False, pause_at: int | None = None):
        self.cfg = config
        self.progress = progress
        self.log = log
        self.resume = resume
        self.parts = parts = RunParts(config)
        for name in ("env", "spec", "seg_len", "updates_per_iter", "steps_per_iter", "rollout_len", "num_iters",
                     "agent", "ensemble", "learn", "schedule", "fit_steps", "pretrain_steps", "can_evaluate",
                     "iteration_loop"):
            setattr(self, name, getattr(parts, name))
        if pause_at is not None and not 1 <= pause_at < self.num_iters:
            raise ValueError(f"--pause-at {pause_at}: this run's iterations are 1 to {self.num_iters}; pause at one "
                             f"from 1 to {self.num_iters - 1} (its last one ends the run anyway)")
        self.pause_at = pause_at
        self._build_functions()

    # ------------------------------------------------------------------ compiled pieces
    def _build_functions(self):
        parts, cfg = self.parts, self.cfg
        # an envpool task's acting compiles at every start (below): one program, for every update and,
        # with one update an iteration, for the first rollout too
        collect_jit = None if parts.can_evaluate else program(parts.collect)
        if self.iteration_loop == "host" or not parts.can_evaluate:
            # a host loop over the K updates: a CNN policy on CPU (see loop.py), or an envpool task, whose
            # steps no process can load compiled (envpool's calls carry its object's address): its acting
            # compiles at every start, its learning is kept apart in the cache
            finish_jit, keys_jit = program(parts.finish), program(parts.update_keys)
            if parts.can_evaluate:
                update_jit = program(parts.one_update)
            else:
                learn_jit = program(parts.learn_once)  # act_once as a kept key split and collect

                def update_jit(carry, k):
                    agent_state, env_state, obs, ens_state, reward_scale = carry
                    k_roll, k_upd = split_keys(k, 2)
                    env_state, obs, rollout = collect_jit(agent_state, env_state, obs, k_roll)
                    return learn_jit((agent_state, env_state, obs, ens_state, reward_scale), rollout, k_upd)

            def host_iteration(agent_state, env_state, obs, ens_state, reward_scale, key):
                carry, outs = (agent_state, env_state, obs, ens_state, reward_scale), []
                for k in keys_jit(key):
                    carry, out = update_jit(carry, k)
                    outs.append(out)
                return finish_jit(carry, jax.tree.map(lambda *xs: jnp.stack(xs), *outs))

            self.compiled_iteration = host_iteration
        else:
            self.compiled_iteration = program(parts.iteration)
        self._rollout_only = program(parts.rollout_only, quick=True)
        if collect_jit is not None and parts.updates_per_iter == 1:
            # the first rollout is then one update's: the acting program the iteration compiles anyway
            member_rewards_jit = program(parts.member_rewards, quick=True)

            def rollout_only(agent_state, env_state, obs, ens_state, key):
                env_state, obs, rollout = collect_jit(agent_state, env_state, obs, key)
                return env_state, obs, rollout, member_rewards_jit(ens_state, rollout)

            self._rollout_only = rollout_only
        self._candidates = program(parts.candidates, static_argnums=4, quick=True)
        self._add = program(labels_lib.add_labels, quick=True)
        self._fit = self.ensemble.fitter(block=self.fit_steps)  # pretraining in blocks of an iteration's fit
        self._evaluate_ensemble = program(self.ensemble.evaluate, quick=True)
        self._correlation = program(parts.correlation, quick=True)
        # quick (compile_cache.QUICK_COMPILE): programs run once or cheap per iteration; the agent's
        # iteration and the fit are not, nor these reductions, whose logged floats the quick options move
        self._falls = program(parts.fall_diagnostics)
        self._score = program(parts.score_episodes)
        self._progress_metrics = program(parts.progress_metrics)
        if self.can_evaluate:
            env, agent = self.env, self.agent

            def evaluate_policy(params, key):
                return evaluate(env, agent, params, key, cfg.eval_episodes, self.spec.horizon)

            # public with compiled_iteration: the diagnostics train fresh agents with the run's own
            self.evaluate_policy = program(evaluate_policy, quick=True)

    # ------------------------------------------------------------------ labels
    def _teacher(self, out: Path) -> Teacher:
        if self.cfg.label_source == "human":
            from rlhp_jax.human.teacher import HumanTeacher, pair_shapes

            return HumanTeacher(out, self.cfg.env, render_fields=getattr(self.env, "render_fields", ()),
                                pair_shapes=pair_shapes(self.spec, self.seg_len),  # other pairs: skipped
                                max_pending=self.cfg.max_pending_queries,
                                native_frames=getattr(self.env, "native_frames", None))  # Atari: colour clips
        return OracleTeacher(self.cfg.teacher)

    def _ask(self, teacher: Teacher, member_r, rollout, key, n: int, env_steps: int, size: int) -> int:
        """Select ``n`` pairs from ``rollout`` (in chunks of the phase's compiled ``size``: see
        ``loop``) and pose them to ``teacher``; returns ``n``."""
        chunks = query_chunks(n, size)
        for (q, take), (k_c, k_t, k_a) in zip(chunks, chunk_keys(key, len(chunks))):
            pairs, render = self._candidates(member_r, rollout, k_c, take, q)
            teacher.ask(pairs, render, take, (k_t, k_a), env_steps)
        return n

    def _collect(self, teacher: Teacher, buffer, key):
        """Add the answers that arrived to the label set: (buffer, labels to train on added)."""
        added = 0
        for a in teacher.collect(key):
            buffer = self._add(buffer, a.key, a.pairs, jnp.asarray(a.mu), jnp.asarray(a.mask))
            added += int(np.asarray(a.mask).sum())
        return buffer, added

    # ------------------------------------------------------------------ checkpoints
    def _checkpointer(self, background: bool = False):
        from rlhp_jax.checkpoint import Checkpointer

        return Checkpointer(Path(self.cfg.out) / "checkpoints", keep=self.cfg.keep_checkpoints, background=background)

    def _saveable(self, state: TrainState) -> dict:
        saved = dict(agent=state.agent, ensemble=state.ensemble, buffer=state.buffer, key=state.key)
        if self.can_evaluate:  # a pure-JAX environment: its state is a pytree we can save
            saved.update(env_state=state.env_state, obs=state.obs)
        return saved

    def _restore(self, ckpt, state: TrainState) -> tuple[TrainState, dict]:
        saved, meta = ckpt.restore(self._saveable(state))
        state = state.replace(agent=saved["agent"], ensemble=saved["ensemble"], buffer=saved["buffer"],
                              key=saved["key"], reward_scale=jnp.asarray(meta["reward_scale"], jnp.float32))
        if self.can_evaluate:
            state = state.replace(env_state=saved["env_state"], obs=saved["obs"])
        if meta.get("episode_sums") is not None:
            state = state.replace(episode_sums=jnp.asarray(meta["episode_sums"], jnp.float32))
        return state, meta

    def restore_latest(self) -> tuple[dict, dict] | None:
        """The newest checkpoint in the run's directory as ``(state, meta)`` (state: ``agent``,
        ``ensemble``, ``buffer``, ``key`` and, for pure-JAX tasks, ``env_state``/``obs``), or
        None when the run has none yet.  For tools that read a trained run (demo recording,
        diagnostics); ``run`` restores through the same template."""
        ckpt = self._checkpointer()
        if ckpt.latest_step() is None:
            return None
        return ckpt.restore(self._saveable(self.parts.fresh(jax.random.PRNGKey(0), reward_scale=False)))

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        """Train to the end (or on from a checkpoint), holding the run directory against every other
        process meanwhile (``runs.claimed``); returns the summary."""
        with claimed(self.cfg.out):
            return self._run()

    def _run(self) -> dict[str, Any]:
        cfg, spec, parts = self.cfg, self.spec, self.parts
        out = Path(cfg.out)
        learn = self.learn
        # saved on a thread while the next iteration runs (each save waits for the one before)
        ckpt = self._checkpointer(background=True)
        restoring = continues_from_checkpoint(ckpt, out, self.resume, self.log)
        if parts.steps_note:
            self.log(parts.steps_note)
        if parts.schedule is not None:
            self.log(parts.schedule.describe())
        # restoring: the baseline's random-policy statistics are in the checkpoint, not drawn again
        state = parts.fresh(jax.random.PRNGKey(cfg.seed), reward_scale=not restoring)
        asked = answered = 0
        start_iter, wall_before = 1, 0.0
        meta: dict = {}
        if restoring:
            state, meta = self._restore(ckpt, state)
            start_iter = int(meta["iteration"]) + 1
            asked, answered = int(meta["queries"]), int(meta["labels"])
            wall_before = float(meta.get("wall_s", 0.0))
            if self.pause_at is not None and self.pause_at < start_iter:
                raise ValueError(f"--pause-at {self.pause_at}: {out} is at iteration {start_iter - 1} already"
                                 + (f"; pause at a later one, up to {self.num_iters - 1}"
                                    if start_iter < self.num_iters else ""))
            if start_iter > self.num_iters:  # killed after its last checkpoint, or simply resumed again
                self.log(finished_line(out, f"iteration {start_iter - 1} of {self.num_iters}"))
            else:
                self.log(f"resuming {out} from iteration {start_iter - 1} ({asked} queries, {answered} labels)")
        writer, tb = open_run(out, cfg, restoring=restoring, resume=self.resume,
                              covered=("iteration", start_iter - 1),
                              purge_step=start_iter * self.steps_per_iter)
        teacher = self._teacher(out) if learn else None
        if teacher is not None and restoring:
            teacher.restore(meta)
        total_steps = self.num_iters * self.steps_per_iter
        start = time.perf_counter()

        def save(it, state):
            meta = dict(iteration=it, queries=asked, labels=answered, wall_s=wall_before + time.perf_counter() - start,
                        episode_sums=np.asarray(state.episode_sums).tolist(),
                        reward_scale=np.asarray(state.reward_scale).tolist(),
                        **(teacher.meta() if teacher is not None else {}))
            ckpt.save(it, self._saveable(state), meta)

        if not restoring and learn and self.schedule.initial > 0:
            # Christiano A: the first comparisons are of clips from the untrained policy.
            state, rollout, member_r, (k_q, k_fit) = parts.initial_rollout(state, self._rollout_only)
            initial = self.schedule.initial
            buffer, answered = self._collect(teacher, state.buffer, fold_in(k_q, 1))
            earlier = teacher.responses + teacher.pending()  # people: an earlier start in this directory
            if earlier:
                self.log(f"reusing {teacher.responses} answers and {earlier - teacher.responses} open pairs "
                         f"already in {out}")
            asked = earlier + self._ask(teacher, member_r, rollout, k_q, max(0, initial - earlier), 0,
                                        parts.initial_chunk)
            teacher.publish(labels_due=initial, responses=teacher.responses, env_steps=0, total_steps=total_steps,
                            state="waiting for the first labels")

            def look(i):  # the i-th look collects with fold_in(k_q, 1 + i): 2, 3, …
                nonlocal buffer, answered
                buffer, got = self._collect(teacher, buffer, fold_in(k_q, 1 + i))
                answered += got
                return initial - teacher.responses if cfg.wait_for_initial_labels else 0

            await_answers(look, lambda awaited, _: self.log(
                f"waiting for people: {teacher.responses} of the first {initial} answers (RL starts when they are in)"))
            # pretraining (0 steps: A.1) ends with r̂'s normalization over the initial labels
            ens_state, _ = self._fit(state.ensemble, buffer, k_fit, self.pretrain_steps)
            state = state.replace(buffer=buffer, ensemble=ens_state)
            save(0, state)

        bar = None
        if self.progress:
            from tqdm import tqdm
            bar = tqdm(total=total_steps, initial=(start_iter - 1) * self.steps_per_iter,
                       unit="step", unit_scale=True, dynamic_ncols=True,
                       desc=f"{spec.name} {cfg.agent} {'r̂' if learn else 'true r'}")
        for it in range(start_iter, self.num_iters + 1):
            key, keys = step_keys(state.key)
            t0 = time.perf_counter()
            state, rollout, rewards, member_r, agent_m = parts.act(state.replace(key=key), keys.iteration,
                                                                   self.compiled_iteration)
            if it == start_iter:
                import_plotting_ahead()  # for the learning curve at the end, while this waits
            jax.block_until_ready((rewards, state.agent))  # the update too: its time is the agent's
            t1 = time.perf_counter()
            env_steps = it * self.steps_per_iter
            row: dict[str, Any] = {"iteration": it, "env_steps": env_steps}
            responded = False
            evaluate_now = it % cfg.eval_every == 0 or it == self.num_iters
            if learn:
                due = int(self.schedule.due(env_steps))
                before = teacher.responses
                buffer, got = self._collect(teacher, state.buffer, fold_in(keys.queries, 1))
                if cfg.query_max_age_steps:
                    teacher.withdraw_older_than(env_steps - cfg.query_max_age_steps)
                pending = teacher.pending()
                n = due - teacher.responses - pending
                if teacher.max_pending is not None:
                    n = min(n, teacher.max_pending - pending)
                if n > 0:
                    asked += self._ask(teacher, member_r, rollout, keys.queries, n, env_steps, parts.online_chunk)
                buffer, got2 = self._collect(teacher, buffer, fold_in(keys.queries, 2))
                answered += got + got2
                responded = teacher.responses > before
                state = state.replace(buffer=buffer)
                row["labels_due"] = due
                if teacher.asynchronous:
                    row.update(label_responses=teacher.responses, label_gap=due - teacher.responses,
                               labels_pending=teacher.pending(), label_cant_tell=teacher.responses - answered)
                    teacher.publish(labels_due=due, responses=teacher.responses, env_steps=env_steps,
                                    total_steps=total_steps, state="training")
                t2 = time.perf_counter()
                ev = None  # the fitted model's accuracy and loss on the labels, from the fit's own scoring
                if self.fit_steps > 0 and answered > 0:
                    ens_state, fit_m = self._fit(state.ensemble, state.buffer, keys.fit, self.fit_steps)
                    state = state.replace(ensemble=ens_state)
                    row["rm_train_loss"] = float(np.nanmean(np.asarray(fit_m["train_loss"])))
                    row["rm_l2"] = float(np.mean(np.asarray(ens_state.l2)))
                    ev = fit_m["evaluation"]
                t3 = time.perf_counter()
                # validated with the evaluations and at iteration 1 (the model fitted on the initial labels),
                # not at a resumed run's first iteration: its rows are the uninterrupted run's
                if evaluate_now or it == 1:
                    ev = self._evaluate_ensemble(state.ensemble, state.buffer) if ev is None else ev
                    row["val_accuracy"] = nanmean_or_none(ev["val_accuracy"])
                    row["rm_val_loss"] = nanmean_or_none(ev["val_loss"])
                row["reward_correlation"] = finite_or_none(self._correlation(rollout, rewards, keys.correlation))
                # with the validation (sampling 10x candidates costs about as much as an agent update);
                # its own key: every other draw stays as it was
                if parts.has_falls and (evaluate_now or it == 1):
                    falls = self._falls(rollout, rewards, member_r, fold_in(keys.correlation, 1))
                    row.update({f"fall_{k}": finite_or_none(v) for k, v in falls.items()})
                row.update(time_labels_s=t2 - t1, time_fit_s=t3 - t2, time_diagnostics_s=time.perf_counter() - t3)
            t4 = time.perf_counter()
            sums, episodes, total = self._score(state.episode_sums, rollout)
            state = state.replace(episode_sums=sums, queries=asked, labels=answered)
            row.update(host_values(self._progress_metrics(it, state, rollout, rewards, agent_m, episodes, total)))
            t5 = time.perf_counter()
            row.update(time_agent_s=t1 - t0, time_metrics_s=t5 - t4)
            if self.can_evaluate and evaluate_now:
                row["eval_return"] = float(self.evaluate_policy(state.agent.params, keys.evaluation))
                row["time_eval_s"] = time.perf_counter() - t5
            row["wall_s"] = wall_before + time.perf_counter() - start
            row["steps_per_s"] = env_steps / row["wall_s"]
            writer.write(row)
            tb.scalars(env_steps, row)
            paused = it == self.pause_at
            if it == self.num_iters or (cfg.checkpoint_every and it % cfg.checkpoint_every == 0) \
                    or (responded and cfg.checkpoint_on_labels and teacher.asynchronous) or paused:
                save(it, state)
            if bar is not None:
                bar.update(self.steps_per_iter)
                post = {"true": f"{row['true_return']:.1f}", "labels": answered}
                if row.get("eval_return") is not None:
                    post["eval"] = f"{row['eval_return']:.1f}"
                elif row.get("episode_return") is not None:
                    post["score"] = f"{row['episode_return']:.1f}"
                bar.set_postfix(post)
            if paused:
                break
        if bar is not None:
            bar.close()
        ckpt.close()  # the last checkpoint committed
        if teacher is not None:
            teacher.close()
            teacher.publish(state="paused" if self.pause_at is not None else "finished")
        writer.close()
        tb.close()
        self.final = dict(agent_state=state.agent, ens_state=state.ensemble, buffer=state.buffer)
        if self.pause_at is not None:  # no summary: the run is not over, and --resume continues it
            return dict(paused_at=self.pause_at, iterations=self.num_iters, env_steps=self.pause_at * self.steps_per_iter)
        return self._summary(read_jsonl(out / "metrics.jsonl"), answered, asked)

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
        what = "preferences" if self.learn else "true reward"
        plot_learning_curve(rows, out / "learning_curve.png",
                            title=f"{self.spec.name} — {cfg.agent.upper()} on {what}, {answered} labels, seed {cfg.seed}"
                                  + (f", ablation {cfg.ablation}" if cfg.ablation else ""))
        write_summary(out, summary)  # last: its presence says everything else is there
        return summary


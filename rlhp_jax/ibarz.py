"""The training protocol of Ibarz et al. 2018 (layer 6: driver): Algorithm 1 and appendix A.4.

    1. the expert's demonstrations                       (``--demos``, rlhp_jax.demos)
    2. pretrain the policy on them (J_E + Q loss)        20,000 batches
    3. run it: the initial trajectories
    4-5. uniformly chosen clip pairs, labeled            500 (250 / 125 / 83 on reduced schedules)
    6. optionally autolabels: demo clip ≻ initial clip   2 per initial pair
    7. train the reward model                            50,000 batches
    8. pretrain the policy on the demos again, now with r̂  60,000 batches
    9-14. iterations of 1e5 actor steps with r̂ fixed; after each: labels per the schedule from its
        trajectories, 6,250 reward-model batches, r̂ renormalized to mean 0 and std 0.05 over the
        annotation buffer

The agent is DQfD (``rlhp_jax.agents.dqfd``) on the prioritized replay of ``rlhp_jax.replay``
(demonstrations permanent); the reward model is a single A.3 predictor (no ensemble, uniform
batches from the annotation buffer, 1/e held out with adaptive L2, input noise 0.1, an L2 prior
on its outputs, dropout 0.2).  Setups (Ibarz §3): ``imitation`` (J_E on the demos only, no
preferences), ``no_demos`` (DQN from preferences), ``demos+prefs`` and
``demos+prefs+autolabels``.  ``frozen_reward`` trains a fresh agent on a finished run's reward
model, held fixed and never relabeled (the reward-hacking experiment of §3.2).

**Who labels** (``label_source``): the synthetic oracle, which answers at once, or people
(``"human"``), as in Ibarz's *human* runs, whose labels came in batches between iterations
(A.4: "about every 6 hours, corresponding to about 12 iterations").  Both are a
``teachers.Teacher`` and take one code path: at each labeling point the clips are posed
(``ask``), the answers that have arrived are added (``collect``), and the labels due less those
answered or still awaited are posed anew, so a pair is never posed twice.  People get the pairs
through ``human.teacher.HumanTeacher``, the same queue, clips and labeling page as Christiano's
human runs (on Atari the agent's 84×84 frames: native colour would need a ring of every frame
of an iteration).  The initial batch is always awaited (the reward model is first trained on
it); then ``wait_for_labels`` chooses: each iteration's batch is awaited before the reward model
is trained and the next iteration starts, or training goes on with r̂ as it is and the answers
are used after whichever iteration they arrive in.  While it waits the run says so every
``teachers.WAIT_LOG_S`` seconds, and the page shows the labels due.  Autolabels need no one: each clip of
each initial pair is labeled worse than a demo clip whoever labels the pairs.

Acting and learning are one host loop over two compiled functions (act+step, and
sample→r̂→update), because the replay buffer lives in host memory (see ``replay``).  Checkpoints
(orbax) are written after each stage and each iteration and hold the agent, the reward model, the
annotation buffer, the replay buffer, the RNG states and the counters; a run killed at any moment
continues from the last one with no label lost (one killed before its first checkpoint starts again
from its config.json: ``runs.continues_from_checkpoint``).  A checkpoint also holds the teacher's
``meta`` (people: the id of the last answer used), so each answer is used exactly once: answers
given after the checkpoint, or while the run was down, are read on resuming, and pairs posed after
it stay posed (answered or open) and are not posed again.  The iterations are whole: ``total_steps``
is rounded up to them, and the run says so (``steps_note``, ``requested_steps`` in the summary).

ε (A.3: annealed "during the first 1e5 actor steps") counts the actor steps of the iterations
only: the initial trajectories (Algorithm 1's step 3, before any learning) are run at the
schedule's first ε and do not advance it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlhp_jax import labels as labels_lib
from rlhp_jax.compile_cache import jit as program
from rlhp_jax.agents.dqfd import DQfD
from rlhp_jax.config import IbarzConfig
from rlhp_jax.core import episode_ends
from rlhp_jax.demos import (DemoError, Demos, autolabels, demos_problem, frame_format, load_demos,
                             record_demos)
from rlhp_jax.runs import (claimed, continues_from_checkpoint, finished_line, open_run, read_run_config,
                           write_summary)
from rlhp_jax.ensemble import RewardEnsemble
from rlhp_jax.envs import make_env
from rlhp_jax.labels import bucket
from rlhp_jax.loop import fold_in, split_keys, steps_note
from rlhp_jax.metrics import (finite_or_none, nanmean_or_none, plot_ibarz_run,
                              read_jsonl, segment_return_correlation)
from rlhp_jax.preferences import label_entropy_bound
from rlhp_jax.replay import PrioritizedReplay
from rlhp_jax.reward_models import reward_model_spec_for
from rlhp_jax.schedules import initial_rollout_steps, label_schedule
from rlhp_jax.teachers import OracleTeacher, Teacher, await_answers

# stages of the protocol; a checkpoint's step number is the stage it completed (iteration i, from 1:
# SECOND_PRETRAIN + i)
BC, INITIAL, RM_PRETRAIN, SECOND_PRETRAIN = 1, 2, 3, 4
LABEL_BATCH = 512  # pairs labeled and added in one compiled call (Atari clips: 512 × 2 × 25 frames)


class IbarzRun:
    """Builds the components of a config and runs the protocol; ``run()`` returns a summary.

    ``act_step(params, env_state, obs, key, epsilon)`` (one ε-greedy step of every actor) and
    ``rewards(rm_state, obs, action)`` (r̂ as the agent gets it) are compiled and public, for
    diagnostics that replay a trained run's policy and reward model."""

    def __init__(self, config: IbarzConfig, progress: bool = True, log: Callable[[str], None] = print,
                 resume: bool = False):
        self.cfg = cfg = config
        self.progress, self.log, self.resume = progress, log, resume
        self.env = make_env(cfg.env, cfg.num_envs, **cfg.env_kwargs())
        self.spec = spec = self.env.spec
        if not spec.discrete:
            raise ValueError(f"DQfD needs discrete actions; {spec.name} is continuous. "
                             "Use python -m experiments.mujoco (TRPO) for it.")
        self.fmt = frame_format(self.env)
        self.label_source = getattr(cfg, "label_source", "synthetic")
        self.wait_for_labels = getattr(cfg, "wait_for_labels", True)
        if self.label_source not in ("synthetic", "human"):
            raise ValueError(f"label_source must be 'synthetic' or 'human', got {self.label_source!r}")
        if self.label_source == "human" and not cfg.learns_rewards:
            raise ValueError("--teacher human: this run asks for no labels (" + (
                "its reward model is frozen" if cfg.frozen_reward is not None else f"the {cfg.setup} setup")
                + "); drop --teacher human.")
        agent_cfg = cfg.agent_config
        if cfg.setup == "imitation":  # no reward: the supervised margin loss alone
            agent_cfg = dataclasses.replace(agent_cfg, td_weight=0.0)
        self.agent = DQfD(spec, agent_cfg)
        if cfg.reward_model.next_obs:
            raise ValueError("an r̂ of the transition (next_obs) is an option of the A.1 runs (experiments.mujoco, "
                             "experiments.classic); Ibarz's protocol keeps the paper's r̂ of the frames")
        model_spec = dataclasses.replace(reward_model_spec_for(spec), dropout_rate=cfg.reward_dropout)
        self.rm = RewardEnsemble(model_spec, cfg.reward_model)
        self.demos: Demos | None = None
        if cfg.uses_demos:
            self.demos = load_demos(cfg.demos, self.env).subset(cfg.demo_fraction)
        self.initial = cfg.initial_count() if cfg.learns_rewards else 0
        self.num_iters = max(1, math.ceil(cfg.total_steps / cfg.iteration_steps))  # whole iterations: rounded up
        self.total_steps = self.num_iters * cfg.iteration_steps
        per_iteration = math.ceil(cfg.iteration_steps / cfg.num_envs) * cfg.num_envs  # all actors step together
        self.steps_note = steps_note(cfg.total_steps, self.num_iters * per_iteration, per_iteration)
        if cfg.learns_rewards:
            self.schedule = label_schedule(cfg.labels, self.total_steps, initial_count=self.initial,
                                           rate_constant=cfg.rate_constant)
        self.autolabel_count = 2 * self.initial if cfg.setup == "demos+prefs+autolabels" else 0
        if self.autolabel_count and self.demos.segment_starts(cfg.segment_length).size == 0:
            raise DemoError(f"autolabels need demo clips of {cfg.segment_length} steps, and no demo episode is "
                            f"that long (longest: {int(self.demos.episode_lengths.max())} steps)")
        self.initial_steps = cfg.initial_steps or initial_rollout_steps(self.initial, cfg.segment_length)
        self.initial_steps = max(self.initial_steps, cfg.segment_length + cfg.replay.n_step + 1) \
            if cfg.learns_rewards else 0
        self.can_save_env = hasattr(self.env, "episodic_reset")  # pure-JAX envs: their state is a pytree
        self._build_functions()

    # ------------------------------------------------------------------ compiled pieces
    def _build_functions(self):
        agent, rm, cfg, env = self.agent, self.rm, self.cfg, self.env
        n = cfg.replay.n_step
        uses_rm = cfg.uses_reward_model

        def act_step(params, env_state, obs, key, epsilon):
            k_act, k_env = jax.random.split(key)
            action = agent.act(params, obs, k_act, epsilon)
            env_state, out = env.step(k_env, env_state, action)
            return env_state, action, out

        def rewards_of(rm_state, obs, action):
            """r̂ of [B, k, ...] observations (normalized, std 0.05): [B, k]."""
            b, k = obs.shape[:2]
            if not uses_rm:
                return jnp.zeros((b, k), jnp.float32)
            flat_o = obs.reshape(b * k, *obs.shape[2:])
            flat_a = action.reshape(b * k, *action.shape[2:])
            return rm.predict_reward(rm_state, flat_o, flat_a).reshape(b, k)

        stack_first = self.fmt.stack > 1  # the replay hands over [B, n+1, stack, H, W] (see replay.transitions)

        def learn(agent_state, rm_state, batch, margin_on):
            if stack_first:
                batch = dict(batch, obs=jnp.moveaxis(batch["obs"], 2, -1))
            rewards = rewards_of(rm_state, batch["obs"][:, :n], batch["action"][:, :n])
            agent_state, metrics, td_abs = agent.update(agent_state, batch, rewards, margin_on)
            metrics["reward_mean"] = jnp.mean(rewards)
            return agent_state, metrics, td_abs

        def td_error(agent_state, rm_state, batch):
            """|δ| [B] of transitions as they are added to the replay buffer (its priorities, A.3)."""
            if stack_first:
                batch = dict(batch, obs=jnp.moveaxis(batch["obs"], 2, -1))
            rewards = rewards_of(rm_state, batch["obs"][:, :n], batch["action"][:, :n])
            return agent.loss(agent_state.params, agent_state.target_params, batch, rewards)[1][1]

        self.act_step = program(act_step)
        self._learn = program(learn)
        self._td_error = program(td_error)
        self.rewards = program(lambda s, o, a: rewards_of(s, o[:, None], a[:, None])[:, 0])
        # A.4's pretraining (50,000 batches) in blocks of an iteration's fit (6,250): one program for
        # both, the same steps (``RewardEnsemble.fitter``)
        self._fit = rm.fitter(block=cfg.rm_batches_per_iteration or None)
        self._add = program(labels_lib.add_labels, quick=True)
        # the lowest loss any model could reach on the buffer's labels (Ibarz C, Fig. 7)
        self._label_bound = program(lambda buf: label_entropy_bound(buf.mu, rm.config.error_rate, buf.filled))

    # ------------------------------------------------------------------ pieces of the protocol
    def _learn_steps(self, num: int, demo_only: bool, desc: str):
        """``num`` learning steps (pretraining: on the demonstrations only)."""
        bar = self._bar(num, desc, unit="batch")
        history = []
        for _ in range(num):
            self._one_learning_step(demo_only, history)
            if bar is not None:
                bar.update(1)
        if bar is not None:
            bar.close()
        return _mean_metrics(history)

    def _one_learning_step(self, demo_only: bool, history: list):
        batch = self.replay.sample(self.rng, self.agent.config.batch_size, demo_only=demo_only, stack_last=False)
        idx = batch.pop("index")
        batch.pop("true_reward")
        self.agent_state, metrics, td_abs = self._learn(self.agent_state, self.rm_state, batch,
                                                        jnp.float32(self.demos is not None))
        self.replay.update_priorities(idx, np.asarray(td_abs))
        history.append(metrics)

    def _bar(self, total: int, desc: str, unit: str = "step", initial: int = 0):
        if not self.progress or total <= 0:
            return None
        from tqdm import tqdm

        return tqdm(total=total, initial=initial, desc=desc, unit=unit, unit_scale=True, dynamic_ncols=True)

    def _act(self, num_steps: int, learn: bool, history: list, on_step=None):
        """``num_steps`` actor steps (per actor: num_steps / num_envs), storing every transition and
        learning every ``update_every`` actor steps.  Returns finished episodes' scores."""
        cfg, agent = self.cfg, self.agent
        n_env = self.env.num_envs
        scores = []
        demo_only = cfg.setup == "imitation"
        for _ in range(math.ceil(num_steps / n_env)):
            self.key, k = split_keys(self.key, 2)
            eps = self._epsilon()
            obs_before = self.obs
            self.env_state, action, out = self.act_step(self.agent_state.params, self.env_state, self.obs, k, eps)
            obs_np = np.asarray(obs_before)
            out = jax.device_get(out)
            self.replay.add(obs_np, np.asarray(action), out.valid, out.true_reward)
            self.obs = out.obs
            ends = episode_ends(self.spec, np.asarray(out.boundary), np.asarray(out.terminated))
            raw = np.where(out.valid, out.raw_reward, 0.0)
            self.episode_sums += raw
            for i in np.flatnonzero(ends):
                scores.append(float(self.episode_sums[i]))
                self.episode_sums[i] = 0.0
            self.actor_steps += n_env
            if learn:
                self.iteration_actor_steps += n_env
                due = self.iteration_actor_steps // agent.config.update_every - self.learn_steps_done
                for _ in range(max(0, int(due))):
                    if self.replay.tree.total <= 0 and not demo_only:
                        break  # nothing drawable yet (no demos, first steps)
                    self._one_learning_step(demo_only, history)
                    self.learn_steps_done += 1
            if on_step is not None:
                on_step(n_env)
        return scores

    def _epsilon(self):
        """ε of the next actor step: A.3's schedule over the actor steps of the iterations (the
        initial trajectories, before learning starts, do not count: module docstring)."""
        return self.agent.epsilon(self.iteration_actor_steps)

    # ------------------------------------------------------------------ labels
    def _make_teacher(self, out: Path) -> Teacher:
        if self.label_source == "human":
            from rlhp_jax.human.teacher import HumanTeacher, pair_shapes

            return HumanTeacher(out, self.cfg.env, render_fields=getattr(self.env, "render_fields", ()),
                                pair_shapes=pair_shapes(self.spec, self.cfg.segment_length))  # other pairs: skipped
        return OracleTeacher(self.cfg.teacher)

    def _collect(self, key) -> int:
        """Add the answers that have arrived to the annotation buffer; returns the labels added
        ("can't tell" and skipped pairs are answers, not labels)."""
        added = 0
        for a in self.teacher.collect(key):
            self.buffer = self._add(self.buffer, a.key, a.pairs, jnp.asarray(a.mu), jnp.asarray(a.mask))
            added += int(np.asarray(a.mask).sum())
        self.answered += added
        return added

    def _outstanding(self, key) -> int:
        """The pairs posed so far that are answered or awaited, after adding the answers that have
        arrived: what of the labels due is already asked for.  Open pairs are counted before the
        answers are read, so an answer recorded in between counts twice, never not at once: no
        pair is posed twice (people: neither are those a killed attempt posed after the
        checkpoint, which are in the label store)."""
        pending = self.teacher.pending()
        self._collect(key)
        outstanding = self.teacher.responses + pending
        self.asked = max(self.asked, outstanding)
        return outstanding

    def _await_answers(self, what: str, due: int, key) -> float:
        """People: wait until every pair posed is answered, adding the answers as they come
        (``teachers.await_answers``: the i-th look reads with ``fold_in(key, i)``) and saying how it
        goes every ``WAIT_LOG_S`` seconds; returns the seconds waited (the oracle: 0)."""
        if not self.teacher.asynchronous:
            return 0.0

        def report(open_: int, waited: float) -> None:
            self._publish(due, f"waiting for the labels of {what}")
            self.log(f"waiting for people: {open_} pairs of {what} unanswered ({self.teacher.responses} of "
                     f"{due} labels due answered, {waited:.0f} s waited)")

        return await_answers(lambda i: self._outstanding(fold_in(key, i)) - self.teacher.responses, report)

    def _publish(self, due: int, state: str) -> None:
        """What the labeling page shows of the run (people only)."""
        if self.teacher.asynchronous:
            self.teacher.publish(labels_due=due, responses=self.teacher.responses, env_steps=self.actor_steps,
                                 total_steps=self.initial_steps + self.total_steps, state=state)

    def _label_row(self) -> dict:
        """People: the label columns of a metrics row (answers used, pairs open, "can't tell")."""
        if not self.teacher.asynchronous:
            return {}
        return dict(label_responses=self.teacher.responses, labels_pending=self.teacher.pending(),
                    label_cant_tell=self.teacher.responses - self.answered)

    def _label_recent(self, since: np.ndarray, num: int, key, posed: int = 0) -> labels_lib.SegmentPairs | None:
        """Pose ``num`` uniformly chosen clip pairs from the steps written since ``since`` to the
        teacher, all but the first ``posed`` (posed already, by a killed attempt of this stage:
        people's answers to those are in the label store).  The answers that arrive are added;
        returns the first chunk of pairs chosen (the autolabels' initial clips)."""
        if num <= 0:
            return None
        starts = self.replay.recent_segment_starts(since, self.cfg.segment_length)
        pool = [(lane, s) for lane, st in enumerate(starts) for s in st]
        if not pool:
            self.log("no clip fits in the latest trajectories: no labels this time")
            return None
        lanes = np.array([p[0] for p in pool])
        steps = np.array([p[1] for p in pool])
        first, done = None, 0
        remaining = num
        while remaining > 0:
            q = min(bucket(remaining), LABEL_BATCH)
            take = min(q, remaining)
            pick = self.rng.integers(0, len(pool), size=2 * q)
            clips = self.replay.segments(lanes[pick], steps[pick], self.cfg.segment_length)
            pairs = labels_lib.SegmentPairs(
                obs=jnp.asarray(clips["obs"].reshape(q, 2, *clips["obs"].shape[1:])),
                action=jnp.asarray(clips["action"].reshape(q, 2, -1)),
                true_reward=jnp.asarray(clips["true_reward"].reshape(q, 2, -1)))
            key, k_t, k_a = split_keys(key, 3)
            skip = min(take, max(0, posed - done))
            if skip < take:
                new = pairs if skip == 0 else jax.tree.map(lambda x: x[skip:], pairs)
                self.teacher.ask(new, None, take - skip, (k_t, k_a), self.actor_steps)
                self._collect(k_a)
                self.asked += take - skip
            if first is None:
                first = jax.tree.map(lambda x: np.asarray(x[:take]), pairs)
            done += take
            remaining -= take
        return first

    def _add_autolabels(self, initial_pairs: labels_lib.SegmentPairs, key) -> int:
        """Ibarz §2.5: each clip of each initial pair against a random demo clip, the demo preferred."""
        k = initial_pairs.obs.shape[0]
        demo = self.demos.segments(self.rng, 2 * k, self.cfg.segment_length)
        pairs, mu = autolabels(initial_pairs, demo)
        arrays = dict(obs=np.asarray(pairs.obs), action=np.asarray(pairs.action), true_reward=np.asarray(pairs.true_reward))
        for chunk, m, mask in labels_lib.padded_batches(arrays, np.asarray(mu), LABEL_BATCH):
            key, k_a = split_keys(key, 2)
            self.buffer = self._add(self.buffer, k_a, chunk, jnp.asarray(m), jnp.asarray(mask))
        self.autolabels_added += 2 * k
        return 2 * k

    def _fit_rm(self, num: int, key) -> dict:
        if num <= 0 or not self.cfg.learns_rewards:
            return {}
        self.replay.score_unscored()  # the transitions added since the last draw: scored with the r̂ they came under
        self.rm_state, m = self._fit(self.rm_state, self.buffer, key, num)
        ev = m["evaluation"]  # the fitted model on the labels, from the fit's own scoring of them
        return dict(rm_train_loss=float(jnp.nanmean(m["train_loss"])), rm_val_loss=nanmean_or_none(ev["val_loss"]),
                    val_accuracy=nanmean_or_none(ev["val_accuracy"]), train_accuracy=nanmean_or_none(ev["train_accuracy"]),
                    rm_l2=float(jnp.mean(self.rm_state.l2)),
                    rm_loss=float(ev["label_loss"][0]),  # the first member on every label, inference mode (Fig. 7)
                    label_entropy_bound=float(self._label_bound(self.buffer)))

    def _model_vs_true(self, since: np.ndarray) -> dict:
        """r̂ and the oracle's reward per 1,000 actor steps over steps sampled from the latest
        trajectories (the reward-hacking view of Ibarz Fig. 4), and their correlation over clips."""
        s = self.replay.recent_steps(self.rng, since, self.cfg.model_reward_samples)
        if s["obs"].shape[0] == 0:
            return {}
        if not self.cfg.uses_reward_model:  # imitation: the true reward only
            return dict(true_reward_per_1000=1000 * float(s["true_reward"].mean()))
        r = np.concatenate([np.asarray(self.rewards(self.rm_state, jnp.asarray(s["obs"][i:i + 512]),
                                                     jnp.asarray(s["action"][i:i + 512])))
                            for i in range(0, s["obs"].shape[0], 512)])
        row = dict(model_reward_per_1000=1000 * float(r.mean()),
                   true_reward_per_1000=1000 * float(s["true_reward"].mean()))
        starts = self.replay.recent_segment_starts(since, self.cfg.segment_length)
        pool = [(lane, st) for lane, ss in enumerate(starts) for st in ss]
        if len(pool) >= 2:
            pick = self.rng.integers(0, len(pool), size=min(256, len(pool)))
            lanes = np.array([pool[i][0] for i in pick])
            steps = np.array([pool[i][1] for i in pick])
            clips = self.replay.segments(lanes, steps, self.cfg.segment_length)
            o, a = clips["obs"], clips["action"]
            rr = np.asarray(self.rewards(self.rm_state, jnp.asarray(o.reshape(-1, *o.shape[2:])),
                                          jnp.asarray(a.reshape(-1, *a.shape[2:])))).reshape(a.shape[:2])
            c = segment_return_correlation(jnp.asarray(rr.sum(1)), jnp.asarray(clips["true_reward"].sum(1)))
            row["reward_correlation"] = finite_or_none(c)
        return row

    # ------------------------------------------------------------------ state
    def _saveable(self):
        state = dict(agent=self.agent_state, rm=self.rm_state, buffer=self.buffer, key=self.key)
        if self.cfg.checkpoint_replay:
            state["replay"] = self.replay.state_dict()
        if self.can_save_env:
            state.update(env_state=self.env_state, obs=self.obs)
        return state

    def _meta(self, stage: int) -> dict:
        return dict(stage=stage, actor_steps=self.actor_steps, learn_steps=self.learn_steps_done,
                    iteration_actor_steps=self.iteration_actor_steps,
                    queries=self.asked, labels=self.answered, autolabels=self.autolabels_added,
                    episode_sums=self.episode_sums.tolist(), rng=self.rng.bit_generator.state,
                    since=self.since.tolist(), wall_s=self.wall_before + time.perf_counter() - self.t_start,
                    **self.teacher.meta())

    def _save(self, stage: int):
        meta = self._meta(stage)
        self.ckpt.save(stage, self._saveable(), meta)
        # the trained models alone (small): for --frozen-reward, the diagnostics and demo recording
        self.models.save(stage, dict(agent=self.agent_state.params, rm=self.rm_state), meta)

    def _load_frozen(self):
        """The reward model of a finished run (Ibarz §3.2: "frozen reward models")."""
        src = Path(self.cfg.frozen_reward)
        try:
            other = read_run_config(src)
        except ValueError as e:
            raise ValueError(f"--frozen-reward: {e}") from None
        if not isinstance(other, IbarzConfig):
            raise ValueError(f"--frozen-reward {src} is not a run of Ibarz et al.'s protocol (--agent dqfd)")
        if other.env != self.cfg.env:
            raise ValueError(f"--frozen-reward {src} learned a reward for {other.env}, not {self.cfg.env}")
        if not other.learns_rewards:
            raise ValueError(f"--frozen-reward {src}: that run learned no reward model ({other.setup} setup"
                             + (", itself frozen" if other.frozen_reward else "") + ")")
        _, rm_state, meta = load_models(src, self.agent, self.rm, self.agent_state.params, self.rm_state)
        self.log(f"reward model frozen from {src} (stage {meta['stage']}, {meta['labels']} labels)")
        return rm_state

    # ------------------------------------------------------------------ the protocol
    def run(self) -> dict[str, Any]:
        """The protocol to the end (or on from a checkpoint), holding the run directory against every
        other process meanwhile (``runs.claimed``); returns the summary."""
        with claimed(self.cfg.out):
            return self._run()

    def _run(self) -> dict[str, Any]:
        cfg = self.cfg
        out = Path(cfg.out)
        from rlhp_jax.checkpoint import Checkpointer

        self.ckpt = Checkpointer(out / "checkpoints", keep=cfg.keep_checkpoints)
        self.models = Checkpointer(out / "models", keep=1)
        restoring = continues_from_checkpoint(self.ckpt, out, self.resume, self.log)
        if self.demos is not None:  # a resume reads the file config.json names: the run's own, or refused
            if why := demos_problem(out, cfg.demos):
                raise DemoError(f"{out}: {why}: a resume would mix two sets of demonstrations. Run it from where it "
                                "started, with the file it was made from, or start another run.")
            if not self.resume:
                record_demos(out, cfg.demos)
        if self.steps_note:
            self.log(self.steps_note)
        key = jax.random.PRNGKey(cfg.seed)
        key, k_agent, k_rm, k_env = split_keys(key, 4)
        self.agent_state = self.agent.init(k_agent)
        self.rm_state = program(self.rm.init, quick=True)(k_rm)
        self.env_state, self.obs = self.env.reset(k_env)
        self.key = key
        self.rng = np.random.default_rng(cfg.seed)
        capacity = max(1, (cfg.labels + self.autolabel_count) if cfg.learns_rewards else 1)
        self.buffer = self.rm.empty_buffer(capacity, cfg.segment_length)
        # a transition's first priority is its TD error under the networks of the moment it is added (A.3)
        self.replay = PrioritizedReplay(cfg.replay, self.spec.obs_shape, self.fmt.stack, self.fmt.obs_dtype,
                                        self.demos, lanes=self.env.num_envs,
                                        td_error=lambda b: self._td_error(self.agent_state, self.rm_state, b),
                                        td_batch=self.agent.config.batch_size, td_stack_last=False)
        self.actor_steps = self.learn_steps_done = self.asked = self.answered = self.autolabels_added = 0
        self.iteration_actor_steps = 0  # actor steps of the iterations (learning happens every 4 of them)
        self.episode_sums = np.zeros(self.env.num_envs)
        self.since = np.zeros(self.env.num_envs, np.int64)
        self.wall_before, self.t_start = 0.0, time.perf_counter()
        stage = 0
        if cfg.frozen_reward is not None:  # before anything is written: a bad --frozen-reward changes no file
            frozen = self._load_frozen()
        if restoring:
            state, meta = self.ckpt.restore(self._saveable())
            self.agent_state, self.rm_state, self.buffer, self.key = state["agent"], state["rm"], state["buffer"], \
                state["key"]
            if cfg.checkpoint_replay:
                self.replay.load_state_dict(state["replay"])
            if self.can_save_env:
                self.env_state, self.obs = state["env_state"], state["obs"]
            else:
                self.replay.mark_discontinuity()
            stage = int(meta["stage"])
            self.actor_steps, self.learn_steps_done = int(meta["actor_steps"]), int(meta["learn_steps"])
            self.iteration_actor_steps = int(meta["iteration_actor_steps"])
            self.asked, self.answered, self.autolabels_added = int(meta["queries"]), int(meta["labels"]), \
                int(meta["autolabels"])
            self.episode_sums = np.asarray(meta["episode_sums"])
            self.rng.bit_generator.state = meta["rng"]
            self.since = np.asarray(meta["since"], np.int64)
            self.wall_before = float(meta["wall_s"])
            if stage >= SECOND_PRETRAIN + self.num_iters:  # killed after its last checkpoint, or resumed again
                self.log(finished_line(out, f"stage {stage}: iteration {self.num_iters} of {self.num_iters}"))
            else:
                self.log(f"resuming {out} after stage {stage} ({self.answered} labels, {self.actor_steps} actor steps)")
        self.teacher = self._make_teacher(out)
        if restoring:
            self.teacher.restore(meta)
        # TensorBoard hides what a killed attempt logged after the checkpoint (from the start: everything)
        writer, tb = open_run(out, cfg, restoring=restoring, resume=self.resume, covered=("stage", stage),
                              purge_step=self.actor_steps + 1 if restoring else 0)
        if cfg.frozen_reward is not None:
            self.rm_state = frozen

        def record(stage_done: int, row: dict):
            row = dict(stage=stage_done, env_steps=self.actor_steps, labels=self.answered, queries=self.asked,
                       autolabels=self.autolabels_added, **row)
            row["wall_s"] = self.wall_before + time.perf_counter() - self.t_start
            writer.write(row)
            tb.scalars(self.actor_steps, row)
            self._save(stage_done)

        demos = self.demos is not None
        # 2: pretrain on the demonstrations (J_E and the Q loss with the untrained r̂)
        if stage < BC:
            m = {}
            if demos and cfg.bc_batches:
                self.log(f"pretraining on {self.demos.num_steps} demonstration steps ({cfg.bc_batches} batches)")
                m = self._learn_steps(cfg.bc_batches, demo_only=True, desc="pretraining on demos")
            record(BC, dict(phase="bc", **_prefixed(m)))
        # 3-6: initial trajectories, their labels, autolabels
        if stage < INITIAL:
            row = {}
            if cfg.learns_rewards:
                self.log(f"initial trajectories: {self.initial_steps} actor steps; {self.initial} labels")
                since = self.replay.steps.copy()
                scores = self._act(self.initial_steps, learn=False, history=[])
                self.key, k_l, k_auto = split_keys(self.key, 3)
                posed = self._outstanding(fold_in(k_l, 1))  # people: a killed attempt's pairs
                if posed:
                    self.log(f"reusing {self.teacher.responses} answers and {posed - self.teacher.responses} open "
                             f"pairs already in {out}")
                pairs = self._label_recent(since, self.initial, k_l, posed=posed)
                waited = self._await_answers("the initial trajectories", self.initial, fold_in(k_l, 2))
                self._publish(self.initial, "training")
                if self.autolabel_count and pairs is not None:
                    self._add_autolabels(pairs, k_auto)
                row = dict(initial_labels=self.answered, episode_return=float(np.mean(scores)) if scores else None,
                           **self._label_row(), **(dict(time_wait_s=waited) if self.teacher.asynchronous else {}))
            record(INITIAL, dict(phase="initial", **row))
        # 7: the reward model on the initial labels
        if stage < RM_PRETRAIN:
            self.key, k = split_keys(self.key, 2)
            if cfg.learns_rewards:
                self.log(f"training the reward model: {cfg.rm_pretrain_batches} batches on {self.answered} labels"
                         + (f" and {self.autolabels_added} autolabels" if self.autolabels_added else ""))
            record(RM_PRETRAIN, dict(phase="reward_model", **self._fit_rm(cfg.rm_pretrain_batches, k)))
        # 8: pretrain on the demonstrations again, now with r̂
        if stage < SECOND_PRETRAIN:
            m = {}
            if demos and cfg.second_pretrain_batches:
                m = self._learn_steps(cfg.second_pretrain_batches, demo_only=True, desc="pretraining with r̂")
            record(SECOND_PRETRAIN, dict(phase="second_pretraining", **_prefixed(m)))
        # 9-14: the iterations
        first_it = max(1, stage - SECOND_PRETRAIN + 1)
        bar = self._bar(self.total_steps, f"{self.spec.name} DQfD {cfg.setup}",
                        initial=(first_it - 1) * cfg.iteration_steps)
        for it in range(first_it, self.num_iters + 1):
            since = self.replay.steps.copy()
            self.since = since
            history: list = []
            t0 = time.perf_counter()
            scores = self._act(cfg.iteration_steps, learn=True, history=history,
                               on_step=(lambda k: bar.update(k)) if bar is not None else None)
            t1 = time.perf_counter()
            row = dict(phase="iteration", iteration=it, episodes=len(scores),
                       episode_return=float(np.mean(scores)) if scores else None,
                       epsilon=float(self._epsilon()), **_prefixed(_mean_metrics(history)))
            row.update(self._model_vs_true(since))
            self.key, k_l, k_fit = split_keys(self.key, 3)
            if cfg.learns_rewards:
                due = int(self.schedule.due(it * cfg.iteration_steps))
                self._label_recent(since, due - self._outstanding(fold_in(k_l, 1)), k_l)
                row["labels_due"] = due
                if self.wait_for_labels:
                    waited = self._await_answers(f"iteration {it}", due, fold_in(k_l, 2))
                    if self.teacher.asynchronous:
                        row["time_wait_s"] = waited
                self._publish(due, "training")
                row.update(self._label_row())
            t2 = time.perf_counter()
            row.update(self._fit_rm(cfg.rm_batches_per_iteration, k_fit))
            t3 = time.perf_counter()
            row.update(time_act_learn_s=t1 - t0, time_labels_s=t2 - t1, time_rm_s=t3 - t2,
                       steps_per_s=cfg.iteration_steps / max(t1 - t0, 1e-9))
            record(SECOND_PRETRAIN + it, row)
            if bar is not None and row.get("episode_return") is not None:
                bar.set_postfix(score=f"{row['episode_return']:.1f}", labels=self.answered)
        if bar is not None:
            bar.close()
        self.teacher.close()
        self._publish(cfg.labels, "finished")
        writer.close()
        tb.close()
        return self._summary(read_jsonl(out / "metrics.jsonl"))

    def _summary(self, rows: list[dict]) -> dict[str, Any]:
        cfg, out = self.cfg, Path(self.cfg.out)
        its = [r for r in rows if r.get("phase") == "iteration"]
        scores = [r["episode_return"] for r in its if r.get("episode_return") is not None]
        last = its[-1] if its else {}
        summary = dict(
            env=self.spec.name, agent="dqfd", setup=cfg.setup, seed=cfg.seed, frozen_reward=cfg.frozen_reward,
            demo_steps=None if self.demos is None else self.demos.num_steps, env_steps=self.actor_steps,
            requested_steps=cfg.total_steps,  # env_steps: the initial trajectories + whole iterations (steps_note)
            labels=self.answered, autolabels=self.autolabels_added, queries=self.asked,
            final_episode_return=scores[-1] if scores else None, best_episode_return=max(scores) if scores else None,
            final_reward_correlation=last.get("reward_correlation"), final_val_accuracy=last.get("val_accuracy"),
            final_rm_loss=last.get("rm_loss"), final_label_entropy_bound=last.get("label_entropy_bound"),
            wall_s=rows[-1]["wall_s"] if rows else None,
        )
        title = f"{self.spec.name} — DQfD, {cfg.setup}" + (f", {self.answered} labels" if cfg.learns_rewards else "") \
            + (", frozen reward model" if cfg.frozen_reward else "") + f", seed {cfg.seed}"
        plot_ibarz_run(rows, out / "learning_curve.png", title=title)
        write_summary(out, summary)  # last: its presence says everything else is there
        return summary


def load_models(run_dir: str | Path, agent: DQfD, rm: RewardEnsemble, agent_params_template, rm_template):
    """The newest Q-network parameters and reward model of a run: (params, rm_state, meta)."""
    from rlhp_jax.checkpoint import Checkpointer

    ck = Checkpointer(Path(run_dir) / "models", keep=None)
    if ck.latest_step() is None:
        raise ValueError(f"{run_dir}: no saved models (models/ is missing or empty): is it an Ibarz run directory?")
    state, meta = ck.restore(dict(agent=agent_params_template, rm=rm_template))
    return state["agent"], state["rm"], meta


def _prefixed(m: dict) -> dict:
    names = dict(loss="agent_loss", td_loss="td_loss", n_step_loss="n_step_loss", margin_loss="margin_loss",
                 q_mean="q_mean", demo_fraction="demo_fraction", demo_action_accuracy="demo_action_accuracy",
                 reward_mean="batch_reward_mean")
    return {names[k]: v for k, v in m.items() if k in names}


def _mean_metrics(history: list) -> dict:
    if not history:
        return {}
    stacked = jax.device_get(history)
    return {k: float(np.mean([h[k] for h in stacked])) for k in stacked[0]}



__all__ = ["IbarzRun", "load_models"]

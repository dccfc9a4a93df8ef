"""The whole preference-learning loop as one compiled function, for pure-JAX (gymnax) tasks.

    final, metrics = train(key, config)                    # one run, one XLA program
    run = CompiledRun(config)
    keys, hypers, lanes = run.lanes(seeds, labels=[100, 200])  # many seeds / settings at once
    finals, metrics = run.train_lanes(keys, hypers)

Acting, segment sampling, query selection, synthetic labeling, ensemble training and the agent
update all happen inside one ``jit``: no host round trip per iteration.  It is the algorithm of
the host driver (``rlhp_jax.driver.PreferenceRun``) step for step — the same pieces from
``rlhp_jax.loop.RunParts``, called with the same keys in the same order — so for the synthetic
oracle the two paths produce the same labels and (within float tolerance) the same reward model.

What the host driver decides on the host becomes data here:

* **Label counts.** The schedule's counts per iteration are computed on the host, exactly as the
  driver computes them, and travel in ``Hyper`` (``initial_queries``, ``new_queries``).  The
  queries are asked in the driver's chunks, at the config's two compiled sizes
  (``RunParts.initial_chunk``, ``online_chunk``), each chunk under a ``lax.cond`` on whether it
  holds a live query, so the random draws agree.  A lane whose budget is smaller than the
  config's asks in the config's chunk sizes: a host run of that budget alone compiles its own
  (smaller) sizes and draws other candidates.
* **Numeric settings** in ``Hyper`` (the label budget, the teacher's mistake rate, the error
  rate of the preference model, the two learning rates) are traced values, so ``jax.vmap``
  runs a grid of them at once; ``None`` keeps the config's value as a compile-time constant.
  Shapes come from the config: ``config.labels`` sets the label set's capacity and the largest
  query batch, so a swept budget must not exceed it.  The ensemble size changes shapes, so it
  is a separate program per value (``experiments.sweep --members 1 3``).

``train_lanes`` runs L lanes (seeds × settings) as a scan over iterations whose body is the
vmapped step.  With a ``progress`` function the scan runs in blocks of iterations, one compiled
program called from the host once per block (``PROGRESS_UPDATES`` blocks at most), and the host
hands each iteration's metrics to ``progress`` between blocks (and, given a checkpoint, saves the
lanes there, so that a killed sweep continues: ``_Blocks``): a host callback inside the program
would keep JAX from storing it in the persistent compilation cache, so a sweep with a bar would
compile afresh every time.  On one device the programs are ``compile_cache.jit``'s, kept in the
cache as executables (a warm start traces them, and loads them without lowering).  With a ``mesh``, the
lanes are sharded over its devices (``NamedSharding``; one device or many, one host or many —
see ``rlhp_jax.distributed``), and JAX's own persistent cache keeps the programs.

Limits: the synthetic oracle only (people answer on their own time); pure-JAX environments only
(envpool steps C++ emulators the program cannot carry); no checkpoints inside the program —
a compiled run is minutes, and ``experiments.sweep`` saves every finished run.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from rlhp_jax.agents.common import evaluate
from rlhp_jax.compile_cache import jit as program
from rlhp_jax.core import missing_like
from rlhp_jax.loop import RunParts, TrainState, step_keys

# Hyper field -> where it lives in the run config (agent lr: per agent).
SWEEPABLE = ("labels", "mistake_rate", "error_rate", "rm_learning_rate", "agent_learning_rate")
AGENT_LR_FIELD = {"ppo": "lr", "a2c": "lr", "trpo": "vf_lr"}
# a sweep in blocks saves its lanes after a block when this long has passed since it started or last saved:
# a kill loses at most about this much, and a big, fast sweep (1,024 lanes on a GPU, ~20 s) is not slowed
# by a save per block
SAVE_EVERY_S = 60.0
# with a progress function, the iterations run in at most this many blocks (host calls): the bar
# moves often enough, and a block's host round trip (~1 ms) stays far below its iterations' time
PROGRESS_UPDATES = 100


class Hyper(struct.PyTreeNode):
    """One lane's numeric settings (or, with a leading axis, many lanes').  ``None`` = the config's."""

    labels: jax.Array  # int32 label budget
    initial_queries: jax.Array  # int32 labels asked about the untrained policy's clips
    new_queries: jax.Array  # int32 [iterations] labels asked after each iteration
    mistake_rate: Any = None  # synthetic teacher: probability a strict label is flipped
    error_rate: Any = None  # preference model: ε of the random-response error model
    rm_learning_rate: Any = None  # reward-model Adam learning rate
    agent_learning_rate: Any = None  # the agent's learning rate (PPO/A2C lr; TRPO's value-function lr)
    # The fields that carry a leading lane axis (``CompiledRun.lanes``); the others are shared by
    # every lane, so that, e.g., one label schedule is not vmapped into a select over every lane's.
    lane_fields: tuple = struct.field(pytree_node=False, default=())

    def lane_axes(self) -> "Hyper":
        """``vmap`` in_axes for these settings: 0 for the per-lane fields, None for shared ones."""
        fields = [f.name for f in dataclasses.fields(self) if f.name != "lane_fields"]
        return self.replace(**{f: (0 if f in self.lane_fields else None)
                               for f in fields if getattr(self, f) is not None})

    def lane(self, i: int) -> "Hyper":
        """Lane ``i``'s own settings (no lane axis)."""
        return self.replace(lane_fields=(), **{f: getattr(self, f)[i] for f in self.lane_fields})


def _room(max_n: int, size: int) -> int:
    """The most queries ``RunParts.ask_oracle`` compiled for ``max_n`` in chunks of ``size`` can take at once."""
    return math.ceil(max_n / size) * size if max_n > 0 else 0


def _configured(config, hyper: Hyper):
    """``config`` with the lane's traced settings in place of the compile-time ones."""
    changes: dict[str, Any] = {}
    ens, teacher = config.ensemble, config.teacher
    if hyper.error_rate is not None or hyper.rm_learning_rate is not None:
        ens = dataclasses.replace(ens, **{k: v for k, v in (("error_rate", hyper.error_rate),
                                                             ("learning_rate", hyper.rm_learning_rate)) if v is not None})
        changes["ensemble"] = ens
    if hyper.mistake_rate is not None:
        changes["teacher"] = dataclasses.replace(teacher, mistake_rate=hyper.mistake_rate)
    if hyper.agent_learning_rate is not None:
        from rlhp_jax import agents as agents_lib

        agent_cfg = config.agent_config or agents_lib.default_config(config.agent, config.env)
        changes["agent_config"] = dataclasses.replace(agent_cfg, **{AGENT_LR_FIELD[config.agent]:
                                                                     hyper.agent_learning_rate})
    return dataclasses.replace(config, **changes) if changes else config


class CompiledRun:
    """A ``config.RunConfig`` compiled end to end.  Build once; call ``train`` / ``train_lanes``.

    ``progress(iteration, metrics)`` — if given — is called on the host once per iteration with
    that iteration's metrics (arrays with a leading lane axis), between blocks of iterations
    (``compile_lanes``); the pure functions (``train_one``, ``lanes_fn``) never call it.
    """

    def __init__(self, config, progress: Callable[[int, dict], None] | None = None):
        if config.label_source != "synthetic":
            raise ValueError("The compiled loop labels with the synthetic oracle only; people answer through the "
                             "host driver (python -m experiments.classic --teacher human).")
        from rlhp_jax import tasks

        if config.env not in tasks.names("gymnax"):
            raise ValueError(f"The compiled loop needs a pure-JAX environment ({', '.join(tasks.names('gymnax'))}); "
                             f"{config.env!r} is not one (Atari and MuJoCo step in envpool, outside the program: "
                             "use python -m experiments.atari / experiments.mujoco for them).")
        self.config = config
        self.parts = RunParts(config)  # the shapes; traced settings rebuild the parts inside the program
        self.num_iters = self.parts.num_iters
        self.steps_per_iter = self.parts.steps_per_iter
        initial, new = self.parts.query_counts()
        self.max_initial = int(initial)
        self.max_new = int(new.max()) if new.size else 0
        self.progress = progress

    # ------------------------------------------------------------------ settings
    def hyper(self, labels: int | None = None, **values) -> Hyper:
        """One lane's settings; unnamed ones stay the config's compile-time values."""
        unknown = set(values) - set(SWEEPABLE)
        if unknown:
            raise ValueError(f"Cannot sweep {', '.join(sorted(unknown))}; sweepable settings: {', '.join(SWEEPABLE)}.")
        cfg = self.config
        budget = cfg.labels if labels is None else int(labels)
        if not 1 <= budget <= cfg.labels:
            raise ValueError(f"A label budget of {budget} does not fit this program: budgets must be between 1 and "
                             f"the config's labels ({cfg.labels}), which sets the label set's size. Compile with the "
                             "largest budget of the sweep.")
        if budget != cfg.labels and cfg.pretrain_epochs is not None:
            raise ValueError("pretrain_epochs ties the pretraining length to the budget; sweep labels with "
                             "pretrain_steps instead.")
        initial, new = RunParts(dataclasses.replace(cfg, labels=budget)).query_counts()
        parts = self.parts
        if initial > _room(self.max_initial, parts.initial_chunk) or \
                (new.size and new.max() > _room(self.max_new, parts.online_chunk)):
            raise ValueError(f"A budget of {budget} asks more queries at once than this program's largest batch "
                             f"(compile with labels={budget}).")
        if "agent_learning_rate" in values and cfg.agent not in AGENT_LR_FIELD:
            raise ValueError(f"agent {cfg.agent} has no learning rate to sweep")
        f32 = {k: jnp.asarray(v, jnp.float32) for k, v in values.items() if k != "labels"}
        return Hyper(labels=jnp.asarray(budget, jnp.int32), initial_queries=jnp.asarray(initial, jnp.int32),
                     new_queries=jnp.asarray(new, jnp.int32), **f32)

    def lanes(self, seeds, **grid) -> tuple[jax.Array, Hyper, list[dict]]:
        """Every combination of ``seeds`` × the value lists in ``grid`` (e.g. ``labels=[50, 100]``):
        returns (keys [L, 2], stacked Hyper [L], one dict per lane naming its seed and settings)."""
        names = list(grid)
        rows = [dict(seed=int(s)) for s in seeds]
        for name in names:
            rows = [dict(r, **{name: v}) for v in grid[name] for r in rows]
        hypers = [self.hyper(**{k: v for k, v in r.items() if k != "seed"}) for r in rows]
        schedule = ("labels", "initial_queries", "new_queries")
        varies = {f for f in names if f != "labels"} | (set(schedule) if "labels" in names else set())
        merged = {}
        for f in (f.name for f in dataclasses.fields(Hyper) if f.name != "lane_fields"):
            values = [getattr(h, f) for h in hypers]
            if values[0] is not None:
                merged[f] = jnp.stack(values) if f in varies else values[0]
        keys = jnp.stack([jax.random.PRNGKey(r["seed"]) for r in rows])
        return keys, Hyper(lane_fields=tuple(sorted(varies)), **merged), rows

    # ------------------------------------------------------------------ one lane, pure
    def _parts(self, hyper: Hyper) -> RunParts:
        cfg = _configured(self.config, hyper)
        return self.parts if cfg is self.config else RunParts(cfg)

    def init(self, key, hyper: Hyper) -> TrainState:
        """The driver's start: agent, ensemble, environments, an empty label set (``fresh``); then the
        initial labels on the untrained policy's clips and the reward model's pretraining (``initial``)."""
        return self.initial(self.fresh(key, hyper), hyper)

    def fresh(self, key, hyper: Hyper) -> TrainState:
        """New agent, ensemble and environments and an empty label set."""
        return self._parts(hyper).fresh(key)

    def initial(self, state: TrainState, hyper: Hyper) -> TrainState:
        """Labels on the untrained policy's clips, then the reward model's pretraining."""
        parts = self._parts(hyper)
        if not parts.learn or self.max_initial == 0:
            return state

        def initial(state: TrainState) -> TrainState:
            state, rollout, member_r, (k_q, k_fit) = parts.initial_rollout(state)
            buffer, got = parts.ask_oracle(state.buffer, member_r, rollout, k_q, hyper.initial_queries,
                                           self.max_initial, parts.initial_chunk)
            ens_state, _ = parts.ensemble.fit(state.ensemble, buffer, k_fit, parts.pretrain_steps)  # 0: normalization
            return state.replace(buffer=buffer, ensemble=ens_state, queries=hyper.initial_queries, labels=got)

        return jax.lax.cond(hyper.initial_queries > 0, initial, lambda s: s, state)

    def step(self, state: TrainState, hyper: Hyper, it) -> tuple[TrainState, dict]:
        """Iteration ``it`` (1-based) of the driver's loop: act and update, ask the labels due, fit."""
        parts, cfg = self._parts(hyper), self.config
        nan = jnp.asarray(jnp.nan, jnp.float32)
        key, keys = step_keys(state.key)
        state, rollout, rewards, member_r, agent_m = parts.act(state.replace(key=key), keys.iteration)
        buffer, ens_state = state.buffer, state.ensemble
        m = dict(rm_train_loss=nan, rm_l2=nan, reward_correlation=nan, val_accuracy=nan)
        evaluate_now = (it % cfg.eval_every == 0) | (it == self.num_iters)
        if parts.learn:
            n = hyper.new_queries[it - 1]
            buffer, got = parts.ask_oracle(buffer, member_r, rollout, keys.queries, n, self.max_new,
                                           parts.online_chunk)
            state = state.replace(buffer=buffer, queries=state.queries + n, labels=state.labels + got)
            validate = lambda e: jnp.nanmean(parts.ensemble.evaluate(e, buffer)["val_accuracy"])
            if parts.fit_steps > 0:  # a fit validates from its own scoring of the labels (``RewardEnsemble.fit``)
                def fit(ens_state):
                    ens_state, fit_m = parts.ensemble.fit(ens_state, buffer, keys.fit, parts.fit_steps)
                    return (ens_state, jnp.nanmean(fit_m["train_loss"]), jnp.mean(ens_state.l2),
                            jnp.nanmean(fit_m["evaluation"]["val_accuracy"]))

                ens_state, m["rm_train_loss"], m["rm_l2"], fitted_accuracy = jax.lax.cond(
                    state.labels > 0, fit, lambda e: (e, nan, nan, validate(e)), ens_state)
                m["val_accuracy"] = jnp.where(evaluate_now, fitted_accuracy, nan)
            else:
                m["val_accuracy"] = jax.lax.cond(evaluate_now, lambda: validate(ens_state), lambda: nan)
            m["reward_correlation"] = parts.correlation(rollout, rewards, keys.correlation)
        sums, episodes, total = parts.score_episodes(state.episode_sums, rollout)
        state = state.replace(ensemble=ens_state, episode_sums=sums)
        m.update(parts.progress_metrics(it, state, rollout, rewards, agent_m, episodes, total))
        m["eval_return"] = jax.lax.cond(
            evaluate_now, lambda: evaluate(parts.env, parts.agent, state.agent.params, keys.evaluation,
                                           cfg.eval_episodes, parts.spec.horizon).astype(jnp.float32), lambda: nan)
        return state, m

    # ------------------------------------------------------------------ whole runs
    def train_one(self, key, hyper: Hyper | None = None):
        """One lane, pure and unjitted (``jax.vmap``-able over ``key`` and ``hyper``):
        returns (final TrainState, metrics dict of [iterations] arrays)."""
        hyper = self.hyper() if hyper is None else hyper
        state = self.init(key, hyper)
        return jax.lax.scan(lambda state, it: self.step(state, hyper, it), state,
                            jnp.arange(1, self.num_iters + 1, dtype=jnp.int32))

    def train(self, key, hyper: Hyper | None = None):
        """``train_one`` compiled."""
        return jax.jit(self.train_one)(key, self.hyper() if hyper is None else hyper)

    def state_specs(self, mesh: Mesh) -> TrainState:
        """How the many-lane ``TrainState`` lies on ``mesh``: every array split over ``"lanes"``
        (its leading axis); the environments' arrays (env state, observations, episode sums) also
        over ``"envs"``, and the ensemble's per-member arrays (parameters, optimizer state, L2,
        loss averages, normalization, each member's bootstrap counts and held-out flags) also
        over ``"members"`` — where the mesh has those axes with more than one device."""
        def axis(name):
            return name if name in mesh.axis_names and mesh.shape[name] > 1 else None

        envs, members = axis("envs"), axis("members")
        shapes = jax.eval_shape(self.fresh, jax.random.PRNGKey(0), self.hyper())
        lanes = lambda tree: jax.tree.map(lambda _: P("lanes"), tree)
        n_envs, n_members = self.parts.env.num_envs, self.parts.ensemble.config.num_members

        def inner(tree, name, size):  # arrays whose first per-lane axis is the environments / members
            return jax.tree.map(lambda x: P("lanes", name) if x.ndim >= 1 and x.shape[0] == size else P("lanes"), tree)

        return shapes.replace(
            **{f: lanes(getattr(shapes, f)) for f in ("agent", "key", "reward_scale", "queries", "labels")},
            env_state=inner(shapes.env_state, envs, n_envs), obs=inner(shapes.obs, envs, n_envs),
            episode_sums=inner(shapes.episode_sums, envs, n_envs),
            ensemble=inner(shapes.ensemble, members, n_members),
            buffer=lanes(shapes.buffer).replace(heldout=P("lanes", members), boot=P("lanes", members)))

    def _shard(self, mesh: Mesh | None):
        """States kept split over ``mesh`` as ``state_specs`` says (no mesh: as they are)."""
        if mesh is None:
            return lambda states: states
        shardings = jax.tree.map(lambda spec: NamedSharding(mesh, spec), self.state_specs(mesh),
                                 is_leaf=lambda x: isinstance(x, P))
        return lambda states: jax.lax.with_sharding_constraint(states, shardings)

    def start_lanes(self, keys, hypers: Hyper, mesh: Mesh | None = None) -> TrainState:
        """Every lane's start (``init``): states with a leading lane axis."""
        # Fresh parameters lane after lane: the orthogonal initializer's QR, batched by vmap, can
        # deadlock jaxlib's CPU LAPACK thread pool (BUILD_NOTES); one lane at a time it cannot.
        states = jax.lax.map(lambda i: self.fresh(keys[i], hypers.lane(i)), jnp.arange(keys.shape[0]))
        return self._shard(mesh)(jax.vmap(self.initial, in_axes=(0, hypers.lane_axes()))(states, hypers))

    def iterate_lanes(self, states: TrainState, hypers: Hyper, its, mesh: Mesh | None = None,
                      pad: bool = False):
        """Iterations ``its`` [n] (1-based) of every lane: (states, metrics [n, L]).  ``pad``: an
        iteration past ``num_iters`` leaves the states as they are and reports NaN (the last of
        equal blocks)."""
        axes, shard = hypers.lane_axes(), self._shard(mesh)

        def body(states, it):
            step = lambda s: jax.vmap(self.step, in_axes=(0, axes, None))(s, hypers, it)
            if pad:
                missing = missing_like(jax.eval_shape(step, states)[1])
                states, m = jax.lax.cond(it <= self.num_iters, step, lambda s: (s, missing), states)
            else:
                states, m = step(states)
            return shard(states), m

        return jax.lax.scan(body, states, its)

    def lanes_fn(self, mesh: Mesh | None = None):
        """The pure many-lane program ``(keys [L], hypers [L]) -> (final states, metrics [L, iterations])``;
        with ``mesh``, the state is kept split over it as ``state_specs`` says."""
        def run(keys, hypers):
            states = self.start_lanes(keys, hypers, mesh)
            its = jnp.arange(1, self.num_iters + 1, dtype=jnp.int32)
            states, metrics = self.iterate_lanes(states, hypers, its, mesh)
            return states, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), metrics)

        return run

    def check_mesh(self, mesh: Mesh, lanes: int) -> None:
        """Refuse a mesh the lanes, environments or ensemble members do not split over evenly."""
        shape = dict(mesh.shape)
        groups, envs, members = shape.get("lanes", 1), shape.get("envs", 1), shape.get("members", 1)
        if lanes % groups:
            raise ValueError(f"{lanes} lanes (seeds × settings) do not split evenly over {groups} device groups; "
                             f"use a multiple of {groups} lanes, or fewer devices.")
        num_envs = self.parts.env.num_envs
        if num_envs % envs:
            raise ValueError(f"{num_envs} environments per lane do not split evenly over {envs} devices.")
        ens = self.parts.ensemble
        if ens.config.num_members % members:
            raise ValueError(f"{ens.config.num_members} ensemble members do not split evenly over {members} devices.")
        if members > 1 and ens.mode != "vmap":
            raise ValueError(f"Splitting ensemble members over devices needs them vmapped; this ensemble walks them "
                             f"with member_axis={ens.mode!r}: set EnsembleConfig(member_axis='vmap').")

    def compile_lanes(self, keys, hypers: Hyper, mesh: Mesh | None = None, block: int | None = None):
        """Place the lanes (split over ``mesh``'s devices when given — one host or several) and
        compile the many-lane program for them: returns (compiled program, keys, hypers) ready
        to call, so callers can time compiling apart from running.  With ``progress`` set, the
        program runs in blocks of ``block`` iterations (default: ``PROGRESS_UPDATES`` blocks at most;
        the last block's iterations past the run's end are skipped)."""
        if mesh is not None:
            from rlhp_jax.distributed import global_lanes

            self.check_mesh(mesh, keys.shape[0])
            keys = global_lanes(keys, mesh)
            hypers = global_lanes(hypers, mesh, hypers.lane_axes())
        if mesh is None:  # one device: the executables are kept in the cache (compile_cache.jit)
            build = lambda fn, *args: program(fn).ahead_of_time(*args)
        else:  # split over devices: JAX's persistent cache keeps them
            build = lambda fn, *args: jax.jit(fn).lower(*args).compile()
        if self.progress is None:
            return build(self.lanes_fn(mesh), keys, hypers), keys, hypers
        block = -(-self.num_iters // PROGRESS_UPDATES) if block is None else int(block)
        if block < 1:
            raise ValueError(f"a block holds at least one iteration, got {block}")
        if jax.process_count() > 1:  # each process would read metrics it does not hold
            raise ValueError("a progress function needs one process; over several, run without one")
        start_lanes = lambda k, h: self.start_lanes(k, h, mesh)
        start = build(start_lanes, keys, hypers)
        # the states' shapes: the start's results (traced once more over a mesh, for their shardings)
        states = start.out_info if mesh is None else jax.eval_shape(start_lanes, keys, hypers)
        its = jax.ShapeDtypeStruct((block,), jnp.int32)
        iterate = lambda s, h, i: self.iterate_lanes(s, h, i, mesh, pad=self.num_iters % block != 0)
        return _Blocks(start, build(iterate, states, hypers, its), block, self.num_iters, self.progress), keys, hypers

    def train_lanes(self, keys, hypers: Hyper, mesh: Mesh | None = None, block: int | None = None):
        """Run every lane at once (compiled): returns (final states [L], metrics [L, iterations]);
        read sharded results with ``distributed.gather``.  ``block``: see ``compile_lanes``."""
        run, keys, hypers = self.compile_lanes(keys, hypers, mesh, block)
        return run(keys, hypers)


class _Blocks:
    """The many-lane program in blocks, called like the one-program form: ``(keys, hypers) ->
    (final states, metrics [L, iterations])``; ``progress(it, metrics [L])`` between blocks.  Given a
    ``checkpoint`` (a :class:`~rlhp_jax.checkpoint.Checkpointer`; one device only), the lanes' states
    and the metrics so far are saved after a block once :data:`SAVE_EVERY_S` have passed, and a call
    that finds a checkpoint there continues from it: a sweep killed at any moment loses about that
    much, and ends as the uninterrupted sweep does (the same states, the same programs)."""

    def __init__(self, start, iterate, block: int, num_iters: int, progress):
        self.start, self.iterate, self.block, self.num_iters, self.progress = start, iterate, block, num_iters, progress

    def _template(self):
        """The shapes of what a checkpoint holds: the lanes' states, every iteration's metrics."""
        states, m = self.iterate.out_info
        return dict(states=states, metrics=jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((self.slots, *x.shape[1:]), x.dtype), m))

    @property
    def slots(self) -> int:
        """Iterations the blocks hold, the last block's padding past the run's end included."""
        return -(-self.num_iters // self.block) * self.block

    def __call__(self, keys, hypers, checkpoint=None, log: Callable[[str], None] = print):
        done, saved, saved_at, blocks = 0, None, time.monotonic(), []
        if checkpoint is not None and checkpoint.latest_step() is not None:
            restored, meta = checkpoint.restore(self._template())
            states, done = restored["states"], int(meta["iterations"])
            saved = {k: np.array(v) for k, v in jax.device_get(restored["metrics"]).items()}  # (writable copies)
            log(f"continuing from the checkpoint after iteration {done} of {self.num_iters} in {checkpoint.directory}")
            for it in range(1, done + 1):
                self.progress(it, {k: v[it - 1] for k, v in saved.items()})
        else:
            states = self.start(keys, hypers)
        continued = done > 0
        for first in range(done + 1, self.num_iters + 1, self.block):
            states, m = self.iterate(states, hypers, jnp.arange(first, first + self.block, dtype=jnp.int32))
            blocks.append(m)  # (on the devices, sharded as the lanes are)
            m = jax.device_get(m)
            done = min(first + self.block - 1, self.num_iters)
            for j in range(done - first + 1):
                self.progress(first + j, {k: v[j] for k, v in m.items()})
            if checkpoint is None:
                continue
            if saved is None:
                saved = {k: np.zeros((self.slots, *v.shape[1:]), v.dtype) for k, v in m.items()}
            for k, v in m.items():
                saved[k][first - 1:first - 1 + self.block] = v
            if done < self.num_iters and time.monotonic() - saved_at >= SAVE_EVERY_S:
                checkpoint.save(done, dict(states=states, metrics=saved), meta=dict(iterations=done))
                saved_at = time.monotonic()
        if continued:  # the iterations before it come from the checkpoint (one device)
            metrics = {k: jnp.asarray(v[:self.num_iters]) for k, v in saved.items()}
        else:
            metrics = jax.tree.map(lambda *xs: jnp.concatenate(xs)[:self.num_iters], *blocks)
        return states, jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), metrics)


def train(key, config, hyper: Hyper | None = None):
    """Run ``config`` (a ``config.RunConfig`` on a gymnax task) as one compiled program.

    Returns (final ``TrainState``, metrics: dict of [iterations] arrays — env_steps, labels,
    true_return, eval_return, reward_correlation, …)."""
    return CompiledRun(config).train(key, hyper)

"""Ensemble of reward predictors trained on preferences (layer 2: learner).

Christiano et al. 2017, §2.2.3, with the options of Ibarz et al. 2018, A.3:

* K members (3 by default), one parameter pytree with a leading member axis; each member is
  trained on its own bootstrap resample of the label set (see ``labels.py``) with a fraction
  1/e of the labels held out as its validation set.
* Adaptive L2 on the weights (``adaptive_l2``): the coefficient grows by ``l2_rate`` per step
  while the (running-average) validation loss exceeds ``l2_high`` × the training loss, shrinks
  while it is below ``l2_low`` ×, and stays put in between (1.1–1.5, Ibarz: initial 1e-4,
  rate 0.001 per learning step).
* Optional Gaussian input noise and an L2 penalty on the predicted rewards (Ibarz A.3).
* Vector observations are standardized per feature (mean and std over the labeled clips,
  refreshed before each fit) before they reach the MLP — not in A.1, which feeds raw features;
  without it a feature on a 10-50x smaller scale than its neighbours (CartPole's pole angle, a
  walker's torso height) is nearly ignored under the shared L2 penalty (``BUILD_NOTES.md``).
* r̂ = mean over members of each member's reward normalized to zero mean and unit std (over the
  label buffer's clips), scaled to ``reward_std`` (1 on MuJoCo-like tasks, 0.05 on Atari).  The
  normalization is for the agent only: a member's own prediction P[σ¹ ≻ σ²] — what query
  selection measures the members' disagreement on (§2.2.4) — is Bradley-Terry on its raw
  outputs, the scale it was trained at (``loop.RunParts`` computes it from ``member_rewards``).

One jitted step trains the whole ensemble.  The member axis is ``vmap``ped, walked with
``lax.map`` (one member after another inside the same compiled step) or unrolled; which is
fastest depends on model and backend (see ``BUILD_NOTES.md``) and ``member_axis="auto"`` picks
per backend and model.  ``fitter()`` runs many steps either as one compiled scan or as a host
loop over the compiled step (``fit_loop``), again chosen per backend and model.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
import numpy as np
from flax import struct

from rlhp_jax import labels as labels_lib
from rlhp_jax.compile_cache import jit as program
from rlhp_jax.preferences import (bradley_terry_loss, is_concrete, preference_accuracy,
                                  segment_returns, target_return_loss)
from rlhp_jax.core import loop_body_is_slow, missing_like, sample_indices, weight_l2
from rlhp_jax.reward_models import RewardModelSpec


@dataclasses.dataclass(frozen=True)
class EnsembleConfig:
    num_members: int = 3  # Christiano A: "an ensemble of 3 predictors"
    batch_size: int = 16  # clip pairs per member per step (Ibarz A.3: batches of 16 pairs)
    learning_rate: float = 3e-4  # Ibarz A.3: Adam 3e-4, betas (0.9, 0.999), eps 1e-8
    error_rate: float = 0.1  # §2.2.3: 10 % chance the person answers at random
    adaptive_l2: bool = True  # §2.2.3; False = the "no regularization" ablation keeps l2 at 0
    l2_init: float = 1e-4  # Ibarz A.3: initial weight
    l2_rate: float = 0.001  # Ibarz A.3: multiplicative rate of change per learning step
    l2_low: float = 1.1  # §2.2.3: keep val loss between 1.1x ...
    l2_high: float = 1.5  # ... and 1.5x the training loss
    loss_average: float = 0.99  # decay of the running averages of the two losses
    input_noise: float = 0.0  # Ibarz A.3: Gaussian noise of amplitude 0.1 on [0, 1] frames
    reward_l2: float = 0.0  # Ibarz A.3: loss ∝ squared predicted reward (zero-mean prior)
    reward_std: float | None = None  # A.1: 1 (MuJoCo); A.2: 0.05 (Atari); None: the task's (driver), else 1
    member_axis: str = "auto"  # "vmap", "map" (sequential loop), "unroll" or "auto" (per backend/model)
    fit_loop: str = "auto"  # steps of fit(): "scan" (one program), "host" (Python loop) or "auto"
    chunk_size: int = 4096  # rows per forward pass when scoring the whole label buffer
    loss: str = "preferences"  # Bradley-Terry on labels; "target": squared error to the true clip returns (§3.3 ablation)
    bootstrap: bool = True  # each member on its own bootstrap resample; False: uniform over its training labels (Ibarz A.4)
    standardize_inputs: bool = True  # vector observations: each feature to zero mean, unit std over the labeled clips
    # ours: r̂ invariant to the task's reflection (tasks.Mirror), the mean of the MLP on a step and its mirror
    # image; the inputs standardized over the labeled clips and their mirror images (BUILD_NOTES, the README's
    # CartPole job)
    mirror: bool = False
    # ours: r̂ of the transition, r̂(o_t, a_t, o_t+1): the MLP sees each step's observation and the next
    # (``rollout.transition_obs``; the clips store both); MuJoCo's locomotion reward is the velocity over the
    # step (BUILD_NOTES, "Swimmer's step reward is a function of the transition")
    next_obs: bool = False
    # A.1's MLP reads the action beside the observation; False: r̂ of the observation alone (Ibarz A.3's
    # choice for its CNN; BUILD_NOTES, Swimmer)
    use_action: bool = True

    def __post_init__(self):
        if self.num_members < 1:
            raise ValueError(f"num_members must be >= 1, got {self.num_members}")
        if self.member_axis not in ("auto", "vmap", "map", "unroll"):
            raise ValueError(f"member_axis must be 'auto', 'vmap', 'map' or 'unroll', got {self.member_axis!r}")
        if self.fit_loop not in ("auto", "scan", "host"):
            raise ValueError(f"fit_loop must be 'auto', 'scan' or 'host', got {self.fit_loop!r}")
        if self.loss not in ("preferences", "target"):
            raise ValueError(f"loss must be 'preferences' or 'target', got {self.loss!r}")
        if is_concrete(self.error_rate) and not 0.0 <= self.error_rate < 1.0:
            raise ValueError(f"error_rate must be in [0, 1), got {self.error_rate}")


class EnsembleState(struct.PyTreeNode):
    params: Any  # [M, ...]
    batch_stats: Any  # [M, ...] ({} for models without batch norm)
    opt_state: Any  # [M, ...]
    l2: jax.Array  # [M] current L2 coefficient per member
    train_loss_avg: jax.Array  # [M] running average of the training BT loss
    val_loss_avg: jax.Array  # [M] running average of the validation BT loss
    norm_mean: jax.Array  # [M] per-member normalization
    norm_std: jax.Array  # [M]
    input_mean: jax.Array  # [*obs_shape] per-feature mean of the labeled clips' observations (() when off)
    input_std: jax.Array  # [*obs_shape] per-feature std, floored (() when off)
    steps: jax.Array  # int32 training steps taken


def adaptive_l2(l2, train_loss, val_loss, rate=0.001, low=1.1, high=1.5):
    """One step of the adaptive L2 rule (Christiano §2.2.3, Ibarz A.3).

    Multiplies the coefficient by (1 + rate) when val_loss > high·train_loss, divides by it when
    val_loss < low·train_loss, and leaves it unchanged in between.  Elementwise.
    """
    up = val_loss > high * train_loss
    down = val_loss < low * train_loss
    factor = jnp.where(up, 1.0 + rate, jnp.where(down, 1.0 / (1.0 + rate), 1.0))
    return l2 * factor


def resolve_member_axis(mode: str, backend: str | None = None, model_kind: str = "mlp") -> str:
    """'auto' -> the fastest measured layout (BUILD_NOTES "ensemble step", "The benchmark suite on
    a GPU"): ``unroll`` for the CNN everywhere (vmapped members become grouped convolutions: 9x
    one member's time for 3 members on XLA:CPU, 80x on an H200; and on CPU the CNN must not sit in
    ``lax.map``, ``core.loop_body_is_slow``); for the MLP ``map`` on CPU and ``vmap`` on
    accelerators (3 members in 1.3x one member's time on an H200)."""
    if mode != "auto":
        return mode
    if model_kind == "cnn":
        return "unroll"
    return "map" if (backend or jax.default_backend()) == "cpu" else "vmap"


def over_members(fn, mode: str):
    """Apply ``fn`` to every member (leading axis of every argument) inside one program:
    ``vmap`` (batched), ``map`` (a sequential ``lax.map`` loop) or ``unroll`` (one copy of the
    member's computation per member, no loop)."""
    if mode == "vmap":
        return jax.vmap(fn)
    if mode == "map":
        return lambda *args: jax.lax.map(lambda a: fn(*a), args)
    if mode == "unroll":
        def unrolled(*args):
            m = jax.tree.leaves(args)[0].shape[0]
            outs = [fn(*jax.tree.map(lambda a: a[i], args)) for i in range(m)]
            return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
        return unrolled
    raise ValueError(f"unknown member axis mode {mode!r}")


INPUT_STD_FLOOR = 1e-2  # a feature (nearly) constant over the labeled clips is not blown up
INPUT_CLIP = 10.0  # standardized features are clipped to ±10 (states far from any labeled clip)


def standardize(obs, mean, std):
    """Observations [N, *obs_shape] with each feature centred and scaled by the labeled clips'
    statistics, clipped to ±``INPUT_CLIP``; unchanged when standardization is off (``mean.ndim == 0``)."""
    if mean.ndim == 0:
        return obs
    return jnp.clip((obs.astype(jnp.float32) - mean) / std, -INPUT_CLIP, INPUT_CLIP)


def _filled_moments(x, filled, axes):
    """Mean and variance of ``x`` over ``axes``, counting only the clips of filled label slots
    (``filled`` broadcast against ``x``); (0, 0) when nothing is filled."""
    w = jnp.broadcast_to(filled, x.shape).astype(jnp.float32)
    total = jnp.maximum(jnp.sum(w, axis=axes, keepdims=True), 1.0)
    mean = jnp.sum(w * x, axis=axes, keepdims=True) / total
    var = jnp.sum(w * jnp.square(x - mean), axis=axes, keepdims=True) / total
    return jnp.squeeze(mean, axes), jnp.squeeze(var, axes)


def _to_unit_range(obs):
    return obs.astype(jnp.float32) / 255.0 if jnp.issubdtype(obs.dtype, jnp.integer) else obs


NOISE_LEVELS = 2 ** 16  # gaussian_noise: quantiles of N(0, 1) it draws from


@functools.cache
def _normal_quantiles() -> np.ndarray:
    """Φ⁻¹((k + ½) / 2¹⁶) for k = 0 … 2¹⁶ − 1, computed once in double precision."""
    inv_cdf = statistics.NormalDist().inv_cdf
    return np.array([inv_cdf((k + 0.5) / NOISE_LEVELS) for k in range(NOISE_LEVELS)], np.float32)


def gaussian_noise(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    """Standard normal noise of ``shape``, drawn at a quarter of ``jax.random.normal``'s cost on a CPU.

    Ibarz A.3's input noise covers every pixel of every frame of a batch (16 pairs × 2 × 25
    frames × 84·84·4 = 22.6M values per member per step).  ``jax.random.normal`` spends one
    32-bit threefry word per value and an ``erf_inv`` on each; inside the CNN's training step on
    2 CPU cores that took 1.4 s, more than the rest of the step.  Here each 32-bit word of
    ``jax.random.bits`` gives two 16-bit indices into a table of the normal's 2¹⁶ quantiles
    Φ⁻¹((k + ½) / 2¹⁶): a normal quantized to 65,536 equiprobable levels (tails cut at ±4.33σ,
    beyond which N(0, 1) has 1.5·10⁻⁵ of its mass; std 1 − 2·10⁻⁵), at +0.36 s per step
    (``python -m experiments.bench_cnn``; BUILD_NOTES, "the A.2 reward CNN step")."""
    n = math.prod(shape)
    words = jax.random.bits(key, ((n + 1) // 2,), jnp.uint32)
    index = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)[:n]
    return jnp.asarray(_normal_quantiles())[index.astype(jnp.int32)].reshape(shape).astype(dtype)


class RewardEnsemble:
    """The learner: model + config -> pure functions over ``EnsembleState``."""

    def __init__(self, model_spec: RewardModelSpec, config: EnsembleConfig = EnsembleConfig()):
        self.spec = model_spec
        self.config = config
        self.model: nn.Module = model_spec.build(mirrored=config.mirror, use_action=config.use_action)
        self.mirror = model_spec.mirror if config.mirror else None
        self.mode = resolve_member_axis(config.member_axis, model_kind=model_spec.kind)
        self.optimizer = optax.adam(config.learning_rate, b1=0.9, b2=0.999, eps=1e-8)
        self.reward_std = 1.0 if config.reward_std is None else float(config.reward_std)
        # The MLP has no dropout or batch norm: with no input noise its training-mode forward
        # pass is its inference forward pass, and the fit reuses it for the training loss.
        self.train_mode_is_inference = model_spec.kind == "mlp" and config.input_noise == 0
        # Vector observations mix features of very different scales (a pole angle in radians next
        # to velocities 10-50x larger): under one L2 penalty the MLP then barely uses the small
        # ones.  Images are scaled to [0, 1] and the CNN has batch norm; MinAtar grids are 0/1.
        self.standardizes = (config.standardize_inputs and model_spec.kind == "mlp"
                             and len(model_spec.obs_shape) == 1)

    # ------------------------------------------------------------------ construction
    def init(self, key: jax.Array) -> EnsembleState:
        obs, act = self.spec.dummy_inputs()
        m = self.config.num_members

        def init_one(k):
            variables = self.model.init({"params": k, "dropout": k}, obs, act, train=False)
            params = variables["params"]
            return params, dict(variables.get("batch_stats", {})), self.optimizer.init(params)

        params, stats, opt = jax.vmap(init_one)(jax.random.split(key, m))
        init_l2 = self.config.l2_init if self.config.adaptive_l2 else 0.0
        return EnsembleState(
            params=params,
            batch_stats=stats,
            opt_state=opt,
            l2=jnp.full((m,), init_l2, jnp.float32),
            train_loss_avg=jnp.zeros((m,), jnp.float32),
            val_loss_avg=jnp.zeros((m,), jnp.float32),
            norm_mean=jnp.zeros((m,), jnp.float32),
            norm_std=jnp.ones((m,), jnp.float32),
            input_mean=jnp.zeros(self.spec.obs_shape if self.standardizes else (), jnp.float32),
            input_std=jnp.ones(self.spec.obs_shape if self.standardizes else (), jnp.float32),
            steps=jnp.zeros((), jnp.int32),
        )

    def empty_buffer(self, capacity: int, segment_length: int) -> labels_lib.LabelBuffer:
        obs_dtype = jnp.uint8 if self.spec.kind == "cnn" else jnp.float32
        return labels_lib.empty_label_buffer(
            capacity, self.config.num_members, segment_length, self.spec.obs_shape,
            self.spec.action_shape, obs_dtype, jnp.dtype(self.spec.action_dtype))

    # ------------------------------------------------------------------ forward passes
    def _apply(self, params, stats, obs, action, train=False, key=None):
        """Rewards for flat rows; returns (rewards, new_batch_stats)."""
        variables = {"params": params, **({"batch_stats": stats} if stats else {})}
        if train:
            out, updates = self.model.apply(variables, obs, action, train=True,
                                            rngs={"dropout": key}, mutable=["batch_stats"])
            return out, dict(updates.get("batch_stats", stats))
        return self.model.apply(variables, obs, action, train=False), stats

    def _pair_rewards(self, params, stats, obs, action, train=False, key=None):
        """[P, 2, T, ...] inputs -> ([P, 2, T] rewards, new stats)."""
        p, _, t = obs.shape[:3]
        flat_obs = obs.reshape(p * 2 * t, *obs.shape[3:])
        flat_act = action.reshape(p * 2 * t, *action.shape[3:])
        r, stats = self._apply(params, stats, flat_obs, flat_act, train, key)
        return r.reshape(p, 2, t), stats

    def member_rewards(self, state: EnsembleState, obs, action) -> jax.Array:
        """Raw (unnormalized) rewards of every member for flat rows: [M, N]."""
        obs = standardize(obs, state.input_mean, state.input_std)
        fn = lambda params, stats: self._apply(params, stats, obs, action)[0]
        return over_members(fn, self.mode)(state.params, state.batch_stats)

    def normalize(self, state: EnsembleState, raw: jax.Array) -> jax.Array:
        """Raw member rewards ``[M, ...]`` -> each member's normalized on its own and scaled to ``reward_std``."""
        per_member = lambda x: x.reshape(-1, *(1,) * (raw.ndim - 1))
        return self.reward_std * (raw - per_member(state.norm_mean)) / per_member(state.norm_std)

    def normalized_member_rewards(self, state: EnsembleState, obs, action) -> jax.Array:
        """Every member's reward for flat rows, normalized on its own and scaled to ``reward_std``: [M, N]."""
        return self.normalize(state, self.member_rewards(state, obs, action))

    def predict_reward(self, state: EnsembleState, obs, action) -> jax.Array:
        """r̂ for flat rows [N, ...] -> [N]: members normalized independently, then averaged."""
        return jnp.mean(self.normalized_member_rewards(state, obs, action), axis=0)

    # ------------------------------------------------------------------ training
    def _objective(self, r, mu, true_reward):
        """The fitting loss of ``[P, 2, T]`` predicted rewards: Bradley-Terry on the labels, or
        (``loss="target"``) squared error to the true clip returns."""
        if self.config.loss == "target":
            return target_return_loss(r, true_reward)
        return bradley_terry_loss(r[:, 0], r[:, 1], mu, self.config.error_rate)

    def _member_step(self, params, stats, opt_state, l2, train_avg, val_avg, w_train, w_val, key,
                     buffer: labels_lib.LabelBuffer, steps, inputs):
        cfg = self.config
        k_tr, k_val, k_drop, k_noise = jax.random.split(key, 4)
        has_train = jnp.sum(w_train) > 0
        has_val = jnp.sum(w_val) > 0
        # labels drawn in proportion to their bootstrap counts (held-out and empty slots weigh 0);
        # no weight at all: uniform over the slots (and ``keep`` below leaves the member as it was)
        idx_tr = sample_indices(k_tr, w_train, cfg.batch_size)
        idx_val = sample_indices(k_val, w_val, cfg.batch_size)
        obs, act, mu = standardize(buffer.obs[idx_tr], *inputs), buffer.action[idx_tr], buffer.mu[idx_tr]
        obs_val = standardize(buffer.obs[idx_val], *inputs)

        x = obs
        if cfg.input_noise > 0:
            x = _to_unit_range(x) + cfg.input_noise * gaussian_noise(k_noise, x.shape)

        def loss_fn(p):
            r, new_stats = self._pair_rewards(p, stats, x, act, train=True, key=k_drop)
            bt = self._objective(r, mu, buffer.true_reward[idx_tr])
            reg = l2 * weight_l2(p) + cfg.reward_l2 * jnp.mean(jnp.square(r))
            return bt + reg, (bt, new_stats)

        (_, (bt_train_mode, new_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, new_opt = self.optimizer.update(grads, opt_state, params)
        new_params = optax.apply_updates(params, updates)

        # Both losses for the adaptive rule are measured the same way (inference mode, no noise),
        # so dropout does not make the training loss look worse than it is.  When training mode
        # is inference mode (no dropout, batch norm or input noise) the gradient's forward pass
        # already gave the training loss: only the validation batch needs a forward pass.  The two
        # batches go through separately, not concatenated: inference mode treats each frame on its
        # own, so the losses are the same, and the CNN's step with 3 unrolled members is ~20 %
        # faster on CPU without the 2x-batch copy (BUILD_NOTES, "The A.2 reward CNN step").
        r_val, _ = self._pair_rewards(params, stats, obs_val, buffer.action[idx_val])
        if self.train_mode_is_inference:
            train_loss = bt_train_mode
        else:
            r_eval, _ = self._pair_rewards(params, stats, obs, act)
            train_loss = self._objective(r_eval, mu, buffer.true_reward[idx_tr])
        val_loss = self._objective(r_val, buffer.mu[idx_val], buffer.true_reward[idx_val])

        decay = cfg.loss_average
        first = steps == 0
        train_avg_new = jnp.where(first, train_loss, decay * train_avg + (1 - decay) * train_loss)
        val_avg_new = jnp.where(first, val_loss, decay * val_avg + (1 - decay) * val_loss)
        val_avg_new = jnp.where(has_val, val_avg_new, val_avg)
        l2_new = l2
        if cfg.adaptive_l2:
            l2_new = jnp.where(has_val, adaptive_l2(l2, train_avg_new, val_avg_new, cfg.l2_rate,
                                                    cfg.l2_low, cfg.l2_high), l2)

        keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(has_train, a, b), new, old)
        out = (keep(new_params, params), keep(new_stats, stats), keep(new_opt, opt_state),
               keep(l2_new, l2), keep(train_avg_new, train_avg), val_avg_new)
        metrics = dict(train_loss=train_loss, val_loss=jnp.where(has_val, val_loss, jnp.nan),
                       train_loss_train_mode=bt_train_mode)
        return out, metrics

    def train_step(self, state: EnsembleState, buffer: labels_lib.LabelBuffer, key: jax.Array):
        """One Adam step for every member on its own minibatch: (state, metrics[M])."""
        m = self.config.num_members
        w_train = labels_lib.train_weights(buffer, self.config.bootstrap)
        w_val = labels_lib.heldout_weights(buffer)
        step = functools.partial(self._member_step, buffer=buffer, steps=state.steps,
                                 inputs=(state.input_mean, state.input_std))
        (params, stats, opt, l2, tr, va), metrics = over_members(step, self.mode)(
            state.params, state.batch_stats, state.opt_state, state.l2, state.train_loss_avg,
            state.val_loss_avg, w_train, w_val, jax.random.split(key, m))
        new_state = state.replace(params=params, batch_stats=stats, opt_state=opt, l2=l2,
                                  train_loss_avg=tr, val_loss_avg=va, steps=state.steps + 1)
        return new_state, metrics

    def fit(self, state: EnsembleState, buffer: labels_lib.LabelBuffer, key: jax.Array, num_steps: int):
        """``num_steps`` training steps in one compiled scan; metrics averaged over the steps, and
        the fitted state's ``evaluate`` under ``"evaluation"``.

        The input statistics are refreshed first and the reward normalization at the end (both over
        the label buffer's clips; the evaluation comes from the normalization's scoring); a fit of
        0 steps does only that (its step metrics are NaN).
        """
        return self.fit_keys(state, buffer, jax.random.split(key, num_steps))

    def fit_keys(self, state: EnsembleState, buffer: labels_lib.LabelBuffer, keys: jax.Array,
                 normalize: bool | jax.Array = True):
        """``fit`` with its steps' keys given ([steps]): a fit of n·b steps is then n fits of b keys
        each, with the same result (the input statistics and the normalization depend on the
        buffer alone, and no step reads the normalization).  ``normalize`` false (or a traced
        flag, so that one program serves both) skips the normalization at the end: the fits before
        the last of such a series need none."""

        def body(s, k):
            return self.train_step(s, buffer, k)

        state = self.update_input_statistics(state, buffer)
        state, metrics = jax.lax.scan(body, state, keys)
        if normalize is True:
            state, evaluation = self.normalize_and_evaluate(state, buffer)
        else:
            skipped = lambda s, b: (s, missing_like(jax.eval_shape(self.evaluate, s, b)))
            state, evaluation = jax.lax.cond(normalize, self.normalize_and_evaluate, skipped, state, buffer)
        return state, self._fit_metrics(metrics, evaluation)

    @staticmethod
    def _fit_metrics(steps, evaluation) -> dict:
        """A fit's metrics: its steps' minibatch metrics averaged over the steps, and ``evaluation``,
        ``evaluate`` of the fitted state from the normalization's pass (NaN where it was skipped)."""
        return dict(jax.tree.map(lambda x: jnp.nanmean(x, axis=0), steps), evaluation=evaluation)

    def fit_loop(self, backend: str | None = None) -> str:
        """'scan' or 'host' for this model and backend (``config.fit_loop``; 'auto' -> 'host' where
        ``core.loop_body_is_slow``: the CNN on CPU)."""
        if self.config.fit_loop != "auto":
            return self.config.fit_loop
        return "host" if loop_body_is_slow(self.spec.kind, backend) else "scan"

    def fitter(self, jit=program, block: int | None = None):
        """A compiled ``fit(state, buffer, key, num_steps)`` with the same results either way:
        the whole scan as one program, or a host loop over one compiled ``train_step``.

        ``block`` (scan only): a fit whose step count is a multiple of it runs as that many
        ``fit_keys`` calls of ``block`` keys each, one compiled program for every such count (a
        run's 500 pretraining steps and its 50 per iteration): the same ``split(key, num_steps)``
        keys in blocks, so the same steps; its metrics are the mean of the blocks' means."""
        if self.fit_loop() == "scan":
            whole = jit(self.fit, static_argnums=3)
            if not block:
                return whole
            blocks = jit(self.fit_keys)

            def blocked_fit(state, buffer, key, num_steps):
                if num_steps == 0 or num_steps % block:
                    return whole(state, buffer, key, num_steps)
                keys = jax.random.split(key, num_steps)
                history, count = [], num_steps // block
                for i, k in enumerate(keys.reshape(count, block, *key.shape)):  # normalized once, after the last
                    state, metrics = blocks(state, buffer, k, np.bool_(i == count - 1))
                    history.append(metrics)
                history = jax.device_get(history)
                steps = [{k: v for k, v in m.items() if k != "evaluation"} for m in history]
                means = jax.tree.map(lambda *xs: np.mean(np.stack(xs), axis=0), *steps)
                return state, dict(means, evaluation=history[-1]["evaluation"])  # the last block's

            return blocked_fit
        step = jit(self.train_step)
        finish = jit(self.normalize_and_evaluate)
        inputs = jit(self.update_input_statistics)

        def host_fit(state, buffer, key, num_steps):
            state = inputs(state, buffer)
            history = []
            for k in jax.random.split(key, num_steps):
                state, metrics = step(state, buffer, k)
                history.append(metrics)
            if not history:  # 0 steps: NaN metrics, as the scan's mean over no steps
                shapes = jax.eval_shape(step, state, buffer, key)[1]
                history = [missing_like(shapes)]
            state, evaluation = finish(state, buffer)
            return state, self._fit_metrics(jax.tree.map(lambda *xs: jnp.stack(xs), *history), evaluation)

        return host_fit

    # ------------------------------------------------------------------ whole-buffer passes
    def buffer_member_rewards(self, state: EnsembleState, buffer: labels_lib.LabelBuffer) -> jax.Array:
        """Raw rewards of every member on every clip step in the buffer: [M, C, 2, T].

        Scored in chunks of ``chunk_size`` rows, up to the chunk that holds the last filled slot
        (labels fill the buffer from slot 0, ``labels.add_labels``); the rows after it are 0, and
        every use weighs rows by ``filled``.  Every fit ends with this pass (the normalization),
        and early in a run most of the buffer is empty: Pong's 3,300 labels are 165,000 frames per
        member, 61-71 s for 3 members on 2 CPU cores when every slot was scored (BUILD_NOTES,
        "Scoring the label set").  The buffer's last chunk ends at its end, overlapping the one
        before, so the buffer is never copied with padding; each chunk is standardized once for
        all members."""
        c, _, t = buffer.obs.shape[:3]
        n = c * 2 * t
        obs = buffer.obs.reshape(n, *buffer.obs.shape[3:])
        act = buffer.action.reshape(n, *buffer.action.shape[3:])
        chunk = min(self.config.chunk_size, n)
        last = jnp.max(jnp.where(buffer.filled, jnp.arange(c), -1))  # -1: empty
        chunks = ((last + 1) * 2 * t + chunk - 1) // chunk

        def score(i, out):  # chunk i, every member
            start = jnp.minimum(i * chunk, n - chunk)
            rows = lambda x: jax.lax.dynamic_slice_in_dim(x, start, chunk)
            x, a = standardize(rows(obs), state.input_mean, state.input_std), rows(act)
            r = over_members(lambda params, stats: self._apply(params, stats, x, a)[0], self.mode)(
                state.params, state.batch_stats)
            return jax.lax.dynamic_update_slice_in_dim(out, r.astype(out.dtype), start, 1)

        m = self.config.num_members
        return jax.lax.fori_loop(0, chunks, score, jnp.zeros((m, n), jnp.float32)).reshape(m, c, 2, t)

    def update_input_statistics(self, state: EnsembleState, buffer: labels_lib.LabelBuffer) -> EnsembleState:
        """Per-feature mean and std of the observations of every step of every labeled clip (vector
        observations; a no-op otherwise).  Refreshed before each fit, so r̂ is one fixed function
        between fits; the labeled clips grow slowly, so the scale drifts slowly."""
        if not self.standardizes:
            return state
        obs = buffer.obs.astype(jnp.float32)  # [C, 2, T, D]
        mean, var = _filled_moments(obs, buffer.filled[:, None, None, None], (0, 1, 2))
        if self.mirror is not None:  # over the clips and their mirror images: standardizing commutes with the mirror
            index = jnp.asarray(self.mirror.obs_permutation)
            second = var + jnp.square(mean)  # per feature, then averaged with its image's
            second = (second + second[index]) / 2
            mean = (mean + jnp.asarray(self.mirror.obs_sign) * mean[index]) / 2
            var = jnp.maximum(second - jnp.square(mean), 0.0)
        std = jnp.maximum(jnp.sqrt(var), INPUT_STD_FLOOR)
        empty = jnp.sum(buffer.filled) == 0
        return state.replace(input_mean=jnp.where(empty, state.input_mean, mean),
                             input_std=jnp.where(empty, state.input_std, std))

    def normalize_and_evaluate(self, state: EnsembleState, buffer: labels_lib.LabelBuffer):
        """``(update_normalization(...), evaluate(...))`` from one scoring of the label set: the
        pass every fit ends with also gives the members' accuracy and loss on the labels, so a
        caller that validates after a fit does not score the set a second time (a full Pong set is
        ~60 s for 3 members on 2 CPU cores; BUILD_NOTES, "Scoring the label set")."""
        r = self.buffer_member_rewards(state, buffer)  # [M, C, 2, T]
        return self._normalized(state, buffer, r), self._evaluation(buffer, r)

    def update_normalization(self, state: EnsembleState, buffer: labels_lib.LabelBuffer) -> EnsembleState:
        """Per-member mean and std of raw rewards over every step of every clip in the buffer."""
        return self._normalized(state, buffer, self.buffer_member_rewards(state, buffer))

    def evaluate(self, state: EnsembleState, buffer: labels_lib.LabelBuffer) -> dict[str, jax.Array]:
        """Per member [M]: accuracy and BT loss on its held-out labels and on its training labels,
        and the BT loss on every label in the set (``label_loss``)."""
        return self._evaluation(buffer, self.buffer_member_rewards(state, buffer))

    @staticmethod
    def _normalized(state: EnsembleState, buffer: labels_lib.LabelBuffer, r) -> EnsembleState:
        mean, var = _filled_moments(r, buffer.filled[None, :, None, None], (1, 2, 3))
        std = jnp.sqrt(var) + 1e-6
        empty = jnp.sum(buffer.filled) == 0
        return state.replace(norm_mean=jnp.where(empty, 0.0, mean), norm_std=jnp.where(empty, 1.0, std))

    def _evaluation(self, buffer: labels_lib.LabelBuffer, r) -> dict[str, jax.Array]:
        ret = segment_returns(r)  # [M, C, 2]
        w_val = labels_lib.heldout_weights(buffer)
        w_tr = (labels_lib.train_weights(buffer) > 0).astype(jnp.float32)

        def per_member(ret_m, wv, wt):
            acc = lambda w: preference_accuracy(ret_m[:, 0], ret_m[:, 1], buffer.mu, w)
            loss = lambda w: bradley_terry_loss(ret_m[:, :1], ret_m[:, 1:], buffer.mu, self.config.error_rate, w)
            return dict(val_accuracy=acc(wv), train_accuracy=acc(wt), val_loss=loss(wv), train_loss=loss(wt),
                        label_loss=loss(buffer.filled))

        return jax.vmap(per_member)(ret, w_val, w_tr)

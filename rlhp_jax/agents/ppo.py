"""Proximal policy optimisation (Schulman et al. 2017) as pure, jitted JAX functions.

The agent learns only from ``obs``, ``action``, ``boundary`` and a reward array given to
:meth:`PPO.update` (normally the learned reward model's normalized output). It never reads
``terminated`` or ``true_reward``: the only episode end it knows is the fixed-horizon
``boundary``, which cuts the GAE traces.

Discrete tasks use a categorical policy; continuous tasks a diagonal Gaussian with a
state-independent log-std. Continuous samples are clipped to the action bounds only when sent
to the environment (:func:`rlhp_jax.rollout.clip_action`); log-probs refer to the unclipped
sample.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from rlhp_jax.envs import EnvSpec, VecEnv
from rlhp_jax.rollout import Rollout, clip_action, collect_rollout

_LOG_2PI = math.log(2.0 * math.pi)


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    num_envs: int = 8  # parallel environments per rollout
    num_steps: int = 256  # steps per environment per rollout (batch = num_envs * num_steps)
    gamma: float = 0.99  # discount
    gae_lambda: float = 0.95  # GAE lambda
    lr: float = 2e-3  # Adam learning rate (initial value when annealed)
    anneal_lr: bool = True  # decay lr linearly to 0 over total_updates (needs total_updates)
    clip_eps: float = 0.2  # PPO ratio clip
    update_epochs: int = 8  # passes over each rollout
    num_minibatches: int = 8  # minibatches per epoch
    ent_coef: float = 0.0  # entropy bonus coefficient
    vf_coef: float = 0.5  # value loss coefficient
    max_grad_norm: float = 0.5  # global gradient-norm clip
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP widths (separate actor and critic trunks)
    activation: str = "tanh"  # any flax.linen activation name, e.g. "tanh", "relu"
    log_std_init: float = 0.0  # initial log-std, in units of half the action range (continuous)

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps


# Per-task presets tuned on the true reward scaled to unit std (the driver's true-reward baseline), over
# several seeds, favouring stability over the last bit of speed. The defaults are CartPole's.
PRESETS: dict[str, PPOConfig] = {
    "CartPole-v1": PPOConfig(),
    "Pendulum-v1": PPOConfig(
        num_envs=16,
        num_steps=256,
        gamma=0.95,
        lr=1e-3,
        update_epochs=10,
        num_minibatches=32,
        log_std_init=-0.5,
    ),
}


def preset(env_name: str) -> PPOConfig:
    """The tuned config for ``env_name``, or the defaults when there is none."""
    return PRESETS.get(env_name, PPOConfig())


@struct.dataclass
class PPOState:
    params: Any
    opt_state: Any
    step: jax.Array  # number of updates done


class ActorCritic(nn.Module):
    """Separate MLP trunks for the policy head and the value head."""

    out_dim: int  # logits (discrete) or mean (continuous) size
    hidden_sizes: tuple[int, ...]
    activation: str
    continuous: bool
    log_std_init: float

    @nn.compact
    def __call__(self, x):
        act = getattr(nn, self.activation)
        orth = nn.initializers.orthogonal

        def trunk(h, name):
            for i, width in enumerate(self.hidden_sizes):
                h = act(nn.Dense(width, kernel_init=orth(math.sqrt(2.0)), name=f"{name}_{i}")(h))
            return h

        head = nn.Dense(self.out_dim, kernel_init=orth(0.01), name="pi_out")(trunk(x, "pi"))
        value = nn.Dense(1, kernel_init=orth(1.0), name="v_out")(trunk(x, "v"))[..., 0]
        log_std = None
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.out_dim,))
        return head, log_std, value


def compute_gae(
    rewards: jax.Array,
    values: jax.Array,
    boundaries: jax.Array,
    last_value: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation over [T, N] arrays, cut at ``boundaries``.

    A boundary at step t ends the episode: no bootstrapping from (and no trace through) t+1.
    Returns ``(advantages, value_targets)``.
    """
    next_values = jnp.concatenate([values[1:], last_value[None]], axis=0)
    not_done = 1.0 - boundaries.astype(jnp.float32)
    deltas = rewards + gamma * next_values * not_done - values

    def backward(adv_next, x):
        delta, nd = x
        adv = delta + gamma * gae_lambda * nd * adv_next
        return adv, adv

    _, adv = jax.lax.scan(backward, jnp.zeros_like(last_value), (deltas, not_done), reverse=True)
    return adv, adv + values


class PPO:
    """PPO for one :class:`EnvSpec`. All methods are pure; jit them (they are jit-friendly)."""

    def __init__(self, spec: EnvSpec, config: PPOConfig = PPOConfig(), total_updates: int | None = None):
        self.spec = spec
        self.config = config
        self.total_updates = total_updates
        self.net = ActorCritic(
            out_dim=spec.num_actions,
            hidden_sizes=tuple(config.hidden_sizes),
            activation=config.activation,
            continuous=not spec.discrete,
            log_std_init=config.log_std_init,
        )
        if not spec.discrete:
            low = np.asarray(spec.action_low, np.float32)
            high = np.asarray(spec.action_high, np.float32)
            self._center, self._half = (high + low) / 2.0, (high - low) / 2.0
        minibatch_updates = config.update_epochs * config.num_minibatches
        lr: float | optax.Schedule = config.lr
        if config.anneal_lr and total_updates:
            lr = optax.linear_schedule(config.lr, 0.0, total_updates * minibatch_updates)
        self._lr = lr
        self.tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), optax.adam(lr, eps=1e-5))
        self._init_jit = jax.jit(self._init)

    # -- network and distribution ---------------------------------------------------------
    def _forward(self, params, obs):
        """Returns (dist_params, value); dist_params are logits or (mean, log_std) in env units."""
        n_obs = len(self.spec.obs_shape)
        x = obs.reshape(obs.shape[: obs.ndim - n_obs] + (-1,)).astype(jnp.float32)
        head, log_std, value = self.net.apply(params, x)
        if self.spec.discrete:
            return head, value
        mean = self._center + self._half * head
        return (mean, jnp.broadcast_to(log_std + jnp.log(self._half), mean.shape)), value

    def _log_prob(self, dist, action):
        if self.spec.discrete:
            logp = jax.nn.log_softmax(dist)
            return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
        mean, log_std = dist
        z = (action - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * _LOG_2PI, axis=-1)

    def _entropy(self, dist):
        if self.spec.discrete:
            logp = jax.nn.log_softmax(dist)
            return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
        _, log_std = dist
        return jnp.sum(log_std + 0.5 * (_LOG_2PI + 1.0), axis=-1)

    # -- public API -------------------------------------------------------------------------
    def init(self, key: jax.Array) -> PPOState:
        return self._init_jit(key)  # jitted: eager flax init (orthogonal QR etc.) is slow on CPU

    def _init(self, key: jax.Array) -> PPOState:
        dummy = jnp.zeros((1, math.prod(self.spec.obs_shape)), jnp.float32)
        params = self.net.init(key, dummy)
        return PPOState(params=params, opt_state=self.tx.init(params), step=jnp.zeros((), jnp.int32))

    def policy(self, params, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sample ``(action, log_prob, value)``; usable as ``policy_fn`` for collect_rollout."""
        dist, value = self._forward(params, obs)
        if self.spec.discrete:
            action = jax.random.categorical(key, dist).astype(jnp.int32)
        else:
            mean, log_std = dist
            action = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
        return action, self._log_prob(dist, action), value

    def act_deterministic(self, params, obs: jax.Array) -> jax.Array:
        """Greedy action (argmax / clipped mean), as sent to the environment."""
        dist, _ = self._forward(params, obs)
        if self.spec.discrete:
            return jnp.argmax(dist, axis=-1).astype(jnp.int32)
        return clip_action(self.spec, dist[0])

    def value(self, params, obs: jax.Array) -> jax.Array:
        return self._forward(params, obs)[1]

    def _loss(self, params, batch):
        """PPO loss over the steps with ``valid`` set (a deferred-reset step's action was ignored
        by the environment, so it carries no information about the policy)."""
        obs, action, old_logp, adv, target, valid = batch
        w = valid.astype(jnp.float32)
        n = jnp.maximum(w.sum(), 1.0)
        wmean = lambda x: jnp.sum(w * x) / n
        dist, value = self._forward(params, obs)
        logp = self._log_prob(dist, action)
        adv_mean = wmean(adv)
        adv = (adv - adv_mean) / (jnp.sqrt(wmean(jnp.square(adv - adv_mean))) + 1e-8)
        log_ratio = logp - old_logp
        ratio = jnp.exp(log_ratio)
        clip = self.config.clip_eps
        pg_loss = -wmean(jnp.minimum(ratio * adv, jnp.clip(ratio, 1.0 - clip, 1.0 + clip) * adv))
        v_loss = 0.5 * wmean((value - target) ** 2)
        entropy = wmean(self._entropy(dist))
        loss = pg_loss + self.config.vf_coef * v_loss - self.config.ent_coef * entropy
        stats = dict(
            policy_loss=pg_loss,
            value_loss=v_loss,
            entropy=entropy,
            approx_kl=wmean((ratio - 1.0) - log_ratio),
            clip_frac=wmean(jnp.abs(ratio - 1.0) > clip),
        )
        return loss, stats

    def update(self, state: PPOState, rollout: Rollout, rewards: jax.Array, key: jax.Array):
        """One PPO update from a rollout and its rewards [T, N]. Returns (state, metrics)."""
        cfg = self.config
        adv, target = compute_gae(
            rewards, rollout.value, rollout.boundary, rollout.last_value, cfg.gamma, cfg.gae_lambda
        )
        flat = lambda x: x.reshape((-1,) + x.shape[2:])
        data = tuple(map(flat, (rollout.obs, rollout.action, rollout.log_prob, adv, target, rollout.valid)))
        batch_size = data[0].shape[0]
        mb_size = batch_size // cfg.num_minibatches
        grad_fn = jax.value_and_grad(self._loss, has_aux=True)

        def minibatch_step(carry, mb):
            params, opt_state = carry
            (_, stats), grads = grad_fn(params, mb)
            updates, opt_state = self.tx.update(grads, opt_state, params)
            stats["grad_norm"] = optax.global_norm(grads)
            return (optax.apply_updates(params, updates), opt_state), stats

        def epoch(carry, epoch_key):
            perm = jax.random.permutation(epoch_key, batch_size)[: mb_size * cfg.num_minibatches]
            mbs = jax.tree.map(lambda x: x[perm].reshape((cfg.num_minibatches, mb_size) + x.shape[1:]), data)
            return jax.lax.scan(minibatch_step, carry, mbs)

        (params, opt_state), stats = jax.lax.scan(
            epoch, (state.params, state.opt_state), jax.random.split(key, cfg.update_epochs)
        )
        metrics = jax.tree.map(jnp.mean, stats)
        metrics["value_target_mean"] = target.mean()
        metrics["explained_var"] = 1.0 - jnp.var(target - rollout.value) / (jnp.var(target) + 1e-8)
        if callable(self._lr):
            metrics["lr"] = self._lr(state.step * cfg.update_epochs * cfg.num_minibatches)
        else:
            metrics["lr"] = jnp.asarray(self._lr, jnp.float32)
        return PPOState(params=params, opt_state=opt_state, step=state.step + 1), metrics


@functools.partial(jax.jit, static_argnames=("env", "agent", "num_episodes", "max_steps"))
def evaluate(env: VecEnv, agent: PPO, params, key: jax.Array, num_episodes: int, max_steps: int) -> jax.Array:
    """Mean undiscounted return of the greedy policy on the *unmodified* task.

    Each of ``num_episodes`` episodes runs for at most ``max_steps`` steps (use spec.horizon)
    and sums the raw reward up to and including the first ``done``.
    """

    def episode(ep_key):
        k_reset, k_steps = jax.random.split(ep_key)
        obs, inner = env.episodic_reset(k_reset)

        def step(carry, step_key):
            inner, obs, ret, alive = carry
            action = agent.act_deterministic(params, obs)
            inner, obs, reward, done = env.episodic_eval_step(step_key, inner, action)
            ret = ret + jnp.where(alive, reward, 0.0)
            return (inner, obs, ret, alive & ~done), None

        init = (inner, obs, jnp.zeros((), jnp.float32), jnp.ones((), bool))
        (_, _, ret, _), _ = jax.lax.scan(step, init, jax.random.split(k_steps, max_steps))
        return ret

    return jnp.mean(jax.vmap(episode)(jax.random.split(key, num_episodes)))


def random_reward_stats(env: VecEnv, key: jax.Array, num_steps: int = 1000) -> tuple[float, float]:
    """Mean and std of the true reward under uniformly random actions (policy-free constants)."""
    spec = env.spec

    def random_policy(_, obs, k):
        n = obs.shape[0]
        if spec.discrete:
            action = jax.random.randint(k, (n,), 0, spec.num_actions, jnp.int32)
        else:
            low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
            action = jax.random.uniform(k, (n, spec.num_actions), minval=low, maxval=high)
        return action, jnp.zeros(n), jnp.zeros(n)

    k_reset, k_roll = jax.random.split(key)
    state, obs = env.reset(k_reset)
    _, _, ro = collect_rollout(env, random_policy, None, state, obs, k_roll, num_steps)
    return float(jnp.mean(ro.true_reward)), float(jnp.maximum(jnp.std(ro.true_reward), 1e-6))

"""What every agent shares (layer 2): the agent protocol, policy networks, action distributions, GAE.

Agents are objects of pure functions over a ``flax.struct`` state, all jit-friendly::

    agent = PPO(spec, config, total_updates)   # or A2C, TRPO
    state = agent.init(key)                    # state.params, state.step, ...
    action, log_prob, value = agent.policy(state.params, obs, key)   # the rollout's policy_fn
    action = agent.act_deterministic(state.params, obs)              # evaluation
    state, metrics = agent.update(state, rollout, rewards, key)      # one update from a Rollout

``config.num_envs`` and ``config.num_steps`` say what one update consumes; agents learn only
from ``obs``, ``action``, ``boundary``, ``valid`` and the reward array they are given
(Christiano et al. 2017, appendix A).  :class:`Policy` holds the network and the
distribution arithmetic, so each algorithm only writes its loss and its update.

Every agent config checks itself when it is built (:func:`check_config`, from its
``__post_init__``): declared field types, finite numbers, positive sizes, a known activation, so
that a bad ``--agent-config`` or ``config.json`` value is refused with the field's name before a
run directory exists, instead of failing inside a compiled update.

Networks: an MLP with separate policy and value trunks for vector observations, and the
Nature-DQN trunk (Mnih et al. 2015: conv 32×8×8/4, 64×4×4/2, 64×3×3/1, dense 512, ReLU) shared
by the policy and value heads for image observations (Christiano A.2 "policy architecture as
described in Mnih et al. (2015)").  Discrete actions: categorical; continuous actions: diagonal
Gaussian with a state-independent log-std, in units of half the action range.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Protocol

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlhp_jax.config_fields import check_ranges, conform_fields, field_types
from rlhp_jax.compile_cache import jit as program
from rlhp_jax.core import EnvSpec, VecEnv
from rlhp_jax.rollout import collect_rollout, uniform_random_policy
from rlhp_jax.core import Rollout, clip_action

LOG_2PI = math.log(2.0 * math.pi)
# flax.linen's elementwise activations: what the ``activation`` field of an agent config may name
ACTIVATIONS = ("celu", "elu", "gelu", "hard_sigmoid", "hard_silu", "hard_swish", "hard_tanh", "leaky_relu",
               "log_sigmoid", "relu", "relu6", "selu", "sigmoid", "silu", "soft_sign", "softplus", "swish", "tanh")
NETWORKS = ("auto", "mlp", "cnn")


# ----------------------------------------------------------------------------- config checks
def check_config(cfg, *, counts=(), positive=(), nonnegative=(), fractions=()) -> None:
    """The checks of an agent config's ``__post_init__``; raises ``ValueError`` naming the field.

    Every field must hold its declared type (:func:`rlhp_jax.config_fields.conform_fields`, which
    also turns an int given for a float into a float) and every float must be finite; the named
    ``counts`` must be >= 1, ``positive`` > 0, ``nonnegative`` >= 0, ``fractions`` in [0, 1].
    ``hidden_sizes``, ``activation`` and ``network``, where the config has them, must be widths
    >= 1, one of :data:`ACTIVATIONS` and one of :data:`NETWORKS`.  Traced values (a setting the
    compiled loop vmaps over) are not checked."""
    conform_fields(cfg)
    values = {name: getattr(cfg, name) for name in field_types(type(cfg))}
    for name, v in values.items():
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"{name} must be finite, got {v}")
    check_ranges(cfg, counts=counts, positive=positive, nonnegative=nonnegative, fractions=fractions)
    if "hidden_sizes" in values and any(w < 1 for w in values["hidden_sizes"]):
        raise ValueError(f"hidden_sizes must hold widths of at least 1, got {values['hidden_sizes']}")
    if "activation" in values and values["activation"] not in ACTIVATIONS:
        raise ValueError(f"activation must be one of {', '.join(ACTIVATIONS)}; got {values['activation']!r}")
    if "network" in values and values["network"] not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)}; got {values['network']!r}")


def check_minibatches(cfg, name: str) -> None:
    """``cfg.<name>`` minibatches must split the batch of ``num_envs × num_steps`` steps evenly."""
    k, batch = getattr(cfg, name), cfg.num_envs * cfg.num_steps
    if batch % k:
        raise ValueError(f"{name} ({k}) must divide the batch of num_envs × num_steps = {batch} steps")


class Agent(Protocol):
    spec: EnvSpec
    config: Any  # has num_envs, num_steps, batch_size

    def init(self, key: jax.Array) -> Any: ...

    def policy(self, params, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]: ...

    def act_deterministic(self, params, obs: jax.Array) -> jax.Array: ...

    def update(self, state, rollout: Rollout, rewards: jax.Array, key: jax.Array) -> tuple[Any, dict]: ...


class MLPActorCritic(nn.Module):
    """Separate MLP trunks for the policy head and the value head (inputs flattened)."""

    out_dim: int  # logits (discrete) or mean (continuous) size
    hidden_sizes: tuple[int, ...]
    activation: str
    continuous: bool
    log_std_init: float

    @nn.compact
    def __call__(self, x):
        act = getattr(nn, self.activation)
        orth = nn.initializers.orthogonal
        x = x.reshape(x.shape[0], -1).astype(jnp.float32)

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


class NatureCNNActorCritic(nn.Module):
    """Mnih et al. 2015's network on [N, H, W, C] frames (uint8 scaled to [0, 1]), shared by a
    policy head and a value head (as in A2C)."""

    out_dim: int
    continuous: bool = False
    log_std_init: float = 0.0

    @nn.compact
    def __call__(self, x):
        orth = nn.initializers.orthogonal
        h = x.astype(jnp.float32)
        if jnp.issubdtype(x.dtype, jnp.integer):
            h = h / 255.0
        for feat, k, s in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            h = nn.relu(nn.Conv(feat, (k, k), strides=(s, s), padding="VALID",
                                kernel_init=orth(math.sqrt(2.0)))(h))
        h = h.reshape(h.shape[0], -1)
        h = nn.relu(nn.Dense(512, kernel_init=orth(math.sqrt(2.0)))(h))
        head = nn.Dense(self.out_dim, kernel_init=orth(0.01), name="pi_out")(h)
        value = nn.Dense(1, kernel_init=orth(1.0), name="v_out")(h)[..., 0]
        log_std = None
        if self.continuous:
            log_std = self.param("log_std", nn.initializers.constant(self.log_std_init), (self.out_dim,))
        return head, log_std, value


def is_image(spec: EnvSpec) -> bool:
    """Image observations large enough for the Nature-DQN trunk (Atari's 84×84×4)."""
    shape = tuple(spec.obs_shape)
    return len(shape) == 3 and min(shape[:2]) >= 36


class Policy:
    """A policy network for one :class:`EnvSpec` and the arithmetic of its action distribution.

    ``dist`` is the logits ``[..., A]`` (discrete) or ``(mean, log_std)`` in environment units
    (continuous).  Everything here is pure and jit/vmap-safe.
    """

    def __init__(self, spec: EnvSpec, hidden_sizes=(64, 64), activation: str = "tanh",
                 log_std_init: float = 0.0, network: str = "auto"):
        self.spec = spec
        if network == "auto":
            network = "cnn" if is_image(spec) else "mlp"
        if network not in ("mlp", "cnn"):
            raise ValueError(f"network must be 'auto', 'mlp' or 'cnn', got {network!r}")
        self.network = network
        continuous = not spec.discrete
        if network == "cnn":
            self.net = NatureCNNActorCritic(spec.num_actions, continuous, log_std_init)
        else:
            self.net = MLPActorCritic(spec.num_actions, tuple(hidden_sizes), activation, continuous, log_std_init)
        if continuous:
            low = np.asarray(spec.action_low, np.float32)
            high = np.asarray(spec.action_high, np.float32)
            self._center, self._half = (high + low) / 2.0, (high - low) / 2.0

    def init_params(self, key: jax.Array):
        obs_dtype = jnp.uint8 if self.network == "cnn" else jnp.float32
        return self.net.init(key, jnp.zeros((1, *self.spec.obs_shape), obs_dtype))

    def forward(self, params, obs: jax.Array):
        """(dist, value) for a batch ``[..., *obs_shape]`` (any number of leading axes)."""
        n_obs = len(self.spec.obs_shape)
        lead = obs.shape[: obs.ndim - n_obs]
        head, log_std, value = self.net.apply(params, obs.reshape((-1,) + obs.shape[obs.ndim - n_obs:]))
        head = head.reshape(lead + head.shape[1:])
        value = value.reshape(lead)
        if self.spec.discrete:
            return head, value
        mean = self._center + self._half * head
        return (mean, jnp.broadcast_to(log_std + jnp.log(self._half), mean.shape)), value

    def log_prob(self, dist, action):
        if self.spec.discrete:
            logp = jax.nn.log_softmax(dist)
            return jnp.take_along_axis(logp, action[..., None].astype(jnp.int32), axis=-1)[..., 0]
        mean, log_std = dist
        z = (action - mean) * jnp.exp(-log_std)
        return jnp.sum(-0.5 * z**2 - log_std - 0.5 * LOG_2PI, axis=-1)

    def entropy(self, dist):
        if self.spec.discrete:
            logp = jax.nn.log_softmax(dist)
            return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
        _, log_std = dist
        return jnp.sum(log_std + 0.5 * (LOG_2PI + 1.0), axis=-1)

    def kl(self, dist_p, dist_q):
        """KL(p ‖ q) per row."""
        if self.spec.discrete:
            lp, lq = jax.nn.log_softmax(dist_p), jax.nn.log_softmax(dist_q)
            return jnp.sum(jnp.exp(lp) * (lp - lq), axis=-1)
        (mp, sp), (mq, sq) = dist_p, dist_q
        return jnp.sum(sq - sp + (jnp.exp(2 * sp) + (mp - mq) ** 2) / (2 * jnp.exp(2 * sq)) - 0.5, axis=-1)

    def sample(self, dist, key):
        if self.spec.discrete:
            return jax.random.categorical(key, dist).astype(jnp.int32)
        mean, log_std = dist
        return mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)

    def mode(self, dist):
        """Greedy action as sent to the environment (argmax / clipped mean)."""
        if self.spec.discrete:
            return jnp.argmax(dist, axis=-1).astype(jnp.int32)
        return clip_action(self.spec, dist[0])

    # the pieces every agent exposes
    def act(self, params, obs, key):
        dist, value = self.forward(params, obs)
        action = self.sample(dist, key)
        return action, self.log_prob(dist, action), value


@struct.dataclass
class AgentState:
    params: Any  # the actor-critic parameter tree
    opt_state: Any  # the optimizer state (TRPO: of the value parameters only)
    step: jax.Array  # number of updates done


class ActorCriticAgent:
    """What PPO, A2C and TRPO share: a :class:`Policy` built from the config's network fields,
    and the acting half of the agent protocol.  Subclasses set ``self.tx`` (the optimizer whose
    state ``init`` creates) and write ``update``."""

    def __init__(self, spec: EnvSpec, config: Any, total_updates: int | None = None):
        self.spec = spec
        self.config = config
        self.total_updates = total_updates
        self.pi = Policy(spec, config.hidden_sizes, config.activation, config.log_std_init, config.network)
        self._init_jit = program(self._init, quick=True)

    def init(self, key: jax.Array) -> AgentState:
        return self._init_jit(key)  # jitted: eager flax init (orthogonal QR etc.) is slow on CPU

    def _optimized_params(self, params):
        """The part of the parameter tree ``self.tx`` updates (all of it, unless overridden)."""
        return params

    def _init(self, key: jax.Array) -> AgentState:
        params = self.pi.init_params(key)
        return AgentState(params=params, opt_state=self.tx.init(self._optimized_params(params)),
                          step=jnp.zeros((), jnp.int32))

    def policy(self, params, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Sample ``(action, log_prob, value)``; usable as ``policy_fn`` for collect_rollout."""
        return self.pi.act(params, obs, key)

    def act_deterministic(self, params, obs: jax.Array) -> jax.Array:
        """Greedy action (argmax / clipped mean), as sent to the environment."""
        return self.pi.mode(self.pi.forward(params, obs)[0])

    def value(self, params, obs: jax.Array) -> jax.Array:
        return self.pi.forward(params, obs)[1]


def compute_gae(rewards: jax.Array, values: jax.Array, boundaries: jax.Array, last_value: jax.Array,
                gamma: float, gae_lambda: float, valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Generalized advantage estimation over [T, N] arrays, cut at ``boundaries``.

    A boundary at step t ends the episode: no bootstrapping from (and no trace through) t+1.
    ``gae_lambda=1`` gives the n-step returns of A2C.  Steps with ``valid=False`` (envpool's
    deferred resets: no real transition) are transparent: the valid step before one bootstraps
    from, and traces through, the next valid step, and whatever the invalid step holds (reward
    — r̂ there is meaningless —, value, boundary) is never read; their advantages and targets
    are 0.  Returns ``(advantages, value_targets)``.
    """
    ok_all = jnp.ones(rewards.shape, bool) if valid is None else jnp.asarray(valid, bool)

    def backward(carry, x):
        next_value, adv_next = carry
        reward, value, boundary, ok = x
        not_done = 1.0 - boundary.astype(jnp.float32)
        adv = reward + gamma * next_value * not_done - value + gamma * gae_lambda * not_done * adv_next
        carry = (jnp.where(ok, value, next_value), jnp.where(ok, adv, adv_next))
        return carry, jnp.where(ok, adv, 0.0)

    init = (last_value.astype(jnp.float32), jnp.zeros_like(last_value, jnp.float32))
    _, adv = jax.lax.scan(backward, init, (rewards, values, boundaries, ok_all), reverse=True)
    return adv, jnp.where(ok_all, adv + values, 0.0)


def weighted_mean(valid: jax.Array):
    """``mean(x)`` over the steps flagged ``valid`` (envpool's deferred-reset steps carry no
    information about the policy: their action was ignored)."""
    w = valid.astype(jnp.float32)
    n = jnp.maximum(w.sum(), 1.0)
    return lambda x: jnp.sum(w * x) / n


@functools.partial(jax.jit, static_argnames=("env", "agent", "num_episodes", "max_steps"))
def evaluate(env: VecEnv, agent: Agent, params, key: jax.Array, num_episodes: int, max_steps: int) -> jax.Array:
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


def random_reward_stats(env: VecEnv, key: jax.Array, num_steps: int = 1000) -> jax.Array:
    """[2] float32: mean and std of the true reward under uniformly random actions (policy-free
    constants that scale the true reward for the RL baseline); jittable for pure-JAX envs."""
    k_reset, k_roll = jax.random.split(key)
    state, obs = env.reset(k_reset)
    _, _, ro = collect_rollout(env, uniform_random_policy(env.spec), None, state, obs, k_roll, num_steps)
    return jnp.stack([jnp.mean(ro.true_reward), jnp.maximum(jnp.std(ro.true_reward), 1e-6)]).astype(jnp.float32)

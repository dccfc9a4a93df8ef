"""Deep Q-learning from demonstrations (Hester et al. 2018) as pure, jitted JAX functions.

Ibarz et al. 2018, §2.3 and appendix A.3: the objective is

    J(Q) = J_DQ(Q) + λ₁ J_n(Q) + λ₂ J_E(Q) + λ₃ J_L2(Q)

* ``J_DQ`` / ``J_n``: double-Q (Hasselt et al.) TD losses of the 1-step and 3-step returns, with
  the action chosen by the online network and valued by the target network (updated every 8,000
  actor steps), γ = 0.99; each sample weighted by its prioritized-replay importance weight;
* ``J_E``: the large-margin supervised loss on demonstration transitions only,
  ``max_a [Q(s, a) + l(a_E, a)] − Q(s, a_E)`` with margin ``l = 1`` for a ≠ a_E (A.3: "Q
  margin=1, loss weight=1");
* ``J_L2``: L2 on the network weights.

The Q-network is dueling (Wang et al.): Q = V + A − mean(A), on Mnih et al.'s Nature trunk for 4
stacked 84×84 frames, or an MLP for small observations (MinAtar, classic control).  Adam with
learning rate 6.25e-5 and ε = 1.5625e-4 (A.3); ε-greedy exploration annealed linearly 0.1 → 0.01
over the first 1e5 actor steps.

Rewards are not part of a transition: the caller passes the rewards of the batch's first n
observations, computed by the reward model each time the batch is drawn (A.3: "Importantly, each
time a batch is sampled from the buffer for learning, the reward values corresponding to the batch
are computed using the reward model").  A batch (from ``replay.PrioritizedReplay.sample``) has
``obs [B, n+1, ...]``, ``action [B, n+1]``, ``cont [B, n]``, ``is_demo [B]`` and ``weight [B]``.

Choices the papers leave open (see BUILD_NOTES): Huber TD losses (quadratic within ±1, the usual
DQN form: at r̂'s scale, std 0.05, it is the squared loss of the paper); the importance weights
multiply the TD terms, not the supervised margin term; a transition's new priority is its 1-step
TD error; λ₃ = 1e-5 (Hester et al.).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from rlhp_jax.agents.common import check_config, is_image
from rlhp_jax.core import EnvSpec, weight_l2


@dataclasses.dataclass(frozen=True)
class DQfDConfig:
    gamma: float = 0.99  # A.3
    n_step: int = 3  # A.3: "a mix of 1- and 3-step returns"
    lr: float = 6.25e-5  # A.3: Adam learning rate 0.0000625
    adam_eps: float = 1.5625e-4  # A.3: ε = 0.00015625
    batch_size: int = 32  # A.3
    update_every: int = 4  # A.3: "learning update every 4 steps" (actor steps per learning step)
    target_update_steps: int = 8000  # A.3: target network "updated every 8000 actor steps"
    margin: float = 1.0  # A.3: "Q margin=1"
    margin_weight: float = 1.0  # λ₂, A.3: "loss weight=1"
    n_step_weight: float = 1.0  # λ₁ (Hester et al.)
    td_weight: float = 1.0  # 0 for the imitation-only setup (no reward: margin loss alone)
    l2_weight: float = 1e-5  # λ₃ (Hester et al.)
    eps_start: float = 0.1  # A.3: ε-greedy, annealed linearly ...
    eps_end: float = 0.01  # ... to 0.01 ...
    eps_decay_steps: int = 100_000  # ... during the first 1e5 actor steps
    huber_delta: float = 1.0
    hidden_sizes: tuple[int, ...] = (256, 256)  # MLP trunk for small observations
    network: str = "auto"  # "cnn" (Nature DQN), "mlp" or "auto" (by observation shape)

    def __post_init__(self):
        check_config(self, counts=("n_step", "batch_size", "update_every", "target_update_steps", "eps_decay_steps"),
                     positive=("lr", "adam_eps", "huber_delta"),
                     nonnegative=("margin", "margin_weight", "n_step_weight", "td_weight", "l2_weight"),
                     fractions=("gamma", "eps_start", "eps_end"))

    @property
    def target_period(self) -> int:
        """Learning steps between target-network copies (8000 actor steps / 4 per update)."""
        return max(1, self.target_update_steps // self.update_every)


class DuelingQNetwork(nn.Module):
    """Dueling head on the Nature-DQN trunk (frames) or an MLP trunk (vectors/small grids)."""

    num_actions: int
    network: str
    hidden_sizes: tuple[int, ...] = (256, 256)

    @nn.compact
    def __call__(self, x):
        h = x.astype(jnp.float32)
        if jnp.issubdtype(x.dtype, jnp.integer):
            h = h / 255.0
        if self.network == "cnn":
            for feat, k, s in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
                h = nn.relu(nn.Conv(feat, (k, k), strides=(s, s), padding="VALID")(h))
            h = h.reshape(h.shape[0], -1)
            value = nn.Dense(1)(nn.relu(nn.Dense(512)(h)))
            adv = nn.Dense(self.num_actions)(nn.relu(nn.Dense(512)(h)))
        else:
            h = h.reshape(h.shape[0], -1)
            for width in self.hidden_sizes:
                h = nn.relu(nn.Dense(width)(h))
            value = nn.Dense(1)(h)
            adv = nn.Dense(self.num_actions)(h)
        return value + adv - jnp.mean(adv, axis=-1, keepdims=True)


class DQfDState(struct.PyTreeNode):
    params: Any
    target_params: Any
    opt_state: Any
    updates: jax.Array  # int32 learning steps taken


# ---------------------------------------------------------------------------- the math
def n_step_return(rewards: jax.Array, cont: jax.Array, gamma: float) -> tuple[jax.Array, jax.Array]:
    """``rewards [B, n]``, ``cont [B, n]`` (step k+1 is in the same episode) ->
    (Σ_k γ^k (Π_{j<k} cont_j) r_k, γ^n Π_j cont_j): the discounted reward sum and the discount
    of the bootstrap value.  An episode's end stops the sum and removes the bootstrap."""
    n = rewards.shape[-1]
    alive = jnp.concatenate([jnp.ones_like(cont[..., :1]), jnp.cumprod(cont, axis=-1)[..., :-1]], axis=-1)
    discounts = gamma ** jnp.arange(n, dtype=jnp.float32)
    total = jnp.sum(discounts * alive * rewards, axis=-1)
    return total, (gamma ** n) * jnp.prod(cont, axis=-1)


def double_q_value(q_online_next: jax.Array, q_target_next: jax.Array) -> jax.Array:
    """Double Q-learning: the target network's value of the online network's greedy action."""
    a_star = jnp.argmax(q_online_next, axis=-1)
    return jnp.take_along_axis(q_target_next, a_star[..., None], axis=-1)[..., 0]


def large_margin_loss(q: jax.Array, expert_action: jax.Array, margin: float) -> jax.Array:
    """Hester et al.'s J_E per sample: ``max_a [Q(s,a) + l(a_E,a)] − Q(s,a_E)``, l = margin for a ≠ a_E."""
    num_actions = q.shape[-1]
    l = margin * (1.0 - jax.nn.one_hot(expert_action, num_actions))
    q_e = jnp.take_along_axis(q, expert_action[..., None], axis=-1)[..., 0]
    return jnp.max(q + l, axis=-1) - q_e


def linear_epsilon(step, start: float, end: float, decay_steps: int):
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / max(decay_steps, 1), 0.0, 1.0)
    return start + frac * (end - start)


class DQfD:
    """The agent: a config and a task -> pure functions over :class:`DQfDState`."""

    def __init__(self, spec: EnvSpec, config: DQfDConfig = DQfDConfig()):
        if not spec.discrete:
            raise ValueError(f"DQfD needs a discrete action set; {spec.name} has continuous actions. "
                             "Use --agent trpo or ppo for it.")
        self.spec = spec
        self.config = config
        network = config.network if config.network != "auto" else ("cnn" if is_image(spec) else "mlp")
        self.network = network
        self.net = DuelingQNetwork(spec.num_actions, network, tuple(config.hidden_sizes))
        self.optimizer = optax.adam(config.lr, eps=config.adam_eps)
        self.obs_dtype = jnp.uint8 if network == "cnn" else jnp.float32

    def init(self, key: jax.Array) -> DQfDState:
        params = self.net.init(key, jnp.zeros((1, *self.spec.obs_shape), self.obs_dtype))
        return DQfDState(params=params, target_params=params, opt_state=self.optimizer.init(params),
                         updates=jnp.zeros((), jnp.int32))

    def q_values(self, params, obs: jax.Array) -> jax.Array:
        """[..., *obs_shape] -> [..., A]."""
        n_obs = len(self.spec.obs_shape)
        lead = obs.shape[: obs.ndim - n_obs]
        q = self.net.apply(params, obs.reshape((-1,) + tuple(self.spec.obs_shape)))
        return q.reshape(*lead, q.shape[-1])

    def greedy(self, params, obs: jax.Array) -> jax.Array:
        return jnp.argmax(self.q_values(params, obs), axis=-1).astype(jnp.int32)

    def act(self, params, obs: jax.Array, key: jax.Array, epsilon) -> jax.Array:
        """ε-greedy actions for a batch of observations."""
        k_explore, k_action = jax.random.split(key)
        greedy = self.greedy(params, obs)
        random = jax.random.randint(k_action, greedy.shape, 0, self.spec.num_actions)
        explore = jax.random.uniform(k_explore, greedy.shape) < epsilon
        return jnp.where(explore, random, greedy).astype(jnp.int32)

    def epsilon(self, actor_steps):
        c = self.config
        return linear_epsilon(actor_steps, c.eps_start, c.eps_end, c.eps_decay_steps)

    # ------------------------------------------------------------------ learning
    def loss(self, params, target_params, batch: dict, rewards: jax.Array, margin_on: jax.Array | float = 1.0):
        """(total loss, (metrics, |1-step TD error| per sample)).  ``rewards [B, n]``."""
        c = self.config
        obs, action, cont = batch["obs"], batch["action"], batch["cont"]
        b, n1 = obs.shape[:2]
        n = n1 - 1
        q_all = self.q_values(params, obs)  # [B, n+1, A]
        q_t = jax.lax.stop_gradient(self.q_values(target_params, obs))
        q_online = jax.lax.stop_gradient(q_all)
        q0 = jnp.take_along_axis(q_all[:, 0], action[:, :1], axis=-1)[:, 0]
        # 1-step and n-step double-Q targets
        ret1, disc1 = n_step_return(rewards[:, :1], cont[:, :1], c.gamma)
        y1 = ret1 + disc1 * double_q_value(q_online[:, 1], q_t[:, 1])
        retn, discn = n_step_return(rewards[:, :n], cont[:, :n], c.gamma)
        yn = retn + discn * double_q_value(q_online[:, n], q_t[:, n])
        td1 = jax.lax.stop_gradient(y1) - q0
        tdn = jax.lax.stop_gradient(yn) - q0
        w = batch["weight"]
        huber = lambda x: optax.huber_loss(x, delta=c.huber_delta)
        j_dq = jnp.mean(w * huber(td1))
        j_n = jnp.mean(w * huber(tdn))
        is_demo = batch["is_demo"].astype(jnp.float32)
        margin = large_margin_loss(q_all[:, 0], action[:, 0], c.margin)
        j_e = jnp.sum(is_demo * margin) / jnp.maximum(jnp.sum(is_demo), 1.0)
        j_l2 = weight_l2(params)
        total = c.td_weight * (j_dq + c.n_step_weight * j_n) + c.margin_weight * margin_on * j_e + c.l2_weight * j_l2
        expert_agree = jnp.sum(is_demo * (jnp.argmax(q_online[:, 0], -1) == action[:, 0])) \
            / jnp.maximum(jnp.sum(is_demo), 1.0)
        metrics = dict(loss=total, td_loss=j_dq, n_step_loss=j_n, margin_loss=j_e, q_mean=jnp.mean(q0),
                       demo_fraction=jnp.mean(is_demo), demo_action_accuracy=expert_agree)
        return total, (metrics, jnp.abs(td1))

    def update(self, state: DQfDState, batch: dict, rewards: jax.Array, margin_on: jax.Array | float = 1.0):
        """One Adam step; copies the online network into the target every ``target_period``
        steps.  Returns (state, metrics, |δ| [B] for the new priorities)."""
        grads, (metrics, td_abs) = jax.grad(self.loss, has_aux=True)(state.params, state.target_params, batch,
                                                                     rewards, margin_on)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        n_updates = state.updates + 1
        copy = (n_updates % self.config.target_period) == 0
        target = jax.tree.map(lambda p, t: jnp.where(copy, p, t), params, state.target_params)
        return DQfDState(params=params, target_params=target, opt_state=opt_state, updates=n_updates), metrics, td_abs


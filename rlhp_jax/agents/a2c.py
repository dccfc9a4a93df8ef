"""Advantage actor-critic, the synchronous A3C (Mnih et al. 2016), as pure, jitted JAX functions.

Christiano et al. 2017, appendix A.2, train their Atari policies with A2C: "the A3C algorithm
(Mnih et al., 2016) in synchronous form (A2C), with policy architecture as described in Mnih
et al. (2015)", entropy bonus β = 0.01, learning rate 7e-4 decayed linearly to zero after 80
million timesteps, n = 5 steps per update, N = 16 parallel workers, γ = 0.99, optimizer with
α = 0.99 and ε = 1e-5.  Those are the :class:`A2CConfig` defaults.

One update = one gradient step on one rollout of ``num_envs × num_steps`` steps.  The critic's
targets are n-step returns bootstrapped from ``rollout.last_value`` and cut at
``rollout.boundary`` (:func:`compute_gae` with λ = 1); the policy gradient uses the raw
advantage ``R − V`` (no normalization, as in A2C).  Like PPO, the agent learns only from
``obs``, ``action``, ``boundary``, ``valid`` and the reward array given to :meth:`A2C.update`;
steps with ``valid=False`` (envpool's deferred resets) are left out of every average and
count as reward 0 in the returns of the steps before them (see :meth:`A2C.targets`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from rlhp_jax.agents.common import ActorCriticAgent, AgentState, check_config, compute_gae, weighted_mean
from rlhp_jax.core import EnvSpec
from rlhp_jax.core import Rollout


@dataclasses.dataclass(frozen=True)
class A2CConfig:
    num_envs: int = 16  # A.2: "N = 16 parallel workers"
    num_steps: int = 5  # A.2: "n = 5 steps per update" (batch = num_envs * num_steps = 80)
    gamma: float = 0.99  # A.2: "discount rate γ = 0.99"
    ent_coef: float = 0.01  # A.2: "an entropy bonus of β = 0.01"
    lr: float = 7e-4  # A.2: "learning rate of 0.0007 ..."
    # A.2: "... decayed linearly to reach zero after 80 million timesteps (although runs were
    # actually trained for only 50 million timesteps)": the decay counts environment steps
    # (updates × batch_size) and does not depend on the run's length.  None: constant lr.
    lr_decay_steps: int | None = 80_000_000
    vf_coef: float = 0.5  # value-loss coefficient (the standard A2C setting; A.2: "standard settings")
    max_grad_norm: float = 0.5  # global gradient-norm clip (standard A2C setting)
    # A.2 writes "policy gradient using Adam with α = 0.99 and ε = 1e-5"; α is no Adam
    # parameter: those are the RMSProp settings of OpenAI baselines' A2C (decay 0.99, eps 1e-5),
    # so the default is optax.rmsprop(decay=0.99, eps=1e-5).  "adam": optax.adam(eps=1e-5).
    optimizer: str = "rmsprop"
    rms_decay: float = 0.99  # A.2's α: RMSProp's squared-gradient decay
    eps: float = 1e-5  # A.2's ε (RMSProp: inside the square root; Adam: outside)
    hidden_sizes: tuple[int, ...] = (64, 64)  # MLP widths (separate actor and critic trunks)
    activation: str = "tanh"  # a flax.linen activation (common.ACTIVATIONS), e.g. "tanh", "relu"
    log_std_init: float = 0.0  # initial log-std, in units of half the action range (continuous)
    # "mlp", "cnn" (Nature DQN, for frames; A.2: "policy architecture as described in Mnih et al.
    # (2015)") or "auto" (by observation shape)
    network: str = "auto"

    def __post_init__(self):
        check_config(self, counts=("num_envs", "num_steps", "lr_decay_steps"), positive=("lr", "max_grad_norm", "eps"),
                     nonnegative=("ent_coef", "vf_coef"), fractions=("gamma", "rms_decay"))
        if self.optimizer not in ("rmsprop", "adam"):
            raise ValueError(f"optimizer must be 'rmsprop' or 'adam', got {self.optimizer!r}")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps


# Per-task presets.  Appendix A.2's settings are the defaults and serve every task without an
# entry (the Atari games in particular); no classic-control task has been tuned for A2C yet
# (PPO is the agent for those, see ppo.PRESETS).
PRESETS: dict[str, A2CConfig] = {}


def preset(env_name: str) -> A2CConfig:
    """The tuned config for ``env_name``, or appendix A.2's defaults when there is none."""
    return PRESETS.get(env_name, A2CConfig())


class A2C(ActorCriticAgent):
    """A2C for one :class:`EnvSpec`. All methods are pure; jit them (they are jit-friendly)."""

    def __init__(self, spec: EnvSpec, config: A2CConfig = A2CConfig(), total_updates: int | None = None):
        self.config = config  # (total_updates: interface parity with PPO; the lr decay ignores it)
        # One gradient step per update, so the optimizer's step count is the update count.
        if config.optimizer == "rmsprop":
            opt = optax.rmsprop(self.lr_schedule, decay=config.rms_decay, eps=config.eps)
        else:
            opt = optax.adam(self.lr_schedule, eps=config.eps)
        self.tx = optax.chain(optax.clip_by_global_norm(config.max_grad_norm), opt)
        super().__init__(spec, config, total_updates)

    def lr_schedule(self, step) -> jax.Array:
        """Learning rate after ``step`` updates: ``lr · max(0, 1 − step·batch_size / lr_decay_steps)``
        (A.2: linear decay to zero at ``lr_decay_steps`` environment steps)."""
        cfg = self.config
        lr = jnp.asarray(cfg.lr, jnp.float32)
        if cfg.lr_decay_steps is None:
            return lr
        env_steps = jnp.asarray(step, jnp.float32) * cfg.batch_size
        return lr * jnp.clip(1.0 - env_steps / cfg.lr_decay_steps, 0.0, 1.0)

    def targets(self, rollout: Rollout, rewards: jax.Array) -> tuple[jax.Array, jax.Array]:
        """``(advantages, returns)`` [T, N]: n-step returns bootstrapped from ``last_value`` and
        cut at ``boundary`` (GAE with λ = 1), advantages ``R − V(obs)``.  Invalid steps (envpool's
        deferred resets) are transparent: whatever their reward and value, they are skipped."""
        return compute_gae(rewards, rollout.value, rollout.boundary, rollout.last_value, self.config.gamma, 1.0,
                           rollout.valid)

    def _loss(self, params, batch):
        """A2C loss averaged over the steps with ``valid`` set (a deferred-reset step's action
        was ignored by the environment, so it carries no information about the policy)."""
        obs, action, adv, target, valid = batch
        wmean = weighted_mean(valid)
        dist, value = self.pi.forward(params, obs)
        logp = self.pi.log_prob(dist, action)
        pg_loss = -wmean(jax.lax.stop_gradient(adv) * logp)
        # Mean squared error (no ½), weighted by vf_coef = 0.5 as in the standard A2C.
        v_loss = wmean((value - jax.lax.stop_gradient(target)) ** 2)
        entropy = wmean(self.pi.entropy(dist))
        loss = pg_loss + self.config.vf_coef * v_loss - self.config.ent_coef * entropy
        return loss, dict(policy_loss=pg_loss, value_loss=v_loss, entropy=entropy)

    def update(self, state: AgentState, rollout: Rollout, rewards: jax.Array, key: jax.Array):
        """One A2C update (one gradient step) from a rollout and its rewards [T, N].
        Returns (state, metrics).  ``key`` is unused (A2C is deterministic given the rollout)."""
        del key
        adv, target = self.targets(rollout, rewards)
        valid = rollout.valid
        batch = (rollout.obs, rollout.action, adv, target, valid)
        (_, metrics), grads = jax.value_and_grad(self._loss, has_aux=True)(state.params, batch)
        updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        wmean = weighted_mean(valid)
        resid = target - rollout.value
        var = lambda x: wmean(jnp.square(x - wmean(x)))
        metrics["grad_norm"] = optax.global_norm(grads)
        metrics["lr"] = self.lr_schedule(state.step)
        metrics["value_target_mean"] = wmean(target)
        metrics["explained_var"] = 1.0 - var(resid) / (var(target) + 1e-8)
        return AgentState(params=params, opt_state=opt_state, step=state.step + 1), metrics

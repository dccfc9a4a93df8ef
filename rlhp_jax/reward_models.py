"""Reward predictors r̂(o, a) (layer 2).

* ``RewardMLP`` — Christiano et al. 2017, appendix A.1: two hidden layers of 64 units with
  leaky ReLU (α = 0.01); input the observation and the action (one-hot when discrete).
* ``RewardCNN`` — appendix A.2 (and Ibarz et al. 2018, A.3): 84×84×4 stacked frames through four
  convolutions 7×7/5×5/3×3/3×3 with strides 3/2/1/1 and 16 filters each, leaky ReLU, batch norm
  and (per-channel) dropout on every convolution, a dense layer of 64 and a scalar output.  The
  action is not an input (Ibarz A.3: it did not help).

Both have the same call signature ``module.apply(variables, obs, action, train=..., rngs=...)``
and return one reward per input row, so the ensemble learner treats them alike; batch-norm
statistics (CNN only) live in the ``batch_stats`` collection.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlhp_jax.core import conv_general_dilated
from rlhp_jax.tasks import TASKS, Mirror, find


class RewardMLP(nn.Module):
    """Appendix A.1 predictor: MLP 2×64, leaky ReLU 0.01, inputs (obs, action).

    With a ``mirror`` (the task's reflection, :class:`rlhp_jax.tasks.Mirror`; ours, not the
    paper's) it returns the mean of the MLP on a step and on its mirror image, so r̂ pays a state
    and its reflection alike and has no slope along a feature the reflection negates (BUILD_NOTES,
    "the README's CartPole job").  ``obs`` is then standardized so that the reflection commutes
    with the standardization (``RewardEnsemble.update_input_statistics``)."""

    num_actions: int
    discrete: bool
    hidden: Sequence[int] = (64, 64)
    negative_slope: float = 0.01
    use_action: bool = True
    mirror: Mirror | None = None

    @nn.compact
    def __call__(self, obs, action, train: bool = False):
        layers = [nn.Dense(width) for width in self.hidden]
        out = nn.Dense(1)

        def mlp(x, a):
            if self.use_action:
                if self.discrete:
                    a = jax.nn.one_hot(a.reshape(a.shape[0]), self.num_actions)
                else:
                    a = a.reshape(a.shape[0], -1).astype(jnp.float32)
                x = jnp.concatenate([x, a], axis=-1)
            for layer in layers:
                x = nn.leaky_relu(layer(x), self.negative_slope)
            return out(x)[:, 0]

        x = obs.reshape(obs.shape[0], -1).astype(jnp.float32)
        if self.mirror is None:
            return mlp(x, action)
        x_m, a_m = mirror_step(self.mirror, x, action)
        both = mlp(jnp.concatenate([x, x_m]), jnp.concatenate([action, a_m]))  # one pass of twice the rows
        return 0.5 * (both[:x.shape[0]] + both[x.shape[0]:])


def mirror_step(mirror: Mirror, obs, action):
    """The mirror image of flat rows of (observation, action): ``[N, D]``, ``[N]`` or ``[N, A]``."""
    if mirror.obs_index is not None:
        obs = obs[:, jnp.asarray(mirror.obs_index)]
    obs = obs * jnp.asarray(mirror.obs_sign, obs.dtype)
    if mirror.action_index is not None:
        return obs, jnp.asarray(mirror.action_index)[action]
    return obs, action * jnp.asarray(mirror.action_sign, jnp.float32).reshape((1,) * (action.ndim - 1) + (-1,))


class RewardCNN(nn.Module):
    """Appendix A.2 predictor for 84×84×4 uint8 frames (the action is ignored)."""

    filters: int = 16
    kernels: Sequence[int] = (7, 5, 3, 3)
    strides: Sequence[int] = (3, 2, 1, 1)
    dense: int = 64
    dropout_rate: float = 0.5  # A.2: "dropout with α = 0.5"; Ibarz A.3 uses per-channel 0.2 drop
    batch_norm_momentum: float = 0.99  # Ibarz A.3: batch-norm decay 0.99
    negative_slope: float = 0.01

    @nn.compact
    def __call__(self, obs, action=None, train: bool = False):
        x = obs.astype(jnp.float32)
        if jnp.issubdtype(obs.dtype, jnp.integer):
            x = x / 255.0
        for k, s in zip(self.kernels, self.strides):
            x = nn.Conv(self.filters, (k, k), strides=(s, s), padding="VALID", conv_general_dilated=conv_general_dilated)(x)
            x = nn.BatchNorm(use_running_average=not train, momentum=self.batch_norm_momentum)(x)
            # per-channel dropout: one mask per feature map, shared over the spatial axes
            x = nn.Dropout(self.dropout_rate, broadcast_dims=(1, 2), deterministic=not train)(x)
            x = nn.leaky_relu(x, self.negative_slope)
        x = x.reshape(x.shape[0], -1)
        x = nn.leaky_relu(nn.Dense(self.dense)(x), self.negative_slope)
        return nn.Dense(1)(x)[:, 0]


@dataclasses.dataclass(frozen=True)
class RewardModelSpec:
    """Which predictor to build, and the shapes it sees."""

    kind: str  # "mlp" or "cnn"
    obs_shape: tuple[int, ...]
    action_shape: tuple[int, ...]
    action_dtype: str  # "int32" or "float32"
    num_actions: int
    discrete: bool
    dropout_rate: float = 0.5  # CNN only: Christiano A.2 drops 0.5; Ibarz A.3 keeps 0.8 (drops 0.2)
    mirror: Mirror | None = None  # the task's reflection, if it has one (``tasks.Task.mirror``)
    task: str = ""  # the task's name, for messages

    def build(self, mirrored: bool = False, use_action: bool = True) -> nn.Module:
        """The predictor; ``mirrored``: invariant to the task's reflection (``EnsembleConfig.mirror``);
        ``use_action`` False: the MLP reads the observation alone (the CNN never reads the action)."""
        if mirrored and (self.kind != "mlp" or self.mirror is None):
            raise ValueError(f"--ensemble.mirror needs a task with a declared reflection and the MLP reward model; "
                             f"{self.task or 'this task'} has none (tasks with one: "
                             f"{', '.join(mirrored_tasks())})")
        if self.kind == "mlp":
            return RewardMLP(num_actions=self.num_actions, discrete=self.discrete,
                             mirror=self.mirror if mirrored else None, use_action=use_action)
        if self.kind == "cnn":
            return RewardCNN(dropout_rate=self.dropout_rate)
        raise ValueError(f"Unknown reward model kind {self.kind!r}; use 'mlp' or 'cnn'.")

    def dummy_inputs(self, batch: int = 2):
        obs_dtype = jnp.uint8 if self.kind == "cnn" else jnp.float32
        obs = jnp.zeros((batch, *self.obs_shape), obs_dtype)
        act = jnp.zeros((batch, *self.action_shape), jnp.dtype(self.action_dtype))
        return obs, act


def reward_model_spec_for(env_spec, kind: str | None = None, next_obs: bool = False) -> RewardModelSpec:
    """The paper's predictor for an environment: the A.2 CNN for image observations large enough
    for its four VALID convolutions (at least 43×43: Atari's 84×84), the A.1 MLP otherwise
    (vectors, and small grids such as MinAtar's 10×10).  ``next_obs`` (``EnsembleConfig.next_obs``,
    ours): the MLP sees each step's observation and the next side by side
    (``rollout.transition_obs``), 2·D features of a D-feature vector task, and the task's
    reflection acts on both halves."""
    if kind is None:
        shape = tuple(env_spec.obs_shape)
        kind = "cnn" if len(shape) == 3 and min(shape[:2]) >= 43 else "mlp"
    task = find(env_spec.name)
    vector = len(env_spec.obs_shape) == 1
    mirror = task.mirror if task is not None and vector else None
    obs_shape = tuple(env_spec.obs_shape)
    if next_obs:
        if kind != "mlp" or not vector:
            raise ValueError(f"--ensemble.next-obs needs vector observations and the MLP reward model; "
                             f"{env_spec.name}'s observations are {obs_shape} ({kind} reward model)")
        obs_shape = (2 * obs_shape[0],)
        mirror = None if mirror is None else transition_mirror(mirror)
    return RewardModelSpec(
        mirror=mirror,
        task=env_spec.name,
        kind=kind,
        obs_shape=obs_shape,
        action_shape=tuple(env_spec.action_shape),
        action_dtype="int32" if env_spec.discrete else "float32",
        num_actions=env_spec.num_actions,
        discrete=env_spec.discrete,
    )


def transition_mirror(mirror: Mirror) -> Mirror:
    """A task's reflection acting on ``[o_t, o_{t+1}]``: the same reflection on each half."""
    d = len(mirror.obs_sign)
    index = None if mirror.obs_index is None else tuple(mirror.obs_index) + tuple(i + d for i in mirror.obs_index)
    return dataclasses.replace(mirror, obs_sign=tuple(mirror.obs_sign) * 2, obs_index=index)


def mirrored_tasks() -> list[str]:
    """The tasks whose reflection ``--ensemble.mirror`` can use."""
    return sorted(name for name, task in TASKS.items() if task.mirror is not None)

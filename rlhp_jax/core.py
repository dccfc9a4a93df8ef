"""Plain data types every layer shares (layer 0): a task's static description, one batched
environment step, a rollout, the environment and policy protocols, and the small helpers
that go with them.  No logic of the method lives here; see docs/DESIGN.md for the layers.

The agent-facing rules of Christiano et al. 2017, appendix A, are in what these types carry: the
agent learns only from ``obs``, ``action``, ``boundary`` and ``valid`` and a reward passed in
beside the rollout; ``true_reward``, ``terminated``, ``raw_reward`` and ``render`` are for the
synthetic oracle, the metrics and the clips.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Protocol

import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """Static description of a task, as the agent, the reward model and the teacher need it."""

    name: str
    obs_shape: tuple[int, ...]
    discrete: bool
    num_actions: int  # number of discrete actions, or the action dimension when continuous
    action_low: tuple[float, ...] | None  # continuous bounds, None when discrete
    action_high: tuple[float, ...] | None
    horizon: int  # fixed episode length the agent experiences
    terminal_penalty: float  # added to the true reward when the underlying task terminates
    segment_length: int  # default clip length for queries (about 1.5 s of simulated time)
    reward_std: float  # default std of the normalized predicted reward (Christiano A.1: 1)
    on_terminate: str = "reset"  # "continue" (penalty per step out of range) or "reset" (penalty once)

    @property
    def action_shape(self) -> tuple[int, ...]:
        return () if self.discrete else (self.num_actions,)

    @property
    def action_dtype(self):
        return jnp.int32 if self.discrete else jnp.float32


class StepOut(NamedTuple):
    """What one batched step returns. Leading axis: environments."""

    obs: jax.Array  # observation after the step (after a silent or boundary reset)
    true_reward: jax.Array  # task reward incl. terminal penalty: oracle and metrics only
    terminated: jax.Array  # the task left its healthy range on this step (would have ended): oracle/metrics only
    boundary: jax.Array  # fixed-horizon episode boundary: the only end the agent sees
    raw_reward: jax.Array  # the unmodified task reward (no penalty), for evaluation
    valid: jax.Array  # False on a step that is no real transition (envpool's deferred reset): never in a segment
    render: jax.Array  # [num_envs, R] float32 extra per-step data a clip renderer needs (R may be 0)


class VecEnv(Protocol):
    spec: EnvSpec
    num_envs: int

    def reset(self, key: jax.Array) -> tuple[Any, jax.Array]: ...

    def step(self, key: jax.Array, state: Any, action: jax.Array) -> tuple[Any, StepOut]: ...


# policy_fn(params, obs [N, *obs_shape], key) -> (action, log_prob [N], value [N])
PolicyFn = Callable[[Any, jax.Array, jax.Array], tuple[jax.Array, jax.Array, jax.Array]]


class Rollout(NamedTuple):
    """``num_steps`` steps of ``num_envs`` environments. Leading axes: [T, N].

    ``action`` is the policy's sample as drawn (for continuous tasks *before* clipping, so that
    ``log_prob`` refers to it); the environment received ``clip_action(spec, action)``.
    ``obs[t]`` is the observation the action was taken in; after a step with ``boundary`` (or a
    silent task reset) the next observation is already the fresh episode's first one.
    """

    obs: jax.Array  # [T, N, *obs_shape] float32
    action: jax.Array  # [T, N] int32 (discrete) or [T, N, act_dim] float32 (continuous)
    log_prob: jax.Array  # [T, N] log-prob of ``action`` under the behaviour policy
    value: jax.Array  # [T, N] value estimate of ``obs``
    boundary: jax.Array  # [T, N] bool, fixed-horizon episode ended with this step
    true_reward: jax.Array  # [T, N] task reward incl. terminal penalty (oracle / metrics only)
    terminated: jax.Array  # [T, N] bool, underlying task terminated (oracle / metrics only)
    raw_reward: jax.Array  # [T, N] unmodified task reward (metrics only)
    valid: jax.Array  # [T, N] bool, False on envpool's deferred-reset steps (action ignored)
    render: jax.Array  # [T, N, R] extra per-step data for rendering clips (R may be 0)
    last_obs: jax.Array  # [N, *obs_shape] observation after the last step
    last_value: jax.Array  # [N] value estimate of ``last_obs`` (for bootstrapping)


def loop_body_is_slow(network: str, backend: str | None = None) -> bool:
    """A CPU rule for convolutions (the other: :func:`conv_general_dilated`): XLA:CPU runs a CNN's
    gradients ~20x slower inside a loop body (``lax.scan``/``lax.map``; jax-ml/jax#12868,
    BUILD_NOTES), so on CPU a ``"cnn"`` network's steps run unrolled or as a host loop over one
    compiled step.  ``network``: "cnn" or "mlp"."""
    return network == "cnn" and (backend or jax.default_backend()) == "cpu"


_NHWC = ("NHWC", "HWIO", "NHWC")


def conv_general_dilated(lhs, rhs, window_strides, padding, lhs_dilation=None, rhs_dilation=None,
                         dimension_numbers=None, feature_group_count=1, batch_group_count=1, precision=None,
                         preferred_element_type=None):
    """``jax.lax.conv_general_dilated`` (the signature ``flax.linen.Conv`` calls) whose input
    gradient, on CPU, for a strided 2-D NHWC convolution without padding, dilation or groups,
    avoids the transposed convolution.  That gradient is a convolution of the output gradient
    dilated by the stride, and XLA:CPU runs it ~12× slower than the forward pass (the A.2 reward
    CNN's 5×5 stride-2 layer: 0.200 s against 0.017 s for 800 frames; BUILD_NOTES).  Here it is
    ``s²`` stride-1 convolutions, one per phase of the input grid, interleaved: the same sums.
    Values, other backends and every other case are ``lax.conv_general_dilated``'s.  Used where it
    measured faster: the reward CNN.  Not the agents' Nature CNN (8×8/4 and 4×4/2 layers, 32 and 64
    channels), whose step it slows (80 frames forward and backward, 0.060 → 0.080 s)."""
    plain = lambda x, w: jax.lax.conv_general_dilated(
        x, w, window_strides, padding, lhs_dilation, rhs_dilation, dimension_numbers, feature_group_count,
        batch_group_count, precision, preferred_element_type)
    strides = tuple(window_strides)
    unpadded = padding == "VALID" if isinstance(padding, str) else all(tuple(p) == (0, 0) for p in padding)
    simple = (jax.default_backend() == "cpu" and lhs.ndim == 4 and len(set(strides)) == 1 and strides[0] > 1
              and unpadded and feature_group_count == 1 and batch_group_count == 1
              and all(d in (None, 1) for d in (*(lhs_dilation or ()), *(rhs_dilation or ())))
              and preferred_element_type is None
              and jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, dimension_numbers)
              == jax.lax.conv_dimension_numbers(lhs.shape, rhs.shape, _NHWC))
    if not simple:
        return plain(lhs, rhs)

    @jax.custom_vjp
    def conv(x, w):
        return plain(x, w)

    def bwd(x_w, g):  # the input's gradient phase by phase; the kernel's is XLA's own
        x, w = x_w
        return _phase_input_grad(g, w, strides[0], x.shape, precision), jax.vjp(lambda w_: plain(x, w_), w)[1](g)[0]

    conv.defvjp(lambda x, w: (plain(x, w), (x, w)), bwd)
    return conv(lhs, rhs)


def _phase_input_grad(g, w, s: int, x_shape, precision):
    """d(loss)/dx of a VALID stride-``s`` NHWC convolution from its output gradient ``g``: input
    row ``s·p + a`` takes kernel rows ``s·q + a`` against output rows ``p − q``, a stride-1 full
    convolution of ``g`` with that phase's sub-kernel, flipped."""
    n, h, wd, ci = x_shape
    ph, pw = -(-h // s), -(-wd // s)
    rows = []
    for a1 in range(s):
        cols = []
        for a2 in range(s):
            sub = w[a1::s, a2::s]  # [Q1, Q2, ci, co]
            q1, q2 = sub.shape[:2]
            if q1 == 0 or q2 == 0:
                cols.append(jnp.zeros((n, ph, pw, ci), g.dtype))
                continue
            kernel = jnp.flip(sub, (0, 1)).transpose(0, 1, 3, 2)  # [Q1, Q2, co, ci]
            d = jax.lax.conv_general_dilated(g, kernel, (1, 1), [(q1 - 1, q1 - 1), (q2 - 1, q2 - 1)],
                                             dimension_numbers=_NHWC, precision=precision)
            cols.append(jnp.pad(d, ((0, 0), (0, ph - d.shape[1]), (0, pw - d.shape[2]), (0, 0))))
        rows.append(jnp.stack(cols, axis=3))  # [N, ph, pw, s (a2), ci]
    full = jnp.stack(rows, axis=2)  # [N, ph, s (a1), pw, s (a2), ci]
    return full.reshape(n, ph * s, pw * s, ci)[:, :h, :wd]


def episode_ends(spec: EnvSpec, boundary, terminated):
    """Where the task's own episodes end (for scoring them, not for the agent): the fixed horizon
    (``boundary``), and termination where the emulator resets silently (``on_terminate="reset"``).
    NumPy or JAX arrays alike."""
    return boundary | terminated if spec.on_terminate == "reset" else boundary


def clip_action(spec: EnvSpec, action: jax.Array) -> jax.Array:
    """The action the environment receives: continuous actions clipped to the bounds."""
    if spec.discrete:
        return action
    low = jnp.asarray(spec.action_low, jnp.float32)
    high = jnp.asarray(spec.action_high, jnp.float32)
    return jnp.clip(action, low, high)


def missing_like(shapes):
    """Arrays shaped like ``shapes`` (a tree of ``jax.ShapeDtypeStruct``): NaN where floating, 0
    otherwise — the metrics of steps that did not run (a fit of 0 steps, a padded iteration)."""
    return jax.tree.map(lambda x: jnp.full(x.shape, jnp.nan if jnp.issubdtype(x.dtype, jnp.floating) else 0, x.dtype),
                        shapes)


def weight_l2(params) -> jax.Array:
    """Sum of squared weights of every kernel (matrices and conv filters; biases excluded): the
    L2 penalty of the reward model (Christiano §2.2.3) and of DQfD (Hester et al., λ₃)."""
    leaves = [p for p in jax.tree.leaves(params) if p.ndim > 1]
    return sum(jnp.sum(jnp.square(p)) for p in leaves) if leaves else jnp.zeros(())


def sample_indices(key: jax.Array, counts: jax.Array, n: int) -> jax.Array:
    """``n`` indices into ``counts`` [K], index i with probability counts[i] / Σ counts, drawn
    independently: an inverse-CDF draw (integer cumulative sum, uniform integers, binary search),
    O(K + n log K).  ``counts`` are non-negative whole numbers of any dtype (masks, bootstrap
    counts); all zero: uniform over all K.  ``jax.random.categorical(key, log counts, shape=(n,))``
    has the same distribution but draws n × K Gumbel variates: 640 clip starts among 4,160 steps
    cost 84 ms on a 2-core CPU against 0.35 ms here (BUILD_NOTES, "Drawing clips and batches")."""
    c = jnp.asarray(counts)
    c = (jnp.round(c) if jnp.issubdtype(c.dtype, jnp.floating) else c).astype(jnp.int32)
    c = jnp.where(jnp.sum(c) > 0, c, 1)
    cum = jnp.cumsum(c)
    u = jax.random.randint(key, (n,), 0, cum[-1])
    return jnp.searchsorted(cum, u, side="right").astype(jnp.int32)

"""The papers' benchmarks on envpool (layer 3): Atari (ALE) and MuJoCo, behind ``core.VecEnv``.

Same protocol as the gymnax backend (``state, obs = env.reset(key)``; ``state, out =
env.step(key, state, action)`` inside ``jax.jit``/``lax.scan``), with the modifications of
Christiano et al. 2017, appendix A, and Ibarz et al. 2018, appendix A.1:

Atari
  84×84 grayscale, frame skip 4 with max-pooling over the last two frames, a stack of 4 (given
  to the agent channel-last, ``[84, 84, 4]``), 0–30 no-ops at reset (``noop_max=90`` for
  Ibarz), no sticky actions, minimal or full (``full_action_space=True``, Ibarz) action set, and
  no FIRE pressed at reset (``use_fire_reset=False``: not among Mnih et al.'s wrappers that both
  papers cite; the policy launches the ball itself).
  The score area (and BeamRider's enemy-ship count, Enduro's speedometer) is black in every
  frame the agent or a person sees (``atari_masks``).  Life loss and game over are never sent
  to the agent: ``boundary`` is always False and the emulator resets silently.  For the
  synthetic oracle, ``true_reward`` = the game reward (clipped to [-1, 1] when
  ``clip_oracle_reward``: Christiano A.2; Ibarz's oracle compares the real score,
  ``config.IBARZ_ORACLE``) plus ``terminal_penalty`` on the step the game ends — in every game
  but Pong, whose penalty is 0.
  People see native colour (``render.atari``): a run labeled by people passes
  ``native_frames``, a ``render.atari.NativeFrames`` ring, and the wrapper hands it envpool's
  ``render()`` (the emulator's 210×160 RGB screen) after reset and after every step, through one
  ordered ``io_callback``; each step's ``render`` columns then name the frame the agent acted
  on.  Without it (the agent's own and the synthetic oracle's runs) none of this is compiled in.

MuJoCo (Christiano A.1)
  Control costs are removed (``ctrl_cost_weight=0``); nothing else of the task's reward is
  changed.  (Ant's contact cost stays as envpool's Ant-v4 has it: like gym v4's, it leaves
  contact forces out unless ``use_contact_force``, so the term is 0.)  No task ends when it
  leaves its healthy range: Hopper, Walker2d and Ant run on (``terminate_when_unhealthy=False``),
  the two pendulums get a healthy range envpool never reaches (the pole lies at its hinge
  limit, the double pendulum can be swung back up, as appendix B's instructions to people
  describe), and every episode lasts the full time limit.  On every step outside the range
  the true reward scores minus the alive bonus: ``terminal_penalty`` is added (Hopper,
  Walker2d and Ant withhold the bonus themselves, so -1; InvertedPendulum -2 and
  InvertedDoublePendulum -20, whose envpool reward keeps its bonus of 1 and 10).  ``boundary`` marks only the fixed time limit.
  A.1 does not say what the penalty is.  ``penalty_shape="height"`` (Hopper, Walker2d, Ant) takes
  the paper's public code's instead (OpenAI's rl-teacher, 2017): the alive bonus on every step
  plus the torso's height above a standing height (``tasks.MujocoModel.standing_height``), so a
  fallen robot is paid less in proportion to how low it lies, and no constant penalty
  (``terminal_penalty`` 0: no fall diagnostics).  It is the default where the task's row says so
  (``tasks.MujocoModel.penalty_shape``: Hopper and Walker2d, where the range penalty was measured
  to fail); ``penalty_shape="range"`` asks for the range penalty.  ``episode_steps`` sets the time
  limit (default: the task's, gym's 1000 but for Reacher's 50 and the pendulums' 25 and 50, the
  public code's, so each episode starts upright again), up to gym's own; a clip is cut to one
  episode where 1.5 s would not fit.

Both
  envpool resets lazily: the step after an episode end is a *deferred reset* that ignores the
  action and returns the new episode's first observation with reward 0.  It is flagged
  ``StepOut.valid = False`` and must never enter a segment or an agent's loss.

Stepping: ``backend="xla"`` (default) steps through envpool's XLA custom call inside the
compiled program; ``backend="callback"`` calls envpool's C++ ``step`` from the program through
``jax.experimental.io_callback`` (slower: ~50 µs of callback overhead per batched step, see
``BUILD_NOTES.md``).  envpool's MuJoCo XLA step demands float64 actions: x64 is switched on
only around that one call (``jax.enable_x64``), the rest of the program stays float32.  The
XLA interface itself must be created under x64 too (see ``__init__``).

Each task's own values (envpool id, MuJoCo options, penalties, clip length, r̂ std) are its row of
``tasks.TASKS``; this module holds what is common to a backend, and the healthy ranges (``healthy``).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rlhp_jax import tasks
from rlhp_jax.core import EnvSpec, StepOut


PENALTY_SHAPES = ("range", "height")
ALIVE_BONUS = 1.0  # gym v4's healthy_reward on Hopper, Walker2d and Ant (envpool's default)


def option_defaults(name: str) -> dict[str, Any]:
    """The MuJoCo options whose default is the task's own (its row of ``tasks.TASKS``): what a run
    that names none of them gets.  A run that names one at its default value is the same run."""
    entry = tasks.find(name)
    if entry is None or entry.backend != "mujoco":
        return {}
    return dict(penalty_shape=entry.mujoco.penalty_shape, episode_steps=entry.horizon)


def healthy(task: str, obs) -> jax.Array:
    """Gym v4's healthy range, from the observation (which excludes the root x position).

    [N, obs_dim] -> [N] bool (jit-safe; numpy input works too).  Tasks without a healthy range
    are always healthy.
    """
    obs = jnp.asarray(obs)
    finite = jnp.all(jnp.isfinite(obs), axis=-1)
    if task == "Hopper":  # obs = qpos[1:] (z, angle, 3 joints), qvel (6)
        z, angle = obs[..., 0], obs[..., 1]
        return (finite & jnp.all(jnp.abs(obs[..., 1:]) < 100.0, axis=-1) & (z > 0.7)
                & (angle > -0.2) & (angle < 0.2))
    if task == "Walker2d":
        z, angle = obs[..., 0], obs[..., 1]
        return finite & (z > 0.8) & (z < 2.0) & (angle > -1.0) & (angle < 1.0)
    if task == "Ant":  # obs[0] = torso z
        z = obs[..., 0]
        return finite & (z >= 0.2) & (z <= 1.0)
    if task == "InvertedPendulum":  # obs = qpos (cart x, pole angle), qvel
        return finite & (jnp.abs(obs[..., 1]) <= 0.2)
    if task == "InvertedDoublePendulum":  # obs = x, sin q1, sin q2, cos q1, cos q2, ...; tip height
        q1 = jnp.arctan2(obs[..., 1], obs[..., 3])
        q2 = jnp.arctan2(obs[..., 2], obs[..., 4])
        y = 0.6 * jnp.cos(q1) + 0.6 * jnp.cos(q1 + q2)
        return finite & (y > 1.0)
    return finite


def _to_32(x):
    if x.dtype == jnp.float64:
        return x.astype(jnp.float32)
    if x.dtype == jnp.int64:
        return x.astype(jnp.int32)
    return x


@struct.dataclass
class EnvpoolState:
    token: jax.Array  # envpool's XLA handle, or a step counter for the callback backend
    was_out: jax.Array  # [N] bool, MuJoCo: outside the healthy range after the previous step


class EnvpoolVecEnv:
    """A batch of envpool environments with the papers' modifications; see the module docstring.

    ``pool`` is envpool's own environment and ``xla_ops`` its XLA handle and step (None on the
    Python backend): for benchmarks that time the wrapper against envpool alone."""

    def __init__(self, name: str, num_envs: int, seed: int = 0, backend: str = "auto",
                 num_threads: int = 0, **overrides: Any):
        import envpool  # local: heavy import, and only needed for these tasks

        entry = tasks.find(name)
        if entry is None or entry.backend == "gymnax":
            raise ValueError(f"Unknown environment {name!r}. Supported envpool tasks: "
                             f"{', '.join(tasks.names('atari') + tasks.names('mujoco'))}.")
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.entry = entry  # the task's row of tasks.TASKS
        self.domain, self.task = entry.backend, entry.name
        self.num_envs = int(num_envs)
        if backend not in ("auto", "xla", "callback"):
            raise ValueError(f"backend must be 'auto', 'xla' or 'callback', got {backend!r}")
        common = dict(env_type="gymnasium", num_envs=self.num_envs, batch_size=self.num_envs, seed=int(seed),
                      num_threads=int(num_threads))
        if self.domain == "atari":
            opts = dict(
                noop_max=int(overrides.pop("noop_max", 30)),  # Christiano A.2; Ibarz A.1: 90
                full_action_space=bool(overrides.pop("full_action_space", False)),  # Ibarz: all 18
                # A.2 clips to [-1, 1]; Ibarz's runs pass False (config.IBARZ_ORACLE)
                clip_oracle_reward=bool(overrides.pop("clip_oracle_reward", True)),
                terminal_penalty=float(overrides.pop("terminal_penalty", entry.terminal_penalty)),
                segment_length=int(overrides.pop("segment_length", entry.segment_length)),
                reward_std=float(overrides.pop("reward_std", entry.reward_std)),
            )
            # people's clips: a render.atari.NativeFrames ring for the emulator's colour frames (runs
            # labeled by people); None: none kept, no render mode, no callback
            self.native_frames = overrides.pop("native_frames", None)
            if overrides:
                raise ValueError(f"Unknown Atari options {sorted(overrides)}")
            if self.native_frames is not None and self.native_frames.num_envs != self.num_envs:
                raise ValueError(f"native_frames holds {self.native_frames.num_envs} environments, not {self.num_envs}")
            self.options = opts
            # every option the papers fix is set explicitly (envpool's defaults change between versions)
            self.envpool_id = entry.envpool_id
            self.envpool_kwargs = dict(
                common, img_height=84, img_width=84, gray_scale=True, stack_num=4, frame_skip=4,
                noop_max=opts["noop_max"], repeat_action_probability=0.0, episodic_life=False,
                zero_discount_on_life_loss=False, reward_clip=False, full_action_space=opts["full_action_space"],
                use_fire_reset=False, max_episode_steps=entry.horizon)
            # render() returns the emulator's screen; the observations are the same with it or without
            render_mode = {} if self.native_frames is None else dict(render_mode="rgb_array")
            self.pool = envpool.make(self.envpool_id, **self.envpool_kwargs, **render_mode)
            n_act = int(self.pool.action_space.n)
            from rlhp_jax import atari_masks

            self._mask = np.asarray(atari_masks.boolean_mask(self.task, 84, 84))  # [84, 84] bool: True = blank
            self.score_mask = self._mask  # what every frame has blanked (demos are checked against it)
            self.spec = EnvSpec(name=self.task, obs_shape=(84, 84, 4), discrete=True, num_actions=n_act,
                                action_low=None, action_high=None, horizon=entry.horizon,
                                terminal_penalty=opts["terminal_penalty"], segment_length=opts["segment_length"],
                                reward_std=opts["reward_std"], on_terminate=entry.on_terminate)
            self.render_fields: tuple[str, ...] = tuple(self.native_frames.FIELDS) if self.native_frames else ()
            self.backend = "xla" if backend == "auto" else backend
        else:
            defaults = option_defaults(entry.name)
            shape = overrides.pop("penalty_shape", defaults["penalty_shape"])
            if shape not in PENALTY_SHAPES:
                raise ValueError(f"penalty_shape must be one of {PENALTY_SHAPES}, got {shape!r}")
            if shape == "height":
                if entry.mujoco.standing_height is None:
                    with_height = [t.name for t in tasks.TASKS.values()
                                   if t.mujoco is not None and t.mujoco.standing_height is not None]
                    raise ValueError(f"penalty_shape='height' needs a standing height: {', '.join(with_height)} "
                                     f"have one, {self.task} has not")
                if "terminal_penalty" in overrides:
                    raise ValueError(f"penalty_shape='height' ({self.task}'s default) has no per-step penalty: drop "
                                     "terminal_penalty, or ask for the range penalty: ('penalty_shape', 'range')")
            # the height shape pays no constant penalty: its height term takes the range's place
            penalty = 0.0 if shape == "height" else float(overrides.pop("terminal_penalty", entry.terminal_penalty))
            # the time limit: the task's (``tasks.TASKS``; the pendulums' are the paper's public code's,
            # 25 and 50 steps), up to gym's own; a clip never spans two episodes, so it is cut to one
            horizon = overrides.pop("episode_steps", defaults["episode_steps"])
            gym_steps = int(envpool.make_spec(entry.envpool_id).config.max_episode_steps)
            if isinstance(horizon, bool) or not isinstance(horizon, (int, np.integer)) or not 2 <= horizon <= gym_steps:
                raise ValueError(f"episode_steps must be a whole number from 2 to gym's {gym_steps} for {self.task}, "
                                 f"got {horizon!r}")
            horizon = int(horizon)
            seg = int(overrides.pop("segment_length", min(entry.mujoco.clip_steps, horizon)))
            if not 1 <= seg <= horizon:
                raise ValueError(f"segment_length must be from 1 to the episode's {horizon} steps (a clip never spans "
                                 f"two episodes), got {seg}")
            if overrides:
                raise ValueError(f"Unknown MuJoCo options {sorted(overrides)}")
            self.options = dict(terminal_penalty=penalty, segment_length=seg, penalty_shape=shape,
                                episode_steps=horizon)
            self.envpool_id = entry.envpool_id
            self.envpool_kwargs = dict(common, **dict(entry.mujoco.options), max_episode_steps=horizon)
            self.pool = envpool.make(self.envpool_id, **self.envpool_kwargs)
            space = self.pool.action_space
            self.spec = EnvSpec(name=self.task, obs_shape=tuple(self.pool.observation_space.shape), discrete=False,
                                num_actions=int(space.shape[0]),
                                action_low=tuple(float(x) for x in space.low),
                                action_high=tuple(float(x) for x in space.high),
                                horizon=horizon, terminal_penalty=penalty, segment_length=seg,
                                reward_std=entry.reward_std, on_terminate=entry.on_terminate)
            self.render_fields = entry.mujoco.root_info
            self.score_mask = None
            self.native_frames = None  # (colour frames for people's clips: Atari only)
            self.backend = "xla" if backend == "auto" else backend
        if self.backend == "xla":
            # envpool computes the custom call's output types when xla() is called; under JAX's
            # default x32 its float64 outputs (MuJoCo obs, reward, info) are declared float32
            # while the C++ side writes float64: heap corruption.  So build it under x64.
            with jax.enable_x64(True):
                self.xla_ops = self.pool.xla()
        else:
            self.xla_ops = None
        self._env_ids = np.arange(self.num_envs, dtype=np.int32)

    # ------------------------------------------------------------------ raw envpool -> StepOut
    @property
    def _info_fields(self) -> tuple[str, ...]:
        """The render columns read from envpool's info: MuJoCo's root position (Atari's come from
        ``native_frames``, see ``step``)."""
        return self.render_fields if self.domain == "mujoco" else ()

    def _obs(self, obs):
        """Agent observation: Atari [N, 4, 84, 84] -> masked, channel-last [N, 84, 84, 4]."""
        if self.domain == "atari":
            obs = jnp.where(self._mask[None, None], jnp.uint8(0), jnp.asarray(obs))
            return jnp.transpose(obs, (0, 2, 3, 1))
        return jnp.asarray(obs, jnp.float32)

    def _convert(self, was_out, obs, rew, term, trunc, info):
        """envpool step outputs -> (StepOut, was_out), the papers' rules applied (jit-safe)."""
        valid = jnp.asarray(info["elapsed_step"]) > 0  # deferred reset: elapsed_step back to 0
        term = jnp.asarray(term, bool)
        trunc = jnp.asarray(trunc, bool)
        rew = jnp.asarray(rew, jnp.float32)
        obs = self._obs(obs)
        if self.domain == "atari":
            oracle = jnp.clip(rew, -1.0, 1.0) if self.options["clip_oracle_reward"] else rew
            terminated = term  # game over (life loss never ends an episode here)
            true_reward = oracle + jnp.where(terminated, self.spec.terminal_penalty, 0.0)
            boundary = jnp.zeros_like(term)  # one continuous episode
        else:
            out = ~healthy(self.task, obs) & valid
            terminated = out & ~was_out  # the step on which the original task would have ended
            if self.options["penalty_shape"] == "height":
                # the alive bonus (1) on every step, envpool having withheld it out of range, and the
                # height term z − standing_height: Hopper speed + z, Walker2d speed + z − 1, Ant ... + z − 0.2
                true_reward = (rew + jnp.where(out, ALIVE_BONUS, 0.0)
                               + obs[..., 0] - self.entry.mujoco.standing_height)
            else:
                true_reward = rew + jnp.where(out, self.spec.terminal_penalty, 0.0)
            was_out = out
            boundary = trunc & ~term
        render = (jnp.stack([jnp.asarray(info[f], jnp.float32) for f in self._info_fields], -1)
                  if self._info_fields else jnp.zeros((self.num_envs, 0), jnp.float32))
        out = StepOut(obs=obs, true_reward=jnp.where(valid, true_reward, 0.0), terminated=terminated & valid,
                      boundary=boundary & valid, raw_reward=rew, valid=valid, render=render)
        return out, was_out

    # ------------------------------------------------------------------ host side (callback)
    def _host_step(self, action):
        action = np.asarray(action)
        if self.domain == "mujoco":
            action = action.astype(np.float64)
        obs, rew, term, trunc, info = self.pool.step(action, self._env_ids)
        fields = dict(elapsed_step=np.asarray(info["elapsed_step"], np.int32))
        for f in self._info_fields:
            fields[f] = np.asarray(info[f], np.float32)
        obs = np.asarray(obs, np.uint8 if self.domain == "atari" else np.float32)
        return obs, np.asarray(rew, np.float32), np.asarray(term, bool), np.asarray(trunc, bool), fields

    def _host_shapes(self):
        n = self.num_envs
        obs = jax.ShapeDtypeStruct((n, *self._raw_obs_shape()), jnp.uint8 if self.domain == "atari" else jnp.float32)
        vec = lambda dt: jax.ShapeDtypeStruct((n,), dt)
        info = dict(elapsed_step=vec(jnp.int32), **{f: vec(jnp.float32) for f in self._info_fields})
        return (obs, vec(jnp.float32), vec(jnp.bool_), vec(jnp.bool_), info)

    def _raw_obs_shape(self):
        return (4, 84, 84) if self.domain == "atari" else self.spec.obs_shape

    # ------------------------------------------------------------------ the protocol
    def reset(self, key: jax.Array | None = None):
        """Reset every environment (host side, outside jit). The key is unused: envpool seeds
        itself from ``seed`` at construction."""
        obs, _ = self.pool.reset(self._env_ids)
        if self.native_frames is not None:
            self.native_frames.after_reset(self.pool.render(self._env_ids))
        token = self.xla_ops[0] if self.backend == "xla" else jnp.zeros((), jnp.int32)
        state = EnvpoolState(token=jnp.asarray(token), was_out=jnp.zeros(self.num_envs, bool))
        return state, self._obs(np.asarray(obs, np.float32) if self.domain == "mujoco" else obs)

    def step(self, key: jax.Array, state: "EnvpoolState", action: jax.Array):
        if self.backend == "xla":
            xla_step = self.xla_ops[3]
            ids = jnp.asarray(self._env_ids)
            act = jnp.asarray(action, jnp.int32) if self.domain == "atari" else jnp.asarray(action)
            # x64 only around this call (MuJoCo wants float64 actions and returns float64)
            with jax.enable_x64(True):
                if self.domain == "mujoco":
                    act = act.astype(jnp.float64)
                token, raw = xla_step(state.token, act, ids)
                raw = jax.tree.map(_to_32, raw)
        else:
            raw = jax.experimental.io_callback(self._host_step, self._host_shapes(), action, ordered=True)
            token = state.token + 1
        obs, rew, term, trunc, info = raw
        out, was_out = self._convert(state.was_out, obs, rew, term, trunc, info)
        if self.native_frames is not None:  # people's clips: the emulator's colour frame, kept on the host
            frame = jax.experimental.io_callback(self._keep_native_frames, jax.ShapeDtypeStruct((), jnp.int32),
                                                 rew, ordered=True)
            token, frame = jax.lax.optimization_barrier((token, frame))  # the next step waits for it
            out = out._replace(render=self.native_frames.columns(frame, jnp))
        return EnvpoolState(token=token, was_out=was_out), out

    def _keep_native_frames(self, _after):
        """Host side, after a step (``_after``, one of its outputs, orders it so): keep the frames
        the emulators show now; returns the id of the frames the step acted on."""
        return self.native_frames.after_step(self.pool.render(self._env_ids))

    @property
    def fps(self) -> float:
        """Steps per second of the task's own time (clips and play run in real time)."""
        return self.entry.fps

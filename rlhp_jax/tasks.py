"""Every task the project runs, in one table (layer 0: plain data; no environment library is imported).

A task's facts — how its environment is built and modified (Christiano et al. 2017, appendix A;
Ibarz et al. 2018, A.1), how long a clip is and how fast it plays, how a clip of MuJoCo is rebuilt
and filmed, which colours a MinAtar frame has, which actions a person can play and what a person is
told about it (appendix B) — are one :class:`Task` in :data:`TASKS`.  Every other module asks this
table; ``resolve(name)`` is the only place that turns a spelling into a task:

* a task's own name: ``'CartPole-v1'``, ``'Breakout-MinAtar'``, ``'Pong'``, ``'Hopper'``;
* an envpool or gym id: ``'Pong-v5'``, ``'PongNoFrameskip-v4'``, ``'Hopper-v4'`` (the part before
  ``-v``, less ``NoFrameskip``);
* Christiano's names for the pendulums: ``'pendulum'``, ``'double pendulum'`` (``Task.aliases``);
* any of these in another letter case (``'pong'``, ``'hopper-v4'``, ``'cartpole-v1'``).

Adding a task is one entry below (``_gymnax``, ``_minatar``, ``_atari`` or ``_mujoco``); what else a
task may need (a healthy range, an Atari score mask, a drawing for a new classic-control task, agent
presets) is listed in docs/DESIGN.md, "Adding a task".
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

RGB = tuple[int, int, int]
BACKENDS = ("gymnax", "atari", "mujoco")
CHRISTIANO_B = "Christiano et al. 2017, appendix B"  # where the paper tasks' guidance to people comes from
CLIP_SECONDS = 1.5  # A.1: "trajectory segments that last 1.5 seconds"

# ALE's 18 actions, in ALE's order (src/common/Constants.h).
ALE_ACTIONS = ("NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT",
               "UPFIRE", "RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE", "UPLEFTFIRE", "DOWNRIGHTFIRE",
               "DOWNLEFTFIRE")


@dataclasses.dataclass(frozen=True)
class MujocoModel:
    """A gym-v4 MuJoCo task as envpool simulates it, and how a clip rebuilds its state.

    ``root_info``: info fields holding the root position that the observation excludes; the
    environment wrapper keeps them per step (``StepOut.render``) for the clips.  ``layout``: how
    the observation maps to ``qpos``/``qvel`` (``render.mujoco.reconstruct_state``)."""

    model_timestep: float  # <option timestep> of the task's XML in envpool's assets (gym v4 models)
    frame_skip: int  # simulator steps per environment step (envpool's default for the task)
    options: tuple[tuple[str, Any], ...]  # envpool.make keyword arguments (A.1's changes)
    root_info: tuple[str, ...]
    nq: int
    nv: int
    obs_dim: int
    layout: str  # "root_excluded" | "full" | "reacher" | "double_pendulum"
    camera: str | Mapping[str, Any]  # a named XML camera, or free-camera settings
    extra_obs: int = 0  # optional trailing observation entries (Ant's contact forces)
    # ``penalty_shape="height"``: the height (obs[0], the torso's z) that the run-on reward's height
    # term z - standing_height is measured from: the values of the paper's public code (OpenAI's
    # rl-teacher, 2017: Hopper 1, Walker2d 2, Ant 1.2); None where that code has no height term
    standing_height: float | None = None
    # what a step outside the healthy range costs unless ``penalty_shape`` says otherwise
    # (``envpool_envs.PENALTY_SHAPES``): "height" where the range penalty was measured to fail
    # (BUILD_NOTES, "Fig. 2 on all eight tasks"), "range" elsewhere
    penalty_shape: str = "range"

    @property
    def control_timestep(self) -> float:
        """Simulated seconds per environment step."""
        return self.model_timestep * self.frame_skip

    @property
    def clip_steps(self) -> int:
        """A.1's 1.5 s clip in environment steps (before it is cut to one episode)."""
        return round(CLIP_SECONDS / self.control_timestep)


@dataclasses.dataclass(frozen=True)
class Mirror:
    """A reflection of a task that leaves its true reward unchanged (the track's two ends, the two
    directions of a swing): the mirrored state's observation feature ``i`` is ``obs_sign[i] *
    obs[obs_index[i]]``, and the mirrored action ``action_index[a]`` (discrete) or
    ``action_sign * action`` (continuous).  ``obs_index`` None: each feature maps to itself.  A
    reflection undone by itself (``tests/test_tasks.py`` checks that, and that the dynamics commute
    with it).  ``EnsembleConfig.mirror`` makes r̂ invariant to it."""

    obs_sign: tuple[float, ...]
    obs_index: tuple[int, ...] | None = None
    action_index: tuple[int, ...] | None = None  # discrete: the mirror image of each action
    action_sign: tuple[float, ...] | None = None  # continuous: per action dimension

    @property
    def obs_permutation(self) -> tuple[int, ...]:
        """``obs_index``, the identity spelled out where it is None."""
        return self.obs_index if self.obs_index is not None else tuple(range(len(self.obs_sign)))

    def __post_init__(self):
        n = len(self.obs_sign)
        index = self.obs_permutation
        if len(index) != n or sorted(index) != list(range(n)):
            raise ValueError(f"obs_index must be a permutation of the {n} features, got {self.obs_index}")
        if any(v not in (-1.0, 1.0) for v in self.obs_sign + (self.action_sign or ())):
            raise ValueError("signs must be -1 or 1")
        if any(index[index[i]] != i or self.obs_sign[i] != self.obs_sign[index[i]] for i in range(n)):
            raise ValueError("the mirror must undo itself (a feature and its image swap back with one sign)")
        if (self.action_index is None) == (self.action_sign is None):
            raise ValueError("give action_index (discrete actions) or action_sign (continuous), not both")
        a = self.action_index
        if a is not None and (sorted(a) != list(range(len(a))) or any(a[a[i]] != i for i in range(len(a)))):
            raise ValueError(f"action_index must be a permutation that undoes itself, got {a}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Task:
    """One task, as the environment wrapper, the clips, the labeling and play pages need it."""

    name: str  # canonical: gymnax's id, the Atari game, the MuJoCo model (envpool's id less "-v5"/"-v4")
    backend: str  # "gymnax" | "atari" | "mujoco"
    horizon: int  # fixed episode length the agent experiences
    segment_length: int  # clip length in steps (Atari and MinAtar 25, MuJoCo 1.5 s)
    fps: float  # clips and play in real time: 1 / (seconds per step)
    terminal_penalty: float  # added to the true reward when the task would have ended
    reward_std: float  # std of the normalized predicted reward (A.1: 1, A.2: 0.05)
    on_terminate: str  # "continue" (penalty per step out of range) or "reset" (penalty once)
    aliases: tuple[str, ...] = ()  # other names people use (any letter case)
    envpool_id: str = ""  # envpool's task id (Atari, MuJoCo)
    mujoco: MujocoModel | None = None
    obs_shape: tuple[int, ...] = ()  # gymnax: the observation clips are drawn from
    minatar_channels: tuple[tuple[str, RGB], ...] = ()  # MinAtar: (object, colour) per channel, in clips and play
    play_actions: tuple[str, ...] = ()  # ALE names of the actions, in the game's order; () = not playable
    play_hint: str = ""  # shown on the play page where the keys do not do what they suggest
    guidance: str = ""  # what a labeler is told about the task (human.instructions builds the page text)
    guidance_source: str = ""  # the paper it is quoted from; "" for ours
    mirror: Mirror | None = None  # a reflection the true reward is invariant to (vector observations)

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"{self.name}: backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.on_terminate not in ("reset", "continue"):
            raise ValueError(f"{self.name}: on_terminate must be 'reset' or 'continue', got {self.on_terminate!r}")
        if (self.mujoco is not None) != (self.backend == "mujoco"):
            raise ValueError(f"{self.name}: a MuJoCo task, and only one, has a MujocoModel")


def _gymnax(name, *, horizon, segment_length, fps, obs_shape, guidance, terminal_penalty=0.0, reward_std=1.0,
            on_terminate="reset", **more) -> Task:
    """A gymnax task (its name is gymnax's id): the usual time limit as horizon, r̂ std 1 (A.1); a task
    that ends resets silently with the penalty once (``on_terminate="reset"``), or runs on with the
    penalty on every step out of range (``"continue"``).  ``fps``: real time, 1 / the task's time step."""
    return Task(name=name, backend="gymnax", horizon=horizon, segment_length=segment_length, fps=fps,
                terminal_penalty=terminal_penalty, reward_std=reward_std, on_terminate=on_terminate,
                obs_shape=obs_shape, guidance=guidance, **more)


def _minatar(name, *, channels, actions, guidance, horizon=1000, terminal_penalty=-10.0) -> Task:
    """MinAtar (pure-JAX Atari-likes, 10x10xC): as the Atari rule of A.2 — a game over resets silently
    and costs the oracle a penalty; clips of 25 steps; 10 steps/s (MinAtar has no native speed)."""
    return _gymnax(name, horizon=horizon, segment_length=25, fps=10.0, obs_shape=(10, 10, len(channels)),
                   terminal_penalty=terminal_penalty, guidance=guidance, minatar_channels=channels,
                   play_actions=actions)


def _atari(name, *, actions, guidance="", hint="", terminal_penalty=-10.0) -> Task:
    """A.2 / Ibarz A.1: 25-step clips (1.7 s) at 15 fps (60 Hz emulator, frame skip 4), r̂ std 0.05,
    27,000 agent steps per episode, a game over resets silently with a penalty (-10; Pong 0).
    ``actions``: ALE's minimal action set (getMinimalActionSet, default mode and difficulty), the
    order of envpool's actions when ``full_action_space`` is off."""
    return Task(name=name, backend="atari", horizon=27_000, segment_length=25, fps=15.0,
                terminal_penalty=terminal_penalty, reward_std=0.05, on_terminate="reset", envpool_id=f"{name}-v5",
                play_actions=actions, play_hint=hint, guidance=guidance,
                guidance_source=CHRISTIANO_B if guidance else "")


def _mujoco(name, *, timestep, frame_skip, penalty, options, root_info, nq, nv, obs_dim, layout, camera,
            guidance, extra_obs=0, episode_steps=1000, aliases=(), standing_height=None,
            penalty_shape="range", mirror=None) -> Task:
    """A.1: the task runs on for its whole time limit (``on_terminate="continue"``), clips of 1.5 s
    of the task's own time (at most one episode: Reacher's lasts 50 steps = 1 s), r̂ std 1."""
    model = MujocoModel(timestep, frame_skip, options, root_info, nq, nv, obs_dim, layout, camera, extra_obs,
                        standing_height, penalty_shape)
    dt = model.control_timestep
    return Task(name=name, backend="mujoco", horizon=episode_steps,
                segment_length=min(model.clip_steps, episode_steps), fps=1.0 / dt,
                terminal_penalty=penalty, reward_std=1.0, on_terminate="continue", aliases=aliases,
                envpool_id=f"{name}-v4", mujoco=model, guidance=guidance, guidance_source=CHRISTIANO_B,
                mirror=mirror)


# MuJoCo (A.1): no control cost; no task ends outside its healthy range.  Hopper, Walker2d and Ant
# run on (``terminate_when_unhealthy=False``); envpool's pendulums always end outside their range
# (|pole angle| > 0.2; tip height <= 1): a range they cannot leave (the pole's hinge stops at 90
# degrees; the tip is never below -1.2) lets them run on, and ``envpool_envs.healthy`` applies the
# real one.  The penalty per step outside it is minus the alive bonus the reward keeps (Hopper,
# Walker2d and Ant withhold it themselves: -1; InvertedPendulum -2, InvertedDoublePendulum -20).
_NO_CTRL = ("ctrl_cost_weight", 0.0)
_RUNS_ON = ("terminate_when_unhealthy", False)
_POLE_RUNS_ON = ("healthy_z_min", -10.0), ("healthy_z_max", 10.0)
_TIP_RUNS_ON = ("healthy_z_max", -10.0)
_X, _XY = ("x_position",), ("x_position", "y_position")
_MINATAR_TRAIL = ("trail", (110, 110, 150))

_ENTRIES = (
    # ---- gymnax classic control: the usual time limit; clips ~1.5 s where that is short enough to judge
    # CartPole resets on a fall (penalty once): run on, the fallen pole's unbounded states are
    # off-distribution for r̂ and the agent learns to fall at once (BUILD_NOTES).
    # mirrors: the track's ends swapped (x, its velocity, the angle and its velocity change sign; left
    # and right pushes swap); the pendulums' two directions of swing (sines and velocities, torques)
    _gymnax("CartPole-v1", horizon=500, terminal_penalty=-10.0, segment_length=25, fps=50.0, obs_shape=(4,),
            mirror=Mirror(obs_sign=(-1.0, -1.0, -1.0, -1.0), action_index=(1, 0)),
            guidance="The pole should stay upright and the cart should stay near the middle of the track. A pole "
                     "that falls (the clip jumps back to an upright pole at the centre) is very bad."),  # tau 0.02 s
    _gymnax("Pendulum-v1", horizon=200, segment_length=30, fps=20.0, obs_shape=(3,),  # dt = 0.05 s
            mirror=Mirror(obs_sign=(1.0, -1.0, -1.0), action_sign=(-1.0,)),  # cos θ, sin θ, θ̇
            guidance="The pendulum should swing up and stay pointing straight up, with as little spinning as "
                     "possible."),
    _gymnax("Acrobot-v1", horizon=500, segment_length=25, fps=5.0, obs_shape=(6,),  # dt = 0.2 s
            mirror=Mirror(obs_sign=(1.0, -1.0, 1.0, -1.0, -1.0, -1.0), action_index=(2, 1, 0)),  # cos, sin θ1, θ2; θ̇
            guidance="The free end of the two-link arm should swing up above the line as soon as possible."),
    # no time step in the model; gym renders at 30 fps
    _gymnax("MountainCarContinuous-v0", horizon=999, segment_length=30, fps=30.0, obs_shape=(2,),
            guidance="The car should build up speed by swinging back and forth and reach the flag on the right "
                     "hill."),
    # ---- MinAtar: channels in observation order (MinAtar's names), later ones drawn over earlier ones;
    # actions: gymnax's minimal sets over MinAtar's ['n','l','u','r','d','f']
    _minatar("Asterix-MinAtar",
             channels=(("player", (0, 200, 255)), ("enemy", (235, 64, 52)), _MINATAR_TRAIL, ("gold", (255, 200, 0))),
             actions=("NOOP", "LEFT", "UP", "RIGHT", "DOWN"),
             guidance="Collect the treasure (good) and avoid the enemies (very bad)."),
    _minatar("Breakout-MinAtar",
             channels=(("paddle", (0, 200, 255)), ("ball", (255, 255, 255)), _MINATAR_TRAIL,
                       ("brick", (235, 110, 52))),
             actions=("NOOP", "LEFT", "RIGHT"),
             guidance="Hit the ball with the paddle and break bricks; don't let the ball fall past the paddle."),
    _minatar("Freeway-MinAtar", horizon=2500, terminal_penalty=0.0,
             channels=(("chicken", (255, 220, 0)), ("car", (235, 64, 52)), ("speed1", (70, 90, 170)),
                       ("speed2", (80, 130, 210)), ("speed3", (90, 170, 240)), ("speed4", (90, 205, 205)),
                       ("speed5", (120, 225, 150))),
             actions=("NOOP", "UP", "DOWN"),
             guidance="The chicken should cross the road to the top as often as possible without being hit by cars."),
    _minatar("Seaquest-MinAtar",
             channels=(("sub_front", (255, 220, 0)), ("sub_back", (190, 150, 0)), ("friendly_bullet", (255, 255, 255)),
                       _MINATAR_TRAIL, ("enemy_bullet", (255, 130, 130)), ("enemy_fish", (235, 64, 52)),
                       ("enemy_sub", (190, 90, 255)), ("oxygen_gauge", (0, 200, 255)), ("diver_gauge", (60, 200, 90)),
                       ("diver", (170, 255, 140))),
             actions=("NOOP", "LEFT", "UP", "RIGHT", "DOWN", "FIRE"),
             guidance="Shoot enemies, rescue divers and surface for air before it runs out; don't get hit."),
    _minatar("SpaceInvaders-MinAtar",
             channels=(("cannon", (0, 200, 255)), ("alien", (60, 200, 90)), ("alien_left", (150, 220, 50)),
                       ("alien_right", (40, 190, 170)), ("friendly_bullet", (255, 255, 255)),
                       ("enemy_bullet", (235, 64, 52))),
             actions=("NOOP", "LEFT", "RIGHT", "FIRE"),
             guidance="Shoot the aliens and don't get shot."),
    # ---- Atari: Christiano's seven (BeamRider, Breakout, Enduro, Pong, Qbert, Seaquest, SpaceInvaders)
    # and Ibarz's (adds Hero, MontezumaRevenge, PrivateEye); guidance: appendix B.2
    _atari("BeamRider", actions=("NOOP", "FIRE", "UP", "RIGHT", "LEFT", "UPRIGHT", "UPLEFT", "RIGHTFIRE", "LEFTFIRE"),
           guidance="Shoot enemy ships (good), and don't get shot (very bad)."),
    _atari("Breakout", actions=("NOOP", "FIRE", "RIGHT", "LEFT"),
           guidance="Hit the ball with the paddle, break the colored blocks, and don't let the ball fall off the "
                    "bottom of the screen."),
    _atari("Enduro", actions=("NOOP", "FIRE", "RIGHT", "LEFT", "DOWN", "DOWNRIGHT", "DOWNLEFT", "RIGHTFIRE",
                              "LEFTFIRE"),
           guidance="Pass as many cars as you can, and don't get passed by cars."),
    _atari("Hero", actions=ALE_ACTIONS),
    _atari("MontezumaRevenge", actions=ALE_ACTIONS),
    _atari("Pong", terminal_penalty=0.0, actions=("NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"),
           hint="Pong's paddle follows the joystick turned a quarter: → moves your paddle (the right one) up, "
                "← moves it down.",
           guidance="Knock the ball past the opponent's orange paddle on the left (good), and don't let it go past "
                    "your green paddle on the right (bad)."),
    _atari("PrivateEye", actions=ALE_ACTIONS),
    _atari("Qbert", actions=("NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN"),
           guidance="Change the color of as many blocks as you can (good), but don't jump off the side or run into "
                    "enemies (very bad)."),
    _atari("Seaquest", actions=ALE_ACTIONS,
           guidance="Shoot the fish and enemy submarines (good) and pick up the scuba divers. Don't let your "
                    "submarine run out of air or get hit by a fish or torpedo (very bad)."),
    _atari("SpaceInvaders", actions=("NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"),
           guidance="Shoot enemy ships (good), and don't let your ship (the one at the bottom of the screen) get shot "
                    "(very bad)."),
    # ---- MuJoCo (A.1).  Clips of 1.5 s: Hopper and Walker2d 188 steps (8 ms per step), HalfCheetah, Ant
    # and InvertedDoublePendulum 30, Swimmer 38, Reacher and InvertedPendulum their whole episode (50 and
    # 25 steps).  Episodes: gym's 1000 steps, but the pendulums' are the paper's public code's (rl-teacher:
    # 25 and 50), so every episode starts upright: in 1000-step ones the untrained pole lies fallen for all
    # but ~5 steps and almost every label is a tie between two fallen clips (BUILD_NOTES).
    # (A.1 says "15 to 60 timesteps"; gym's own timesteps give 188 on Hopper and Walker2d, and 1.5 s is
    # what a person watches, so the seconds win.)  Observation layouts: see render.mujoco.reconstruct_state;
    # camera: the XML's "track" camera, or a free one showing the whole arena / rail.  Guidance: B.1.
    _mujoco("Hopper", timestep=0.002, frame_skip=4, penalty=-1.0, options=(_RUNS_ON, _NO_CTRL), root_info=_X,
            penalty_shape="height", standing_height=1.0, nq=6, nv=6, obs_dim=11, layout="root_excluded", camera="track",  # obs = qpos[1:], clip(qvel, ±10)
            guidance="The \u201ccenter\u201d of the robot is the joint closest to the pointy end. The first priority "
                     "is for the center of the robot to move to the right (moving to the left is worse than not "
                     "moving at all). If the two robots are roughly tied on this metric, then the tiebreaker is how "
                     "high the center is."),
    _mujoco("Walker2d", timestep=0.002, frame_skip=4, penalty=-1.0, options=(_RUNS_ON, _NO_CTRL), root_info=_X,
            penalty_shape="height", standing_height=2.0, nq=9, nv=9, obs_dim=17, layout="root_excluded", camera="track",
            guidance="The \u201ccenter\u201d of the robot is the joint where the three limbs meet. The first priority "
                     "is for the center of the robot to move to the right. If the two robots are roughly tied on "
                     "this metric, then the tiebreaker is how high the center is."),
    # obs = qpos[2:] (z, quaternion, 8 joints), qvel (14) [, contact forces (84) if enabled]
    _mujoco("Ant", timestep=0.01, frame_skip=5, penalty=-1.0, options=(_RUNS_ON, _NO_CTRL), root_info=_XY,
            standing_height=1.2, nq=15, nv=14, obs_dim=27, extra_obs=84, layout="root_excluded", camera="track",
            guidance="The first priority is for the robot to be standing upright, and failing that for the center of "
                     "the robot to be as high up as possible. If both robots are upright or neither is, the tie "
                     "breaker is whichever one is moving faster to the right."),
    _mujoco("HalfCheetah", timestep=0.01, frame_skip=5, penalty=0.0, options=(_NO_CTRL,), root_info=_X,
            nq=9, nv=9, obs_dim=17, layout="root_excluded", camera="track",  # obs = qpos[1:], qvel
            guidance="The robot should move to the right as fast as possible."),
    _mujoco("Swimmer", timestep=0.01, frame_skip=4, penalty=0.0, options=(_NO_CTRL,), root_info=_XY,
            nq=5, nv=5, obs_dim=8, layout="root_excluded", camera="track",  # obs = qpos[2:], qvel
            # mirror: y -> -y (the angles, the sideways and angular velocities and the torques change sign)
            mirror=Mirror(obs_sign=(-1.0, -1.0, -1.0, 1.0, -1.0, -1.0, -1.0, -1.0), action_sign=(-1.0, -1.0)),
            guidance="The \u201ccenter\u201d of the robot is the mark in the middle of its body. The center should "
                     "move to the right as fast as possible."),
    # obs = cos(q[:2]), sin(q[:2]), q[2:] (target), qvel[:2], fingertip - target (3); top-down camera
    _mujoco("Reacher", timestep=0.01, frame_skip=2, penalty=0.0, options=(_NO_CTRL,), root_info=(), episode_steps=50,
            nq=4, nv=4, obs_dim=11, layout="reacher",
            camera=dict(lookat=(0.0, 0.0, 0.0), distance=0.85, elevation=-90.0, azimuth=90.0),
            guidance="The green dot on the robot arm should be as close as possible to the red dot. Being near for a "
                     "while and far for a while is worse than being at an intermediate distance for the entire clip."),
    _mujoco("InvertedPendulum", timestep=0.02, frame_skip=2, penalty=-2.0, options=_POLE_RUNS_ON, root_info=(),
            episode_steps=25, nq=2, nv=2, obs_dim=4, layout="full", aliases=("pendulum",),  # obs = qpos, qvel
            camera=dict(lookat=(0.0, 0.0, 0.2), distance=2.6, elevation=-10.0, azimuth=90.0),
            guidance="The pendulum should be pointing approximately up. There will be a lot of ties where the "
                     "pendulum has fallen and a lot of \u201ccan't tells\u201d where it is off the side of the screen. "
                     "If you can see one pendulum and it hasn't fallen down, that's better than being unable to see "
                     "the other pendulum."),
    # obs = q[0], sin(q[1:]), cos(q[1:]), clip(qvel, ±10), clip(qfrc_constraint, ±10)
    _mujoco("InvertedDoublePendulum", timestep=0.01, frame_skip=5, penalty=-20.0, options=(_TIP_RUNS_ON,),
            root_info=(), episode_steps=50, nq=3, nv=3, obs_dim=11, layout="double_pendulum",
            aliases=("double pendulum", "double_pendulum"),
            camera=dict(lookat=(0.0, 0.0, 0.45), distance=3.2, elevation=-8.0, azimuth=90.0),
            guidance="Both pendulums should be pointing approximately up (if they fall down, the cart should try to "
                     "swing them back up) and the cart should be near the center of the track. Being high for a "
                     "while and low for a while is worse than being at an intermediate distance the entire time."),
)

TASKS: dict[str, Task] = {t.name: t for t in _ENTRIES}

_ALIASES = {a.lower(): t for t in TASKS.values() for a in t.aliases}
_ENVPOOL = {t.name.lower(): t for t in TASKS.values() if t.backend != "gymnax"}
_GYMNAX = {t.name.lower(): t for t in TASKS.values() if t.backend == "gymnax"}
assert len(TASKS) == len(_ENTRIES) and len({n.lower() for n in TASKS} | set(_ALIASES)) == len(TASKS) + len(_ALIASES)


def names(backend: str | None = None) -> list[str]:
    """The tasks' names, sorted, backend by backend (gymnax, Atari, MuJoCo), or one backend's."""
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return [n for b in BACKENDS if backend in (None, b) for n in sorted(t.name for t in TASKS.values() if t.backend == b)]


def find(name: str) -> Task | None:
    """The task ``name`` spells (module docstring), or None."""
    if not isinstance(name, str) or not name:
        return None
    if name in TASKS:
        return TASKS[name]
    if name.lower() in _ALIASES:
        return _ALIASES[name.lower()]
    base = name.split("-v")[0].replace("NoFrameskip", "").lower()  # an envpool or gym id
    return _ALIASES.get(base) or _ENVPOOL.get(base) or _GYMNAX.get(name.lower())


def resolve(name: str) -> Task:
    """The task ``name`` spells; ValueError naming every supported task otherwise."""
    task = find(name)
    if task is None:
        raise ValueError(f"Unknown environment {name!r}. Supported environments: {', '.join(names())}.")
    return task

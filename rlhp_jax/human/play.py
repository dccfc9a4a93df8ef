"""Record expert demonstrations by playing a game in the browser (layer 5; Ibarz et al. 2018, §2.1).

A :class:`PlaySession` owns one environment (``make_env(name, 1)``: an Atari game through
envpool, or a MinAtar game through gymnax) and steps it in a background thread at the game's
normal speed (its ``tasks.Task.fps``: Atari 15 agent steps/s, i.e. 60 Hz with frame skip 4;
MinAtar 10 steps/s), whatever the browser does.  The action of each step is the one that best
matches the keys the person holds at that moment (arrows and Space for FIRE, see
:func:`action_for_keys`; a game's actions are its ``Task.play_actions``).  Every
step is recorded with a :class:`~rlhp_jax.demos.DemoRecorder`: the observation the action was
taken in (exactly what the agent sees: frames stacked and blanked by the same wrapper), the
action, and the game's raw reward.  A game over ends the episode (envpool's deferred-reset step
that follows it is no transition and is not recorded); the person can also end an episode
early (the game restarts) and save.  Saving writes the demo file atomically.

The game waits ("paused") until the person presses a game key or Start, and pauses again on a
game over, after "End episode", when the page loses focus or when the page has not been heard
from for ``idle_pause_s`` (a closed tab must not leave a key held down forever).

This module is the game: key maps (a game's actions come from the task registry,
``Task.play_actions``) and the session with its game thread.  What the page draws of an
observation is ``render.play_frame`` (the labeling clips' colours); the page, its HTTP routes and
the ``play`` command are in :mod:`rlhp_jax.human.play_server`.
"""

from __future__ import annotations

import base64
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from rlhp_jax import demos as demos_lib
from rlhp_jax import tasks
from rlhp_jax.render import play_frame
from rlhp_jax.tasks import ALE_ACTIONS

# ---------------------------------------------------------------------------- action sets
# A game's actions (ALE names, in the game's order) and its hint are its row of tasks.TASKS
# (``play_actions``, ``play_hint``); tests/test_demo_play.py checks every length against the game.
KEYS = ("up", "down", "left", "right", "fire")
_OPPOSITE = {"up": "down", "down": "up", "left": "right", "right": "left"}
MAX_KEYS = 8  # a request naming more keys than this is refused


class PlayError(Exception):
    """A request the session refuses; ``status`` is the HTTP status the server answers."""

    def __init__(self, message: str, status: int = 409):
        super().__init__(message)
        self.status = status


def playable_envs() -> list[str]:
    return [name for backend in ("atari", "gymnax") for name in tasks.names(backend) if tasks.TASKS[name].play_actions]


def action_names(env_name: str, full_action_space: bool = False) -> tuple[str, ...]:
    """The meaning of each action index of ``env_name`` (ALE names: NOOP, FIRE, UP, UPRIGHTFIRE, ...)."""
    task = tasks.find(env_name)
    if task is None or not task.play_actions:
        raise ValueError(f"{env_name!r} cannot be played in the browser; playable games: {', '.join(playable_envs())}")
    if task.backend != "atari" and full_action_space:
        raise ValueError("--full-action-space applies to the Atari games only (MinAtar games have their own set)")
    return ALE_ACTIONS if full_action_space else task.play_actions


def components(action: str) -> frozenset[str]:
    """'UPRIGHTFIRE' -> {'up', 'right', 'fire'}; 'NOOP' -> {}."""
    return frozenset(k for k in KEYS if k.upper() in action)


def action_for_keys(keys: Sequence[str], actions: Sequence[str]) -> int:
    """The index of the action that best matches the held ``keys`` (oldest press first).

    Of two opposite directions held together the newer press wins.  The action chosen does
    only what is held (its parts are a subset of the keys), as much of it as the set allows:
    most parts first, then directions before FIRE, then the most recently pressed keys.  So
    UP+FIRE is UPFIRE where the game has it, else UP, else FIRE; nothing held is NOOP.
    """
    held: dict[str, int] = {}
    for i, k in enumerate(keys):
        held.pop(k, None)
        if _OPPOSITE.get(k) in held:
            del held[_OPPOSITE[k]]
        held[k] = i
    best, best_score = 0, None
    for idx, name in enumerate(actions):
        parts = components(name)
        if not parts <= held.keys():
            continue
        score = (len(parts), len(parts - {"fire"}), sum(held[p] for p in parts))
        if best_score is None or score > best_score:
            best, best_score = idx, score
    return best


# ---------------------------------------------------------------------------- the session
class PlaySession:
    """One person playing one game; every step recorded.  Thread-safe; see the module docstring.

    ``env`` may be given (a ``VecEnv`` with ``num_envs == 1``) instead of being made from
    ``env_name``.  ``episodes``: finish (and save) once that many episodes are recorded.
    ``stop_after_save``: saving finishes the session (the CLI's "record until you save").
    ``overwrite``: the first save may replace a file at ``out`` (the CLI's ``--overwrite``); without
    it such a file, written since the session began, is kept and the demos go beside it
    (``demos.save_arrays``; ``status`` and ``summary`` say where).
    """

    def __init__(self, env_name: str, out: str | Path | None, *, episodes: int | None = None,
                 full_action_space: bool = False, fps: float | None = None, seed: int | None = None,
                 idle_pause_s: float = 3.0, stop_after_save: bool = True, env=None, source: str = "human (browser)",
                 overwrite: bool = False):
        import jax
        import jax.numpy as jnp

        from rlhp_jax.envs import make_env

        if episodes is not None and episodes < 1:
            raise ValueError(f"--episodes must be at least 1, got {episodes}")
        self.actions = action_names(env_name, full_action_space)
        task = tasks.resolve(env_name)
        self.atari = task.backend == "atari"
        if seed is None:
            seed = int(time.time_ns() % (2**31))
        if env is None:
            overrides: dict[str, Any] = {}
            if self.atari:
                overrides = dict(seed=seed, full_action_space=full_action_space)
            env = make_env(env_name, 1, **overrides)
        if env.num_envs != 1:
            raise ValueError(f"a play session steps one environment, got num_envs={env.num_envs}")
        if len(self.actions) != env.spec.num_actions:
            raise ValueError(f"{env_name} has {env.spec.num_actions} actions but the action table here names "
                             f"{len(self.actions)}: its play_actions in rlhp_jax/tasks.py do not match this game")
        self.env, self.env_name, self.seed = env, env.spec.name, seed
        self.task_name = task.name
        self.fps = float(fps or getattr(env, "fps", None) or task.fps)
        if not self.fps > 0:
            raise ValueError(f"fps must be positive, got {fps}")
        self.out = None if out is None else Path(out)
        self.overwrite = overwrite
        self.episodes_wanted = episodes
        self.idle_pause_s = float(idle_pause_s)
        self.stop_after_save = stop_after_save
        self.fmt = demos_lib.frame_format(env)
        self.recorder = demos_lib.DemoRecorder(self.fmt, source=source, fps=self.fps)
        self._ends_on_terminate = env.spec.on_terminate == "reset"

        def advance(key, state, action):
            key, k = jax.random.split(key)
            state, out = env.step(k, state, action)
            return key, state, out

        self._key = jax.random.PRNGKey(seed)
        self._key, k_reset = jax.random.split(self._key)
        self._state, obs = env.reset(k_reset)
        self._action_arr = {a: jnp.full((1,), a, jnp.int32) for a in range(len(self.actions))}
        # compiled ahead of time: compiling by a first call would step the game
        self._advance = jax.jit(advance).lower(self._key, self._state, self._action_arr[0]).compile()
        self._reset_fn = env.reset

        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._keys: list[str] = []
        self._action = 0
        self._paused, self._pause_reason = True, "not started"
        self._finished = False
        self._saved: dict[str, Any] | None = None
        self._unsaved = 0  # steps recorded since the last save
        self._error: str | None = None
        self._last_seen = time.monotonic()
        self._episode_steps, self._score = 0, 0.0
        self._returns: list[float] = []
        self._env_steps = 0  # steps taken (recorded or not), for the speed check
        self._seq = 0
        self._set_obs(np.asarray(obs)[0])

    # -------------------------------------------------------------- life cycle
    def start(self) -> "PlaySession":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="play-session", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def wait_finished(self, timeout: float) -> bool:
        with self._cond:
            self._cond.wait_for(lambda: self._finished or self._stop.is_set(), timeout=timeout)
            return self._finished

    # -------------------------------------------------------------- the game loop
    def _run(self) -> None:
        period = 1.0 / self.fps
        next_t = None
        while not self._stop.is_set():
            with self._cond:
                if self._paused or self._finished:
                    next_t = None
                    self._cond.wait(0.25)
                    continue
                if time.monotonic() - self._last_seen > self.idle_pause_s:
                    self._pause_locked("no contact from the page")
                    continue
            now = time.monotonic()
            if next_t is None:
                next_t = now
            elif next_t > now:
                if self._stop.wait(next_t - now):
                    break
            with self._cond:
                if self._paused or self._finished:  # paused while we slept: this step never happens
                    continue
                try:
                    self._step_locked()
                except Exception as e:  # noqa: BLE001 - the page must hear of it; the game stops
                    self._error = f"the game stopped: {type(e).__name__}: {e}"
                    self._pause_locked("error")
                    self._finished = True
                self._cond.notify_all()
            next_t += period
            if time.monotonic() - next_t > period:  # fell behind (a save, a slow step): no burst to catch up
                next_t = time.monotonic()

    def _step_locked(self) -> None:
        import jax

        action = self._action
        obs = self._obs
        self._key, self._state, out = self._advance(self._key, self._state, self._action_arr[action])
        out = jax.device_get(out)
        self._env_steps += 1
        if not bool(out.valid[0]):  # envpool's deferred reset after a game over: no transition
            self._close_episode_locked()
        else:
            reward = float(out.raw_reward[0])
            self.recorder.add(obs, action, reward)
            self._unsaved += 1
            self._episode_steps += 1
            self._score += reward
            if bool(out.boundary[0]) or (self._ends_on_terminate and bool(out.terminated[0])):
                self._close_episode_locked()
                if not self._finished:
                    self._pause_locked("game over" if bool(out.terminated[0]) else "time limit")
        self._set_obs(np.asarray(out.obs)[0])

    def _set_obs(self, obs: np.ndarray) -> None:
        self._obs = obs
        img = play_frame(obs, self.fmt.stack, self.task_name)
        self._frame = (img.shape[1], img.shape[0], 1 if img.ndim == 2 else img.shape[2],
                       base64.b64encode(img.tobytes()).decode("ascii"))
        self._seq += 1

    def _close_episode_locked(self) -> bool:
        """Close the episode being recorded (if it has steps); finish at the episode limit."""
        if self._episode_steps == 0:
            return False
        self.recorder.end_episode()
        self._returns.append(self._score)
        self._episode_steps, self._score = 0, 0.0
        if self.episodes_wanted is not None and self.recorder.num_episodes >= self.episodes_wanted:
            self._pause_locked(f"{self.episodes_wanted} episode(s) recorded")
            if self.out is not None:
                try:
                    self._save_locked()
                except (demos_lib.DemoError, OSError) as e:
                    self._error = f"could not save: {e}"
            self._finished = True
        return True

    def _restart_locked(self) -> None:
        import jax

        self._key, k = jax.random.split(self._key)
        self._state, obs = self._reset_fn(k)
        self._set_obs(np.asarray(obs)[0])

    def _pause_locked(self, reason: str) -> None:
        self._paused, self._pause_reason = True, reason
        self._keys, self._action = [], 0
        self._seq += 1  # the page's waiting frame request hears of it at once

    def _resume_locked(self) -> None:
        self._paused, self._pause_reason = False, None
        self._seq += 1

    def _check_open_locked(self) -> None:
        if self._finished:
            where = f" (saved to {self._saved['path']})" if self._saved else ""
            raise PlayError(f"this play session is over{where}: start a new one to record more", 409)

    # -------------------------------------------------------------- what the page asks
    def touch(self) -> None:
        self._last_seen = time.monotonic()

    def set_keys(self, keys: Sequence[str]) -> dict[str, Any]:
        keys = list(keys)
        bad = [k for k in keys if k not in KEYS]
        if bad:
            raise PlayError(f"unknown key(s) {bad}: the keys are {', '.join(KEYS)}", 422)
        if len(set(keys)) != len(keys):
            raise PlayError("a key is named twice: send each held key once, oldest press first", 422)
        if len(keys) > MAX_KEYS:
            raise PlayError(f"at most {MAX_KEYS} keys", 422)
        with self._cond:
            self.touch()
            self._check_open_locked()
            self._keys = keys
            self._action = action_for_keys(keys, self.actions)
            if keys and self._paused:
                self._resume_locked()
            self._cond.notify_all()
            return self._status_locked()

    def set_paused(self, paused: bool, reason: str = "user") -> dict[str, Any]:
        with self._cond:
            self.touch()
            self._check_open_locked()
            if paused:
                if not self._paused:
                    self._pause_locked("page lost focus" if reason == "focus" else "paused")
            elif self._paused:
                self._resume_locked()
            self._cond.notify_all()
            return self._status_locked()

    def end_episode(self) -> dict[str, Any]:
        """End the episode being played now; the game restarts (paused)."""
        with self._cond:
            self.touch()
            self._check_open_locked()
            ended = self._close_episode_locked()
            if ended and not self._finished:
                self._restart_locked()
                self._pause_locked("episode ended")
            self._cond.notify_all()
            return dict(self._status_locked(), ended=ended)

    def save(self) -> dict[str, Any]:
        """End the current episode and write every recorded episode to ``out`` (atomically)."""
        with self._cond:
            self.touch()
            if self._finished and self._saved is not None and self._unsaved == 0:
                return dict(self._saved)
            if self.out is None:
                raise PlayError("this session has no output file", 409)
            if self.recorder.num_steps == 0:
                raise PlayError("nothing recorded yet: play first (press a game key or Start)", 409)
            if self._close_episode_locked() and not self._finished:
                self._restart_locked()
            if self._saved is None or self._unsaved:
                self._save_locked()
            if self.stop_after_save:
                self._pause_locked("saved")
                self._finished = True
            elif not self._finished:
                self._pause_locked("saved")
            self._cond.notify_all()
            return dict(self._saved)

    def _save_locked(self) -> None:
        # its first save never replaces a file found at ``out`` (unless ``overwrite``): another session
        # given the same --out may have saved there since this one began; later saves replace its own
        path = self.recorder.save(self.out, overwrite=self.overwrite or self._saved is not None)
        self.out = path
        self._unsaved = 0
        self._saved = dict(path=str(path), steps=self.recorder.num_steps, episodes=self.recorder.num_episodes,
                           returns=list(self._returns))

    def save_if_unsaved(self) -> dict[str, Any] | None:
        """What Ctrl-C does: save if anything was recorded since the last save."""
        with self._cond:
            if self._unsaved == 0 or self.out is None:
                return self._saved
        try:
            return self.save()
        except PlayError:
            return self._saved

    def status(self) -> dict[str, Any]:
        with self._cond:
            self.touch()
            return self._status_locked()

    def _status_locked(self) -> dict[str, Any]:
        return dict(env=self.env_name, fps=self.fps, actions=list(self.actions), keys=list(self._keys),
                    action=self._action, action_name=self.actions[self._action],
                    paused=self._paused, pause_reason=self._pause_reason, finished=self._finished,
                    steps=self.recorder.num_steps, episodes=len(self._returns), episode_steps=self._episode_steps,
                    score=self._score, returns=list(self._returns), episodes_wanted=self.episodes_wanted,
                    env_steps=self._env_steps, saved=self._saved, unsaved_steps=self._unsaved,
                    out=None if self.out is None else str(self.out), error=self._error)

    def frame(self, after: int | None = None, wait: float = 0.0) -> dict[str, Any]:
        """The newest frame, waiting up to ``wait`` s for one newer than ``after``."""
        with self._cond:
            self.touch()
            if after is not None and wait > 0:
                self._cond.wait_for(lambda: self._seq > after or self._stop.is_set(), timeout=wait)
            width, height, channels, data = self._frame
            return dict(self._status_locked(), seq=self._seq, width=width, height=height, channels=channels,
                        data=data)

    def summary(self) -> str:
        with self._cond:
            n, steps = len(self._returns), self.recorder.num_steps
            returns = ", ".join(f"{r:g}" for r in self._returns)
            where = f"saved to {self._saved['path']}" if self._saved else "nothing saved"
        return f"{n} episode(s), {steps} steps recorded" + (f" (returns: {returns})" if n else "") + f"; {where}"

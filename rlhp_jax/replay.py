"""DQfD's replay buffer (layer 4: data): prioritized, frames stored once, demonstrations permanent.

Ibarz et al. 2018, §2.3 and A.3 (after Hester et al. 2018 and Schaul et al. 2015):

* Slots ``[0, D)`` hold the D demonstration transitions, loaded once and never evicted; slots
  ``[D, D + C)`` hold the agent's last C transitions, first in, first out.
* Transition i is drawn with probability ``p_i^α / Σ_k p_k^α`` (α = 0.5) and weighted by the
  importance-sampling weight ``(N·P(i))^-β`` (β = 0.4), normalized by the largest weight in the
  batch.  Its priority is ``|δ| + ε`` (ε = 0.001) or ``|δ| + ε_d`` for demonstrations (ε_d = 3:
  Ibarz's "priority bonus for expert demonstrations"), with δ its 1-step TD error.
* When δ is computed.  Ibarz A.3: priorities are "computed from their TD error at the moment they
  are added to and sampled from the buffer".  Sampled: ``update_priorities`` after each learning
  step.  Added: given ``td_error`` (the learner's |δ| of a batch of transitions, the same dict
  ``sample`` returns less ``index`` and ``true_reward``, ``weight`` all 1), a transition that
  becomes complete (its n successors written) is *unscored*: not drawable, priority 0, until its
  |δ| is computed; so are the demonstrations until the first draw.  That happens in batches of
  ``td_batch`` (one compiled shape; the last batch padded by repeating a transition): as soon as
  ``td_batch`` are waiting, and for all that wait at the start of every ``sample``.  The learner
  draws before it learns, so no update falls between a transition's adding and its scoring: its
  first chance of being drawn is set by the TD error of the networks of the moment it was added,
  as the paper says, at one forward pass per ``td_batch`` new transitions rather than one per
  actor step.  (A trainer that refits r̂ between two draws calls ``score_unscored`` before it, so
  the last few transitions of an iteration are scored with the r̂ they were added under.)
  Schaul et al.'s rule, the largest priority seen so far, is what a new transition gets only
  when no ``td_error`` is given: a buffer used on its own, in tests and benchmarks.
* No rewards are stored for learning: the reward model scores a batch's observations each time
  it is drawn.  The true reward is kept beside each slot for the synthetic oracle and the
  metrics only.

Memory: an Atari observation is a stack of 4 frames of 84×84 and consecutive observations share 3
of them, so each frame is stored once (a ring of frames per actor lane; a slot keeps the index of
its observation's newest frame).  An observation whose older frames do not continue the previous
one's (the first, or envpool's fresh stack after a silent reset) stores its whole stack.  1e6
transitions take 1e6 × 7 KB ≈ 7.1 GB instead of 28 GB.

The buffer is host-side numpy: it is too large to keep beside the learner on most accelerators,
and drawing 32 indices from a sum tree is a few microseconds of vectorized numpy.  The learner
receives fixed-shape batches (``sample``) and returns new priorities (``update_priorities``).

A sampled transition carries the observations at offsets 0…n (n = 3) and ``cont[k]``: whether
step k+1 still belongs to the same episode.  The agent's own experience is one endless episode
(the papers remove episode boundaries), so ``cont`` is always 1 there; demonstration episodes end,
and the n-step return stops at their end (discount 0, §2.3).  Agent steps that are no real
transition (envpool's deferred reset, ``valid`` False) are never drawn as the first step of one.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from rlhp_jax.demos import Demos


def importance_weights(probs: np.ndarray, size: int, beta: float) -> np.ndarray:
    """Schaul et al.'s ``(N·P(i))^-β``, normalized by the batch's largest weight."""
    w = (size * np.asarray(probs, np.float64)) ** (-beta)
    return (w / w.max()).astype(np.float32)


def priorities_from_td(td_abs: np.ndarray, is_demo: np.ndarray, eps: float, eps_demo: float) -> np.ndarray:
    """New priorities after a learning step: ``|δ| + ε``, or ``|δ| + ε_d`` for demonstrations."""
    return np.abs(np.asarray(td_abs, np.float64)) + np.where(is_demo, eps_demo, eps)


class SumTree:
    """Binary sum tree over ``capacity`` leaves (vectorized updates and stratified sampling)."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self.size = 1 << max(0, (self.capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.size, np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def leaves(self, idx=None) -> np.ndarray:
        leaves = self.tree[self.size:self.size + self.capacity]
        return leaves if idx is None else leaves[np.asarray(idx)]

    def set(self, idx, values) -> None:
        idx = np.asarray(idx, np.int64).reshape(-1)
        if idx.size == 0:
            return
        values = np.broadcast_to(np.asarray(values, np.float64), idx.shape)
        node = idx + self.size
        self.tree[node] = values  # later duplicates win, as with sequential updates
        node = np.unique(node // 2)
        while node[0] >= 1:
            self.tree[node] = self.tree[2 * node] + self.tree[2 * node + 1]
            if node[0] == 1:
                break
            node = np.unique(node // 2)

    def rebuild(self, leaves: np.ndarray) -> None:
        self.tree[:] = 0.0
        self.tree[self.size:self.size + self.capacity] = leaves
        for lo in (self.size >> np.arange(1, self.size.bit_length())):
            self.tree[lo:2 * lo] = self.tree[2 * lo:4 * lo:2] + self.tree[2 * lo + 1:4 * lo:2]

    def find(self, values: np.ndarray) -> np.ndarray:
        """Leaf index whose cumulative range holds each value (values in [0, total))."""
        values = np.asarray(values, np.float64).copy()
        node = np.ones(values.shape, np.int64)
        while node[0] < self.size:
            left = 2 * node
            go_right = values >= self.tree[left]
            values = np.where(go_right, values - self.tree[left], values)
            node = np.where(go_right, left + 1, left)
        return np.minimum(node - self.size, self.capacity - 1)


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    capacity: int = 1_000_000  # Ibarz A.3: 1e6 actor transitions (plus the permanent demos)
    alpha: float = 0.5  # A.3: priority exponent
    beta: float = 0.4  # A.3: importance-sampling exponent
    eps: float = 1e-3  # Hester et al.: ε_a added to agent priorities
    eps_demo: float = 3.0  # Ibarz A.3: priority bonus ε_d for demonstrations
    n_step: int = 3  # A.3: 1- and 3-step returns

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"replay capacity must be >= 1, got {self.capacity}")
        if self.n_step < 1:
            raise ValueError(f"n_step must be >= 1, got {self.n_step}")


TDError = Callable[[dict[str, np.ndarray]], Any]  # a batch of transitions -> |δ| [B]


class PrioritizedReplay:
    """Demonstrations (permanent) + ``lanes`` FIFO rings of agent experience, one per actor.

    ``td_error``: the learner's |δ| of a batch of transitions, to give each transition its TD
    error's priority when it is added (module docstring); its batches have ``td_batch`` rows in
    the layout ``td_stack_last`` says (as ``sample``'s ``stack_last``).  None: new transitions
    get the largest priority seen so far."""

    def __init__(self, config: ReplayConfig, obs_shape: tuple[int, ...], stack: int, obs_dtype,
                 demos: Demos | None = None, lanes: int = 1, td_error: TDError | None = None,
                 td_batch: int = 32, td_stack_last: bool = True):
        if td_batch < 1:
            raise ValueError(f"td_batch must be >= 1, got {td_batch}")
        self.td_error, self.td_batch, self.td_stack_last = td_error, int(td_batch), bool(td_stack_last)
        self.cfg = config
        self.obs_shape = tuple(obs_shape)
        self.stack = int(stack)
        self.frame_shape = self.obs_shape[:-1] if self.stack > 1 else self.obs_shape
        self.dtype = np.dtype(obs_dtype)
        self.lanes = int(lanes)
        if config.capacity < self.lanes * (config.n_step + 2):
            raise ValueError(f"replay capacity {config.capacity} is too small for {lanes} actor lanes")
        self.lane_cap = config.capacity // self.lanes
        self.demos = demos
        self.num_demo = 0 if demos is None else demos.num_steps
        total = self.num_demo + self.lanes * self.lane_cap
        self.tree = SumTree(total)
        self.max_priority = 1.0
        self.unscored = np.zeros(total, bool)  # complete, waiting for its TD error (never drawable)
        # demo slots: what a transition needs beyond the stored frames
        if demos is not None:
            self.demo_cont = ~demos.episode_end
            self.demo_true = (demos.rewards if demos.rewards is not None
                              else np.zeros(demos.num_steps, np.float32)).astype(np.float32)
            if td_error is None:
                self.tree.set(np.arange(self.num_demo), self._scaled(self.max_priority + config.eps_demo))
            else:  # scored before the first draw, by the networks of that moment
                self.unscored[:self.num_demo] = True
        # agent lanes: a ring of frames and a ring of steps each (steps counted from 0, absolute)
        self.frame_cap = self.lane_cap + 8 * self.stack
        self.frames = np.zeros((self.lanes, self.frame_cap, *self.frame_shape), self.dtype)
        self.newest = np.zeros((self.lanes, self.lane_cap), np.int64)  # absolute frame index of obs
        self.oldest = np.zeros((self.lanes, self.lane_cap), np.int64)  # absolute index of its oldest frame
        self.action = np.zeros((self.lanes, self.lane_cap), np.int32)
        self.valid = np.zeros((self.lanes, self.lane_cap), bool)
        self.true_reward = np.zeros((self.lanes, self.lane_cap), np.float32)
        self.steps = np.zeros(self.lanes, np.int64)  # steps written per lane
        self.frames_written = np.zeros(self.lanes, np.int64)
        self.evicted = np.zeros(self.lanes, np.int64)  # steps [0, evicted) are gone (or unusable)
        self._prev: list[np.ndarray | None] = [None] * self.lanes

    # ------------------------------------------------------------------ bookkeeping
    def _scaled(self, priority):
        return np.asarray(priority, np.float64) ** self.cfg.alpha

    def _slot(self, lane, step):
        return self.num_demo + np.asarray(lane) * self.lane_cap + np.asarray(step) % self.lane_cap

    def __len__(self) -> int:
        return self.num_demo + int(np.sum(np.minimum(self.steps, self.lane_cap)))

    @property
    def agent_transitions(self) -> int:
        return int(np.sum(np.minimum(self.steps, self.lane_cap)))

    # ------------------------------------------------------------------ writing
    def add(self, obs: np.ndarray, action: np.ndarray, valid: np.ndarray, true_reward: np.ndarray) -> None:
        """One step of every actor lane: ``obs [lanes, *obs_shape]`` (the observation the action
        was taken in), ``action [lanes]``, ``valid [lanes]`` (False: envpool's deferred reset),
        ``true_reward [lanes]`` (oracle/metrics only)."""
        obs = np.asarray(obs)
        n = self.cfg.n_step
        for lane in range(self.lanes):
            o = obs[lane].astype(self.dtype, copy=False)
            prev = self._prev[lane]
            if self.stack > 1 and prev is not None and np.array_equal(o[..., :-1], prev[..., 1:]):
                new = [o[..., -1]]
            else:
                new = [o] if self.stack == 1 else [o[..., i] for i in range(self.stack)]
            fw = self.frames_written[lane]
            for j, f in enumerate(new):
                self.frames[lane, (fw + j) % self.frame_cap] = f
            fw += len(new)
            self.frames_written[lane] = fw
            self._prev[lane] = o
            s = self.steps[lane]
            pos = s % self.lane_cap
            if s >= self.lane_cap:  # the ring wraps: the oldest step leaves
                self.evicted[lane] = max(self.evicted[lane], s - self.lane_cap + 1)
            self.newest[lane, pos] = fw - 1
            self.oldest[lane, pos] = fw - (1 if self.stack == 1 else self.stack)
            self.action[lane, pos] = int(action[lane])
            self.valid[lane, pos] = bool(valid[lane])
            self.true_reward[lane, pos] = float(true_reward[lane])
            self._forget(self._slot(lane, s))  # not drawable until its n successors exist
            self.steps[lane] = s + 1
            # steps whose oldest frame the frame ring has overwritten are unusable from now on
            e = self.evicted[lane]
            while e < s and self.oldest[lane, e % self.lane_cap] < fw - self.frame_cap:
                self._forget(self._slot(lane, e))
                e += 1
            self.evicted[lane] = e
            ready = s - n  # its successors s-n+1 … s are now written
            if ready >= e and ready >= 0 and self.valid[lane, ready % self.lane_cap]:
                if self.td_error is None:
                    self.tree.set(self._slot(lane, ready), self._scaled(self.max_priority))
                else:
                    self.unscored[self._slot(lane, ready)] = True
        if self.td_error is not None and np.count_nonzero(self.unscored) >= self.td_batch:
            self.score_unscored()

    def _forget(self, slot) -> None:
        """A slot that holds no drawable transition (being written, evicted, or no transition)."""
        self.tree.set(slot, 0.0)
        self.unscored[slot] = False

    def score_unscored(self) -> int:
        """Give every unscored transition its TD error's priority (module docstring); returns how
        many.  ``sample`` calls it first; call it yourself to score them earlier."""
        idx = np.flatnonzero(self.unscored)
        if idx.size == 0:
            return 0
        if self.td_error is None:  # waiting in a checkpoint of a run that had a td_error
            self.tree.set(idx, self._scaled(self.max_priority + np.where(idx < self.num_demo, self.cfg.eps_demo, 0.0)))
            self.unscored[idx] = False
            return int(idx.size)
        b = self.td_batch
        for lo in range(0, idx.size, b):
            chunk = idx[lo:lo + b]
            padded = np.concatenate([chunk, np.full(b - chunk.size, chunk[-1])])
            batch = self.transitions(padded, self.td_stack_last)
            batch.pop("true_reward")  # the oracle's, never the learner's
            batch["weight"] = np.ones(b, np.float32)
            td = np.asarray(self.td_error(batch), np.float64).reshape(-1)
            if td.shape != (b,):
                raise ValueError(f"td_error returned {td.shape[0]} values for a batch of {b}")
            pr = priorities_from_td(td[:chunk.size], chunk < self.num_demo, self.cfg.eps, self.cfg.eps_demo)
            self.max_priority = max(self.max_priority, float(pr.max()))
            self.tree.set(chunk, self._scaled(pr))
        self.unscored[idx] = False
        return int(idx.size)

    def mark_discontinuity(self) -> None:
        """The next step does not follow the last one (a resumed run restarts its emulators): the
        last step of each lane is no transition, and the next observation stores its whole stack."""
        for lane in range(self.lanes):
            self._prev[lane] = None
            s = int(self.steps[lane]) - 1
            if s >= self.evicted[lane]:
                self.valid[lane, s % self.lane_cap] = False
                self._forget(self._slot(lane, s))

    # ------------------------------------------------------------------ reading
    def _decode(self, idx: np.ndarray):
        """Slot indices -> (is_demo, demo step or (lane, absolute step))."""
        idx = np.asarray(idx, np.int64)
        is_demo = idx < self.num_demo
        rel = np.where(is_demo, 0, idx - self.num_demo)
        lane = rel // self.lane_cap
        pos = rel % self.lane_cap
        # the absolute step currently held at (lane, pos): the newest step with that position
        last = self.steps[lane] - 1
        step = last - ((last - pos) % self.lane_cap)
        return is_demo, lane, step

    def _agent_obs(self, lane, step, stack_last: bool = True):
        pos = step % self.lane_cap
        newest = self.newest[lane, pos]
        if self.stack == 1:
            return self.frames[lane, newest % self.frame_cap]
        ring = (newest[..., None] + np.arange(1 - self.stack, 1)) % self.frame_cap
        stacked = self.frames[np.asarray(lane)[..., None], ring]  # [..., stack, *frame]
        return np.moveaxis(stacked, -len(self.frame_shape) - 1, -1) if stack_last else stacked

    def transitions(self, idx: np.ndarray, stack_last: bool = True) -> dict[str, np.ndarray]:
        """The learner's view of slots ``idx``: obs [B, n+1, ...], action [B, n+1] (the action at
        each offset), cont [B, n] float32, is_demo [B] bool, true_reward [B, n] (metrics only).

        ``stack_last=False`` returns stacked observations as [B, n+1, stack, *frame] (the learner
        moves the axis on the device: the host-side transpose costs 20× the gather)."""
        n = self.cfg.n_step
        idx = np.asarray(idx, np.int64)
        b = idx.shape[0]
        is_demo, lane, step = self._decode(idx)
        shape = self.obs_shape if (stack_last or self.stack == 1) else (self.stack, *self.frame_shape)
        obs = np.zeros((b, n + 1, *shape), self.dtype)
        action = np.zeros((b, n + 1), np.int32)
        cont = np.ones((b, n), np.float32)
        true = np.zeros((b, n), np.float32)
        d = np.flatnonzero(is_demo)
        if d.size:
            alive = np.ones(d.size, bool)
            cur = idx[d].copy()
            for k in range(n + 1):
                obs[d, k] = self.demos.obs(cur, stack_last)
                action[d, k] = self.demos.actions[cur]
                if k < n:
                    true[d, k] = np.where(alive, self.demo_true[cur], 0.0)
                    c = self.demo_cont[cur] & alive
                    cont[d, k] = c
                    alive = c
                    cur = np.where(c, cur + 1, cur)  # past an episode's end: stay (masked by cont)
        a = np.flatnonzero(~is_demo)
        if a.size:
            for k in range(n + 1):
                st = step[a] + k
                obs[a, k] = self._agent_obs(lane[a], st, stack_last)
                action[a, k] = self.action[lane[a], st % self.lane_cap]
                if k < n:
                    true[a, k] = self.true_reward[lane[a], st % self.lane_cap]
        return dict(obs=obs, action=action, cont=cont, is_demo=is_demo, true_reward=true)

    def sample(self, rng: np.random.Generator, batch_size: int, beta: float | None = None,
               demo_only: bool = False, stack_last: bool = True) -> dict[str, np.ndarray]:
        """A prioritized batch (stratified over the priority mass): ``transitions`` plus
        ``index`` [B] and ``weight`` [B] (importance sampling)."""
        beta = self.cfg.beta if beta is None else beta
        self.score_unscored()  # what was added since the last draw: TD-error priorities first
        if demo_only:
            if self.num_demo == 0:
                raise ValueError("no demonstrations in the replay buffer to pretrain on")
            total = float(self.tree.tree[self.tree.size:self.tree.size + self.num_demo].sum())
        else:
            total = self.tree.total
        if total <= 0:
            raise ValueError("the replay buffer holds no transition that can be drawn yet")
        u = (np.arange(batch_size) + rng.random(batch_size)) * (total / batch_size)
        if demo_only:
            cum = np.cumsum(self.tree.leaves()[:self.num_demo])
            idx = np.minimum(np.searchsorted(cum, u, side="right"), self.num_demo - 1)
        else:
            idx = self.tree.find(u)
        p = self.tree.leaves(idx)
        # a float rounding can land on an empty leaf: move those draws to a drawable one
        bad = p <= 0
        if bad.any():
            live = np.flatnonzero(self.tree.leaves()[:self.num_demo] > 0) if demo_only \
                else np.flatnonzero(self.tree.leaves() > 0)
            idx[bad] = live[rng.integers(0, live.size, bad.sum())]
            p = self.tree.leaves(idx)
        size = self.num_demo if demo_only else len(self)  # N of (N·P)^-β: the transitions held
        batch = self.transitions(idx, stack_last)
        batch.update(index=idx, weight=importance_weights(p / total, max(size, 1), beta))
        return batch

    def update_priorities(self, idx: np.ndarray, td_abs: np.ndarray) -> None:
        """After a learning step: priority ``|δ| + ε`` (``+ ε_d`` on demonstrations).  Slots that
        were overwritten since they were drawn are left alone."""
        idx = np.asarray(idx, np.int64)
        is_demo = idx < self.num_demo
        pr = priorities_from_td(td_abs, is_demo, self.cfg.eps, self.cfg.eps_demo)
        live = self.tree.leaves(idx) > 0
        if live.any():  # a slot overwritten since it was drawn must not raise new steps' priority
            self.max_priority = max(self.max_priority, float(pr[live].max()))
        self.tree.set(idx[live], self._scaled(pr[live]))

    # ------------------------------------------------------------------ clips for labels
    def recent_segment_starts(self, since: np.ndarray, length: int) -> list[np.ndarray]:
        """Per lane: absolute steps t ≥ ``since[lane]`` where t … t+length-1 are all written, still
        held, and real transitions (the clips of the latest iteration, Ibarz A.4)."""
        out = []
        for lane in range(self.lanes):
            lo = max(int(since[lane]), int(self.evicted[lane]))
            hi = int(self.steps[lane]) - length
            if hi < lo:
                out.append(np.zeros(0, np.int64))
                continue
            steps = np.arange(lo, int(self.steps[lane]))
            bad = ~self.valid[lane, steps % self.lane_cap]
            # a window is usable when it holds no invalid step
            cum = np.concatenate([[0], np.cumsum(bad)])
            starts = np.arange(lo, hi + 1)
            ok = cum[starts - lo + length] - cum[starts - lo] == 0
            out.append(starts[ok])
        return out

    def segments(self, lanes: np.ndarray, starts: np.ndarray, length: int) -> dict[str, np.ndarray]:
        """Clips ``[B, length, ...]`` of agent experience: obs, action, true_reward."""
        steps = starts[:, None] + np.arange(length)[None]
        ln = np.broadcast_to(lanes[:, None], steps.shape)
        obs = self._agent_obs(ln.reshape(-1), steps.reshape(-1)).reshape(*steps.shape, *self.obs_shape)
        pos = steps % self.lane_cap
        return dict(obs=obs, action=self.action[ln, pos], true_reward=self.true_reward[ln, pos])

    def recent_steps(self, rng: np.random.Generator, since: np.ndarray, num: int) -> dict[str, np.ndarray]:
        """``num`` random agent observations written since ``since`` (metrics: model vs true reward)."""
        lanes, steps = [], []
        for lane in range(self.lanes):
            lo = max(int(since[lane]), int(self.evicted[lane]))
            s = np.arange(lo, int(self.steps[lane]))
            s = s[self.valid[lane, s % self.lane_cap]]
            lanes.append(np.full(s.size, lane))
            steps.append(s)
        lanes, steps = np.concatenate(lanes), np.concatenate(steps)
        if steps.size == 0:
            return dict(obs=np.zeros((0, *self.obs_shape), self.dtype), action=np.zeros(0, np.int32),
                        true_reward=np.zeros(0, np.float32))
        pick = rng.choice(steps.size, size=min(num, steps.size), replace=False)
        lanes, steps = lanes[pick], steps[pick]
        return dict(obs=self._agent_obs(lanes, steps), action=self.action[lanes, steps % self.lane_cap],
                    true_reward=self.true_reward[lanes, steps % self.lane_cap])

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue (the demonstrations come from their file)."""
        return dict(frames=self.frames, newest=self.newest, oldest=self.oldest, action=self.action,
                    valid=self.valid, true_reward=self.true_reward, steps=self.steps,
                    frames_written=self.frames_written, evicted=self.evicted,
                    priorities=self.tree.leaves().copy(), max_priority=np.asarray(self.max_priority),
                    unscored=self.unscored.copy(),
                    prev=np.stack([np.zeros(self.obs_shape, self.dtype) if p is None else p for p in self._prev]),
                    has_prev=np.asarray([p is not None for p in self._prev]))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for k in ("frames", "newest", "oldest", "action", "valid", "true_reward", "steps", "frames_written",
                  "evicted"):
            getattr(self, k)[...] = np.asarray(state[k])
        self.tree.rebuild(np.asarray(state["priorities"], np.float64))
        self.max_priority = float(state["max_priority"])
        # (a checkpoint from before TD-error priorities on adding has none waiting)
        self.unscored[:] = np.asarray(state["unscored"]) if "unscored" in state else False
        prev, has = np.asarray(state["prev"]), np.asarray(state["has_prev"])
        self._prev = [prev[i].copy() if has[i] else None for i in range(self.lanes)]


def replay_memory_bytes(capacity: int, obs_shape: tuple[int, ...], stack: int, itemsize: int = 1) -> int:
    """Bytes the agent part of a buffer of ``capacity`` transitions needs when full."""
    frame = int(np.prod(obs_shape[:-1] if stack > 1 else obs_shape)) * itemsize
    per_slot = 8 + 8 + 4 + 1 + 4 + 1  # newest, oldest, action, valid, true_reward, unscored
    return (capacity + 8 * stack) * frame + capacity * per_slot + 2 * 8 * (1 << (capacity - 1).bit_length())

"""Memory and speed of DQfD's replay buffer and learning step (Ibarz et al. 2018, A.3).

    python -m experiments.bench_replay                       # 1e6 Atari transitions
    python -m experiments.bench_replay --capacity 200000 --learn-steps 50

Fills a buffer of ``--capacity`` 84×84×4 Atari transitions (frames stored once) with a stream of
random frames, and reports the process's resident memory before and after, add / sample /
priority-update rates, and the rate of full DQfD learning steps (batch 32: sample, r̂ of the
batch by the A.3 reward CNN, the dueling double-Q update with the margin loss) on this backend.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import time

import numpy as np


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024**2
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bench_replay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity", type=int, default=1_000_000)
    p.add_argument("--demo-steps", type=int, default=20_000, help="permanent demonstration transitions")
    p.add_argument("--samples", type=int, default=2000)
    p.add_argument("--learn-steps", type=int, default=100)
    args = p.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from rlhp_jax.agents.dqfd import DQfD
    from rlhp_jax.demos import DemoRecorder, FrameFormat, read_demos
    from rlhp_jax.ensemble import EnsembleConfig, RewardEnsemble
    from rlhp_jax.core import EnvSpec
    from rlhp_jax.replay import PrioritizedReplay, ReplayConfig, replay_memory_bytes
    from rlhp_jax.reward_models import reward_model_spec_for

    rng = np.random.default_rng(0)
    result = dict(device=jax.devices()[0].device_kind, backend=jax.default_backend(), jax=jax.__version__,
                  machine=platform.machine(), cpus=__import__("os").cpu_count(), capacity=args.capacity)
    # demonstrations: a stream of frames written once
    fmt = FrameFormat(env="Bench", obs_shape=(84, 84, 4), frame_shape=(84, 84), stack=4, obs_dtype="uint8",
                      num_actions=18, mask_sha1="none")
    rec = DemoRecorder(fmt, source="bench")
    obs = rng.integers(0, 255, (84, 84, 4), np.uint8)
    for t in range(args.demo_steps):
        obs = np.concatenate([obs[..., 1:], rng.integers(0, 255, (84, 84, 1), np.uint8)], -1)
        rec.add(obs, int(rng.integers(18)), 0.0)
        if t % 5000 == 4999:
            rec.end_episode()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        demos = read_demos(rec.save(f"{d}/demos.npz"))
    result["rss_before_gb"] = rss_gb()
    replay = PrioritizedReplay(ReplayConfig(capacity=args.capacity), (84, 84, 4), 4, np.uint8, demos, lanes=1)
    result["predicted_full_gb"] = replay_memory_bytes(args.capacity, (84, 84, 4), 4) / 1e9
    t0 = time.perf_counter()
    obs = rng.integers(0, 255, (1, 84, 84, 4), np.uint8)
    frames = rng.integers(0, 255, (4096, 84, 84, 1), np.uint8)  # recycled: generating frames is not the point
    act, valid, rew = np.zeros(1, np.int32), np.ones(1, bool), np.zeros(1, np.float32)
    for t in range(args.capacity):
        obs = np.concatenate([obs[..., 1:], frames[None, t % 4096]], -1)
        replay.add(obs, act, valid, rew)
    fill_s = time.perf_counter() - t0
    result.update(add_per_s=args.capacity / fill_s, rss_full_gb=rss_gb(), frames_gb=replay.frames.nbytes / 1e9,
                  transitions=len(replay))
    t0 = time.perf_counter()
    for _ in range(args.samples):
        b = replay.sample(rng, 32, stack_last=False)
        replay.update_priorities(b["index"], rng.random(32))
    result["sample_update_per_s"] = args.samples / (time.perf_counter() - t0)
    # full learning steps: sample -> device -> r̂ -> DQfD update -> priorities
    spec = EnvSpec(name="Bench", obs_shape=(84, 84, 4), discrete=True, num_actions=18, action_low=None,
                   action_high=None, horizon=27000, terminal_penalty=0.0, segment_length=25, reward_std=0.05)
    agent = DQfD(spec)
    rm = RewardEnsemble(reward_model_spec_for(spec), EnsembleConfig(num_members=1, reward_std=0.05))
    state, rm_state = agent.init(jax.random.PRNGKey(0)), rm.init(jax.random.PRNGKey(1))

    @jax.jit
    def learn(state, rm_state, batch):
        batch = dict(batch, obs=jnp.moveaxis(batch["obs"], 2, -1))  # the replay hands over stack-first
        o = batch["obs"][:, :3]
        r = rm.predict_reward(rm_state, o.reshape(-1, 84, 84, 4), batch["action"][:, :3].reshape(-1)).reshape(-1, 3)
        return agent.update(state, batch, r)

    def step(state):
        b = replay.sample(rng, 32, stack_last=False)
        idx = b.pop("index")
        b.pop("true_reward")
        state, m, td = learn(state, rm_state, b)
        replay.update_priorities(idx, np.asarray(td))
        return state

    state = step(state)  # compile
    jax.block_until_ready(state)
    t0 = time.perf_counter()
    for _ in range(args.learn_steps):
        state = step(state)
    jax.block_until_ready(state)
    result["learn_steps_per_s"] = args.learn_steps / (time.perf_counter() - t0)
    result["actor_steps_per_s_at_learning_bound"] = 4 * result["learn_steps_per_s"]  # an update every 4 steps
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

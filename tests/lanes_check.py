"""Runs the test lanes of ``tests/test_compiled.py`` in a process of its own, where the device count
can be chosen (XLA flags must be set before JAX starts), and saves what the tests compare.

    python tests/lanes_check.py reference OUT.npz     # 8 CPU devices: lanes unsharded, sharded over 8 devices
                                                      # (in blocks, for a progress function), and over 2
                                                      # groups of 2 (environments) × 2 (members)
    python tests/lanes_check.py host I N PORT OUT.npz # process I of N (2 CPU devices each), lanes over all
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np

LANES = dict(seeds=[0, 1], labels=[12, 8], mistake_rate=[0.0, 0.25])  # 8 lanes


def test_config():
    from rlhp_jax.agents.ppo import PPOConfig
    from rlhp_jax.config import RunConfig

    from rlhp_jax.ensemble import EnsembleConfig

    agent = PPOConfig(num_envs=4, num_steps=64, update_epochs=2, num_minibatches=2)
    # Two members, vmapped: the members can then be split over two devices within a lane.
    ensemble = EnsembleConfig(num_members=2, member_axis="vmap")
    return RunConfig(env="CartPole-v1", total_steps=2 * 256, labels=12, segment_length=10, agent_config=agent,
                     ensemble=ensemble,
                     pretrain_steps=10, fit_steps=5, eval_every=2, eval_episodes=2, correlation_segments=32,
                     out="unused")


def lanes(program):
    grid = dict(LANES)
    return program.lanes(grid.pop("seeds"), **grid)


def output_bias_leaves(params) -> list[int]:
    """Leaf indices of the reward model's output-layer bias.  It adds one constant to every reward,
    which the Bradley-Terry loss cannot see: its gradient is float noise alone, and Adam walks it
    by ±lr per step in whichever direction a batched or sharded program's rounding points, so
    comparisons between programs leave it out."""
    import jax

    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    last = max({p.split("']")[0] for p in paths if "Dense_" in p}, key=lambda d: int(d.rsplit("_", 1)[1]))
    return [j for j, p in enumerate(paths) if p.startswith(last) and p.endswith("['bias']")]


def outcome(finals, metrics) -> dict:
    """What the tests compare, as NumPy: labels, their clips, reward-model parameters, metrics."""
    import jax

    from rlhp_jax.distributed import gather

    finals, metrics = gather((finals, metrics))
    params = jax.tree.leaves(finals.ensemble.params)
    out = dict(mu=finals.buffer.mu, obs=finals.buffer.obs, filled=finals.buffer.filled, labels=finals.labels,
               output_bias=np.asarray(output_bias_leaves(finals.ensemble.params)),
               **{f"param{i}": p for i, p in enumerate(params)}, **{f"m_{k}": v for k, v in metrics.items()})
    return {k: np.asarray(v) for k, v in out.items()}


def main(argv):
    mode = argv[0]
    devices = 8 if mode == "reference" else 2
    # the device count, after what the suite passes on (conftest.FAST_COMPILE's fast compilation)
    os.environ["XLA_FLAGS"] = " ".join([*os.environ.get("XLA_FLAGS", "").split(),
                                        f"--xla_force_host_platform_device_count={devices}"])
    import jax

    if mode == "host":
        from rlhp_jax.distributed import initialize

        process, count, port = int(argv[1]), int(argv[2]), int(argv[3])
        initialize(f"127.0.0.1:{port}", count, process)
    from rlhp_jax.compiled import CompiledRun
    from rlhp_jax.distributed import lane_mesh

    program = CompiledRun(test_config())
    keys, hypers, rows = lanes(program)
    if mode == "reference":
        assert len(jax.devices()) == 8, jax.devices()
        plain = outcome(*program.train_lanes(keys, hypers))
        # sharded over 8 devices, and with a progress function: blocks of iterations called from the
        # host, here one block of 3 for the 2 iterations (the third skipped); progress is told of each
        # iteration between blocks (the envs × members mesh below runs as one program)
        told = []
        program.progress = lambda it, m: told.append([it, *np.shape(m["labels"])])
        sharded_out = program.train_lanes(keys, hypers, mesh=lane_mesh(), block=3)
        program.progress = None
        shards = {str(s.device) for s in sharded_out[1]["labels"].addressable_shards}
        sharded = outcome(*sharded_out)
        within_out = program.train_lanes(keys, hypers, mesh=lane_mesh(envs=2, members=2))
        member_shard = within_out[0].ensemble.params["Dense_0"]["kernel"].addressable_shards[0].data.shape
        env_shard = within_out[0].obs.addressable_shards[0].data.shape
        within = outcome(*within_out)
        np.savez(argv[1], **{f"plain_{k}": v for k, v in plain.items()}, **{f"sharded_{k}": v for k, v in sharded.items()},
                 **{f"within_{k}": v for k, v in within.items()},
                 progress_told=np.asarray(told), devices_used=np.asarray(len(shards)),
                 member_shard=np.asarray(member_shard), env_shard=np.asarray(env_shard))
    else:
        assert jax.process_count() == count and len(jax.devices()) == 2 * count, jax.devices()
        result = outcome(*program.train_lanes(keys, hypers, mesh=lane_mesh()))
        if jax.process_index() == 0:
            np.savez(argv[4], **result, processes=np.asarray(jax.process_count()),
                     devices=np.asarray(len(jax.devices())))
    print("ok", mode, dataclasses.asdict(program.config)["env"])


if __name__ == "__main__":
    main(sys.argv[1:])

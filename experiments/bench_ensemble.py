"""Benchmark: reward-ensemble training, members vmapped, walked in a loop, or unrolled.

    python -m experiments.bench_ensemble                  # MLP and CNN, 1 and 3 members
    python -m experiments.bench_ensemble --models mlp --steps 200

Prints one line per setting (steps/s and clip pairs/s of a second fit call, so compile time is
excluded) and a JSON list at the end; record the figures in BUILD_NOTES.md with the device they ran on.
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np

from rlhp_jax.ensemble import EnsembleConfig, RewardEnsemble
from rlhp_jax.labels import SegmentPairs, add_labels
from rlhp_jax.reward_models import RewardModelSpec

SPECS = {
    # A.1 MLP on a MuJoCo-sized input (HalfCheetah: 17-dim obs, 6-dim action), 50-step clips
    "mlp": (RewardModelSpec("mlp", (17,), (6,), "float32", 6, False), 50, 64),
    # A.2 CNN on 84x84x4 frames, 25-step clips, batches of 16 pairs (Ibarz A.3)
    "cnn": (RewardModelSpec("cnn", (84, 84, 4), (), "int32", 6, True), 25, 16),
}


def bench(kind: str, members: int, mode: str, steps: int, fit_loop: str = "auto", capacity: int = 64,
          batch: int | None = None, segment_length: int | None = None, repeats: int = 1,
          noise: float | None = None) -> dict:
    """Time ``steps`` steps of ``fitter()`` for one setting: best of ``repeats`` calls after a first
    call that compiles.  ``batch`` (pairs per member per step) and ``segment_length`` default to
    the setting of ``SPECS``; ``capacity`` is the size of the (full) label buffer; ``noise`` the
    input noise (default: Ibarz A.3's 0.1 for the CNN, none for the MLP)."""
    spec, seg_len, default_batch = SPECS[kind]
    seg_len = segment_length or seg_len
    batch = batch or default_batch
    cfg = EnsembleConfig(num_members=members, member_axis=mode, fit_loop=fit_loop, batch_size=batch,
                         input_noise=(0.1 if kind == "cnn" else 0.0) if noise is None else noise)
    ens = RewardEnsemble(spec, cfg)
    key = jax.random.PRNGKey(0)
    rng = np.random.default_rng(0)  # random clips built on the host: no XLA compilation per op
    if kind == "cnn":
        obs = rng.integers(0, 255, (capacity, 2, seg_len, *spec.obs_shape), dtype=np.uint8)
        act = np.zeros((capacity, 2, seg_len), np.int32)
    else:
        obs = rng.normal(size=(capacity, 2, seg_len, *spec.obs_shape)).astype(np.float32)
        act = rng.normal(size=(capacity, 2, seg_len, *spec.action_shape)).astype(np.float32)
    pairs = SegmentPairs(obs, act, np.zeros((capacity, 2, seg_len), np.float32))
    mu = (rng.uniform(size=capacity) > 0.5).astype(np.float32)
    # setup, not timed: jitted, since eager op-by-op dispatch compiles every op on its own
    buf = jax.jit(add_labels)(ens.empty_buffer(capacity, seg_len), key, pairs, mu)
    state = jax.jit(ens.init)(key)

    fit = ens.fitter()  # as the driver runs it: one scan, or a host loop over the compiled step
    t0 = time.perf_counter()
    out = fit(state, buf, key, steps)
    jax.block_until_ready(out)
    first_s = time.perf_counter() - t0  # compile + one run
    dt = float("inf")
    for i in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = fit(out[0], buf, jax.random.PRNGKey(1 + i), steps)
        jax.block_until_ready(out)
        dt = min(dt, time.perf_counter() - t0)
    return dict(model=kind, members=members, member_axis=ens.mode, backend=jax.default_backend(),
                device=str(jax.devices()[0].device_kind), steps_per_s=steps / dt,
                pairs_per_s=steps * batch * members / dt, fit_loop=ens.fit_loop(), first_call_s=first_s, batch_pairs=batch,
                segment_length=seg_len, steps=steps, seconds=dt, capacity=capacity)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=list(SPECS))
    p.add_argument("--members", nargs="+", type=int, default=[1, 3])
    p.add_argument("--axes", nargs="+", default=["vmap", "map", "unroll"], choices=["vmap", "map", "unroll"])
    p.add_argument("--fit-loop", default="auto", choices=["auto", "scan", "host"])
    p.add_argument("--steps", type=int, default=None, help="timed steps (default: 300 MLP, 5 CNN)")
    args = p.parse_args(argv)
    results = []
    for kind in args.models:
        steps = args.steps or (300 if kind == "mlp" else 5)
        for m in args.members:
            for mode in args.axes:
                r = bench(kind, m, mode, steps, args.fit_loop)
                results.append(r)
                print(f"{kind:3s} members={m} {mode:4s}: {r['steps_per_s']:8.1f} steps/s "
                      f"{r['pairs_per_s']:9.0f} pairs/s ({r['fit_loop']} loop; first call incl. compile {r['first_call_s']:.1f} s) on {r['device']}",
                      flush=True)
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

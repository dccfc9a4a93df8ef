"""Benchmark: what a compilation costs as the persistent compilation cache fills up.

    python -m experiments.bench_compile_cache                    # this project's setting (prune once per process)
    python -m experiments.bench_compile_cache --jax-bound        # JAX's own size bound (a directory scan per write)
    python -m experiments.bench_compile_cache --programs 1200 --every 200

Compiles ``--programs`` small, distinct jitted programs into an empty cache in a temporary directory
and prints the seconds each block of ``--every`` took, so the growth with the cache's size shows.
With ``--jax-bound``, JAX bounds the directory itself (``jax_compilation_cache_max_size`` =
``compile_cache.MAX_BYTES``): every write globs every entry and reads its access stamp under a
file lock.  Without it, as the entry points run (``compile_cache.enable``), JAX writes unbounded
and ``compile_cache.prune`` bounds the directory once, at start.
"""

from __future__ import annotations

import argparse
import tempfile
import time


def main(argv=None) -> list[float]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--programs", type=int, default=1000)
    p.add_argument("--every", type=int, default=200)
    p.add_argument("--jax-bound", action="store_true", help="let JAX bound the directory (its LRU mode)")
    args = p.parse_args(argv)
    import jax
    import jax.numpy as jnp

    from rlhp_jax import compile_cache

    with tempfile.TemporaryDirectory() as d:
        compile_cache.enable(d)
        if args.jax_bound:
            jax.config.update("jax_compilation_cache_max_size", compile_cache.MAX_BYTES)
        blocks, t = [], time.perf_counter()
        for i in range(1, args.programs + 1):
            jax.jit(lambda x, i=i: x * i + jnp.sin(x) * (i + 1))(jnp.ones(i)).block_until_ready()
            if i % args.every == 0:
                blocks.append(time.perf_counter() - t)
                print(f"programs {i - args.every + 1}-{i}: {blocks[-1]:.1f} s "
                      f"({1000 * blocks[-1] / args.every:.0f} ms each)", flush=True)
                t = time.perf_counter()
    return blocks


if __name__ == "__main__":
    main()

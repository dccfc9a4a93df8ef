"""How fast the human-feedback plumbing is: the labeling API under many labelers, and the time to
prepare one pair (save segments, render and encode two clips) on the worker thread.

    python -m experiments.bench_human                       # both, CartPole + HalfCheetah + Pong pairs
    python -m experiments.bench_human --labelers 1 8 32 --pairs 400
"""

from __future__ import annotations

import argparse
import concurrent.futures
import tempfile
import time
from pathlib import Path

import numpy as np


def bench_api(labelers: int, pairs: int) -> dict:
    import httpx

    from rlhp_jax.human.server import ServerThread, create_app
    from rlhp_jax.human.store import LabelStore

    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        store = LabelStore(root)
        (root / "c.mp4").write_bytes(b"\x00" * 1024)
        for i in range(pairs):
            store.add_query(root / "c.mp4", root / "c.mp4", query_id=f"q{i}")
        latencies = {"next": [], "label": []}
        with ServerThread(create_app(store), "127.0.0.1", 0) as server:
            def person(name):
                with httpx.Client(base_url=server.url, timeout=30) as c:
                    while True:
                        t0 = time.perf_counter()
                        pair = c.get("/api/next", params={"labeler": name}).json()["pair"]
                        latencies["next"].append(time.perf_counter() - t0)
                        if pair is None:
                            return
                        t0 = time.perf_counter()
                        c.post("/api/label", json={"pair": pair["id"], "lease": pair["lease"], "choice": "left"})
                        latencies["label"].append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(labelers) as pool:
                list(pool.map(person, [f"p{i}" for i in range(labelers)]))
            wall = time.perf_counter() - t0
        n = len(store.labels_since(0))
        assert n == pairs, (n, pairs)
        ms = lambda xs, q: 1000 * float(np.percentile(xs, q))
        return dict(labelers=labelers, answers=n, answers_per_s=n / wall, next_p50_ms=ms(latencies["next"], 50),
                    next_p99_ms=ms(latencies["next"], 99), label_p50_ms=ms(latencies["label"], 50),
                    label_p99_ms=ms(latencies["label"], 99))


def bench_prepare(env: str, pairs: int) -> dict:
    from rlhp_jax.envs import make_env
    from rlhp_jax.human.teacher import HumanTeacher

    e = make_env(env, 1)
    spec = e.spec
    t, rng = spec.segment_length, np.random.default_rng(0)
    obs_dtype = np.uint8 if len(spec.obs_shape) == 3 and spec.obs_shape[-1] == 4 and spec.obs_shape[0] == 84 \
        else np.float32
    if obs_dtype == np.uint8:
        obs = rng.integers(0, 255, size=(pairs, 2, t, *spec.obs_shape), dtype=np.uint8)
    else:
        obs = rng.normal(size=(pairs, 2, t, *spec.obs_shape)).astype(np.float32) * 0.1
    fields = getattr(e, "render_fields", ())
    arrays = dict(obs=obs, action=np.zeros((pairs, 2, t, *spec.action_shape), np.float32),
                  true_reward=rng.normal(size=(pairs, 2, t)).astype(np.float32),
                  render=np.cumsum(rng.normal(size=(pairs, 2, t, len(fields))), axis=2).astype(np.float32) * 0.05)
    with tempfile.TemporaryDirectory() as d:
        teacher = HumanTeacher(d, env, render_fields=fields)
        teacher.queue({k: v[:1] for k, v in arrays.items()}, [{}])  # warm-up: renderer and encoder start
        teacher.wait_idle()
        teacher.seconds_rendering = 0.0
        t0 = time.perf_counter()
        teacher.queue(arrays, [{}] * pairs)
        teacher.wait_idle()
        wall = time.perf_counter() - t0
        teacher.close()
    return dict(env=env, segment_length=t, pairs=pairs, seconds_per_pair=wall / pairs)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.bench_human", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--labelers", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--pairs", type=int, default=400, help="answers per API run")
    p.add_argument("--envs", nargs="+", default=["CartPole-v1", "HalfCheetah", "Pong"])
    p.add_argument("--prepare-pairs", type=int, default=5)
    args = p.parse_args(argv)
    for n in args.labelers:
        r = bench_api(n, args.pairs)
        print(f"API, {r['labelers']:>2} labelers: {r['answers_per_s']:7.1f} answers/s; next p50 {r['next_p50_ms']:.1f} "
              f"ms p99 {r['next_p99_ms']:.1f} ms; label p50 {r['label_p50_ms']:.1f} ms p99 {r['label_p99_ms']:.1f} ms",
              flush=True)
    for env in args.envs:
        r = bench_prepare(env, args.prepare_pairs)
        print(f"prepare a pair, {env} ({r['segment_length']} steps): {r['seconds_per_pair']:.2f} s "
              "(segments + 2 clips rendered and encoded, worker thread)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

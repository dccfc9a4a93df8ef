"""Benchmark: one training step of the A.2 reward CNN, this project against PyTorch, side by side.

    python -m experiments.bench_cnn                        # 1 and 3 members, with and without input noise
    python -m experiments.bench_cnn --torch-seconds 0.47   # compare with a PyTorch figure taken elsewhere
    python -m experiments.bench_cnn --members 1 --no-noise --steps 5

One step is what ``RewardEnsemble.train_step`` does per member on Atari: a minibatch of 16 clip
pairs × 2 clips × 25 frames of 84×84×4 uint8 observations (800 frames) through Christiano A.2's
CNN (4 convolutions with batch norm, per-channel dropout 0.5 and leaky ReLU, a 64-unit dense
layer) in training mode, the Bradley–Terry loss with the adaptive L2 penalty, one Adam update,
then the inference-mode losses of that minibatch and of a validation minibatch (1,600 frames
forward) for the adaptive-L2 rule; with ``noise``, Ibarz A.3's Gaussian input noise (σ 0.1) on
every training frame.  The project's figure is ``experiments.bench_ensemble.bench`` (the fitter
the driver runs, best of ``--repeats`` calls of ``--steps`` steps, compile excluded).

The PyTorch figure is measured here when ``torch`` imports (it is not a dependency of the
project: ``pip install torch`` in a separate environment that also sees this one, e.g. a venv
made with ``--system-site-packages``), with the same architecture, the same work per step
(training forward and backward, Adam, the two inference forwards, the noise), ``torch.set_num_threads``
set to the cores JAX sees (on the GPU when JAX's backend is one), in both memory layouts (NCHW and ``channels_last``; the faster is
reported).  ``--torch-seconds S`` takes a figure measured elsewhere instead.  Seconds per step
are printed for both, with the ratio (below 1: this project is faster); record them in
BUILD_NOTES.md with the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import time

from experiments.bench_ensemble import SPECS, bench

PAIRS, SEG_LEN = 16, 25  # A.2 / Ibarz A.3 minibatch: 16 pairs of 25-step clips


def torch_step_seconds(members: int, noise: bool, steps: int, repeats: int, threads: int,
                       device: str = "cpu") -> dict | None:
    """Seconds per training step of the same CNN in PyTorch (best layout) on ``device`` ("cpu" or
    "cuda"), or None without torch (or without CUDA when "cuda" is asked for)."""
    try:
        import torch
        from torch import nn
    except ImportError:
        return None
    if device == "cuda" and not torch.cuda.is_available():
        return None
    torch.set_num_threads(threads)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch.manual_seed(0)

    def model():
        layers, c = [], 4
        for k, s in zip((7, 5, 3, 3), (3, 2, 1, 1)):
            layers += [nn.Conv2d(c, 16, k, s), nn.BatchNorm2d(16, momentum=0.01), nn.Dropout2d(0.5),
                       nn.LeakyReLU(0.01)]
            c = 16
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(16 * 7 * 7, 64), nn.LeakyReLU(0.01), nn.Linear(64, 1))

    best = {}
    for layout in ("nchw", "channels_last"):
        fmt = torch.channels_last if layout == "channels_last" else torch.contiguous_format
        nets = [model().to(device=device, memory_format=fmt) for _ in range(members)]
        opts = [torch.optim.Adam(n.parameters(), lr=3e-4) for n in nets]
        frames = torch.randint(0, 255, (64, 2, SEG_LEN, 4, 84, 84), dtype=torch.uint8, device=device)  # a full buffer
        mu = (torch.rand(64, device=device) > 0.5).float()

        def rewards(net, obs):  # [P, 2, T, 4, 84, 84] float -> segment returns [P, 2]
            x = obs.reshape(-1, 4, 84, 84).contiguous(memory_format=fmt)
            return net(x).reshape(obs.shape[0], 2, SEG_LEN).sum(-1)

        def bt(r, m):
            logits = r[:, 0] - r[:, 1]
            p = 0.9 * torch.sigmoid(logits) + 0.05  # A.2's 10 % random-response error model
            return -(m * torch.log(p) + (1 - m) * torch.log(1 - p)).mean()

        def step():
            for net, opt in zip(nets, opts):
                idx, idx_val = (torch.randint(0, 64, (PAIRS,), device=device),
                                torch.randint(0, 64, (PAIRS,), device=device))
                x = frames[idx].float() / 255.0
                if noise:
                    x = x + 0.1 * torch.randn_like(x)
                net.train()
                loss = bt(rewards(net, x), mu[idx]) + 1e-4 * sum((p * p).sum() for p in net.parameters())
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                net.eval()
                with torch.no_grad():
                    both = torch.cat([frames[idx], frames[idx_val]]).float() / 255.0
                    r = rewards(net, both)
                    bt(r[:PAIRS], mu[idx]).item(), bt(r[PAIRS:], mu[idx_val]).item()

        step()  # warm-up (allocator, oneDNN/cuDNN primitives)
        sync()
        dt = float("inf")
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            for _ in range(steps):
                step()
            sync()
            dt = min(dt, (time.perf_counter() - t0) / steps)
        best[layout] = dt
    layout = min(best, key=best.get)
    return dict(seconds=best[layout], layout=layout, all_layouts=best, version=torch.__version__, threads=threads,
                device=device)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--members", nargs="+", type=int, default=[1, 3])
    p.add_argument("--no-noise", action="store_true", help="only Christiano A.2's step (no Ibarz input noise)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per call (default 3)")
    p.add_argument("--repeats", type=int, default=2, help="calls timed; the best is reported (default 2)")
    p.add_argument("--torch-seconds", type=float, default=None,
                   help="a PyTorch figure (s per 1-member step) measured elsewhere, instead of measuring here")
    args = p.parse_args(argv)
    for flag, value in (("--members", min(args.members)), ("--steps", args.steps), ("--repeats", args.repeats)):
        if value < 1:
            p.error(f"{flag} must be at least 1")
    if args.torch_seconds is not None and args.torch_seconds <= 0:
        p.error("--torch-seconds must be positive")

    import jax

    threads = os.cpu_count() or 1
    rows = []
    for noise in ([False] if args.no_noise else [False, True]):
        for m in args.members:
            ours = bench("cnn", m, "auto", args.steps, repeats=args.repeats, noise=0.1 if noise else 0.0)
            row = dict(members=m, noise=noise, ours_s=ours["seconds"] / ours["steps"], member_axis=ours["member_axis"],
                       device=ours["device"], backend=jax.default_backend())
            if args.torch_seconds is not None:
                if m == 1 and not noise:
                    row.update(torch_s=args.torch_seconds, torch="given")
            else:
                # the same kind of device as JAX's: PyTorch on the GPU when JAX runs there
                t = torch_step_seconds(m, noise, args.steps, args.repeats, threads,
                                       device="cpu" if jax.default_backend() == "cpu" else "cuda")
                if t is not None:
                    where = f"{threads} threads" if t["device"] == "cpu" else "cuda"
                    row.update(torch_s=t["seconds"], torch=f"{t['version']} {t['layout']} {where}")
            rows.append(row)
            line = f"A.2 CNN, {m} member{'s' if m > 1 else ' '}, noise {'on ' if noise else 'off'}: {row['ours_s']:.3f} s/step"
            if "torch_s" in row:
                line += f"   PyTorch ({row['torch']}): {row['torch_s']:.3f} s/step   ratio {row['ours_s'] / row['torch_s']:.2f}"
            print(line, flush=True)
    for noise in sorted({r["noise"] for r in rows}):
        one = [r for r in rows if r["noise"] == noise and r["members"] == 1]
        three = [r for r in rows if r["noise"] == noise and r["members"] == 3]
        if one and three:
            print(f"3 members / 1 member (noise {'on' if noise else 'off'}): {three[0]['ours_s'] / one[0]['ours_s']:.2f}x")
    print(json.dumps(rows, indent=1))
    if "torch_s" not in rows[0]:
        print("PyTorch not measured: torch does not import here (see --help for --torch-seconds)")


if __name__ == "__main__":
    assert SPECS["cnn"][1:] == (SEG_LEN, PAIRS)
    main()

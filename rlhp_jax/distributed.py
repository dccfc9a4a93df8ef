"""Spreading the compiled loop's lanes (seeds × settings) over devices and hosts.

One device, eight, or eight on each of several machines: the same program.  The lanes form a
``jax.sharding.Mesh`` axis named ``"lanes"``; lanes never depend on each other, so split over lanes
alone the program exchanges almost nothing until the results are gathered (XLA keeps a few tiny
collectives: one flag per loop turn of the vmapped Poisson sampler of the bootstrap, and the
[lanes, candidates] disagreement scores gathered for ``top_k``, see BUILD_NOTES).  A lane can also be
spread over a group of devices: its environments over the mesh's ``"envs"`` axis and its
ensemble members over ``"members"`` (``lane_mesh(envs=2, members=3)``), for runs whose lanes
are too big for one device or too few to fill them.  The agent's update then all-reduces its
gradients across the environment shards, and the label set is read by every member shard.

Single host, N devices (GPUs, or CPU devices for testing)::

    mesh = lane_mesh()                                   # every device jax sees, lanes only
    finals, metrics = CompiledRun(cfg).train_lanes(keys, hypers, mesh=mesh)
    mesh = lane_mesh(envs=2, members=3)                  # groups of 6 devices: envs × members in a lane

    XLA_FLAGS=--xla_force_host_platform_device_count=8 python -m experiments.sweep ...   # 8 CPU devices

Several hosts: start the same command on every host with the coordinator's address, the number of
processes and each one's id (or let ``jax.distributed.initialize`` read them from SLURM / Cloud
TPU / Kubernetes environments, with no flags)::

    host0$ python -m experiments.sweep --env Breakout-MinAtar --seeds 64 \\
               --coordinator 10.0.0.1:9476 --num-processes 2 --process-id 0
    host1$ python -m experiments.sweep ... --coordinator 10.0.0.1:9476 --num-processes 2 --process-id 1

Each process builds every lane's key and settings (they are tiny and deterministic), places only
the lanes on its own devices (``global_lanes``), and gathers the metrics of all lanes at the end
(``gather``); process 0 writes the results.  On CPU, cross-process collectives go through gloo.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
    """Join a multi-process run (``jax.distributed.initialize``); call before any other JAX work.

    With no arguments JAX reads the cluster's environment (SLURM, Cloud TPU, …)."""
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU hosts; GPUs use NCCL regardless
    jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)


def lane_mesh(num_devices: int | None = None, envs: int = 1, members: int = 1) -> Mesh:
    """A mesh ``("lanes", "envs", "members")`` over the first ``num_devices`` of all processes'
    devices (all when None): lanes are split over ``num_devices / (envs · members)`` groups, and
    within a group each lane's environments over ``envs`` devices and its ensemble members over
    ``members`` devices (``CompiledRun.state_specs`` says which arrays carry which axis)."""
    devices = jax.devices()
    if num_devices is not None:
        if not 1 <= num_devices <= len(devices):
            raise ValueError(f"--devices {num_devices}: this run sees {len(devices)} device(s).")
        devices = devices[:num_devices]
    if envs < 1 or members < 1:
        raise ValueError(f"envs ({envs}) and members ({members}) must be at least 1.")
    inner = envs * members
    if len(devices) % inner:
        raise ValueError(f"{len(devices)} device(s) do not split into groups of {envs} (environments) × "
                         f"{members} (members) = {inner}.")
    grid = np.asarray(devices).reshape(len(devices) // inner, envs, members)
    return Mesh(grid, ("lanes", "envs", "members"))


def global_lanes(tree: Any, mesh: Mesh, lane_axes: Any = 0) -> Any:
    """Host values (the same on every process) -> global arrays: leaves with ``lane_axes`` 0 split
    over the mesh's "lanes" axis, leaves with None replicated.  Each process materializes only
    the shards of its own devices, so this works on one host or many."""
    split, whole = NamedSharding(mesh, P("lanes")), NamedSharding(mesh, P())

    def place(axis, x):
        if x is None:
            return None
        x = np.asarray(x)
        sharding = split if axis == 0 else whole
        return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

    if not isinstance(lane_axes, int):
        return jax.tree.map(place, lane_axes, tree, is_leaf=lambda v: v is None)
    return jax.tree.map(lambda x: place(lane_axes, x), tree)


def gather(tree: Any) -> Any:
    """Every lane's values on this host, as NumPy (all-gathered across processes when there are several)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(tree, tiled=True)

"""``python -m rlhp_jax.human``: the labeling app without (or beside) a trainer.

  serve   --run DIR            the page for a run's label store (the trainer may be another process)
  label   --queue FILE         label a saved set of pairs, no trainer: every labeler sees every pair
  queue   --env ENV --out DIR  make such a set from a random policy (clips + segments + queue.jsonl)
  export  --run DIR --out F    pairs and answers to JSONL (segments embedded; F must be new, or --overwrite)
  import  --run DIR --file F   JSONL into a store (idempotent; every line checked first, then all or nothing)
  stats   --run DIR | --file F answers per labeler, response times, agreement between labelers and with the oracle
  fit     --file F             train a reward ensemble offline on a labeled set; held-out accuracy
  play    --env GAME --out F   record demonstrations by playing the game in the browser (arrows, Space)
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rlhp_jax.refusal import check_new_file, refuse

if TYPE_CHECKING:
    from rlhp_jax.human.store import LabelStore


def _store_for(args, create: str = "yes") -> LabelStore:
    """The store ``--run DIR`` (its ``labels.sqlite``) or ``--queue FILE`` (the ``.sqlite`` beside
    it) names.  ``create``: ``"yes"`` (label, import) makes one where none is; ``"in_run"`` (serve)
    only where one belongs, in a run directory (the trainer's ``config.json``) or beside an
    existing queue file; ``"no"`` (stats, export: they only read) never: a store must be there,
    so a look at someone's oracle run leaves no ``labels.sqlite`` behind.  Where none may be made,
    nothing is created.  A file that is not a usable store raises
    :class:`~rlhp_jax.human.store.StoreUnavailable` (a ValueError)."""
    from rlhp_jax.human.exchange import is_training_run
    from rlhp_jax.human.store import LabelStore

    if getattr(args, "run", None):
        run = Path(args.run)
        if not run.is_dir():
            raise ValueError(f"{run}: no such run directory")
        if create != "yes" and not (run / LabelStore.FILENAME).exists():
            if not is_training_run(run):
                raise ValueError(f"{run} is not a run directory (no config.json from the trainer, no "
                                 f"{LabelStore.FILENAME}); nothing was created")
            if create == "no":
                raise ValueError(f"{run} has no label store ({LabelStore.FILENAME}): no pair of it was "
                                 "shown to people (a run with the synthetic oracle keeps none); nothing was created")
        return LabelStore(run)
    queue = Path(args.queue)
    path = queue.with_suffix(".sqlite")
    if create != "yes" and not path.exists() and (create == "no" or not queue.is_file()):
        raise ValueError(f"{queue}: no {path.name} beside it" + ("" if queue.is_file() else " and no such queue file")
                         + "; nothing was created")
    return LabelStore(queue.parent, path=path)


def serve_forever(store, env: str | None, args) -> None:
    from rlhp_jax.human.server import start_page

    server = start_page(store, env, args)
    try:
        while True:
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    c = store.counts()
    print(f"{c['labels']} answers from {c['labelers']} labeler(s) on {c['queries']} pairs; {c['open']} still open")


def _env_of(store) -> str | None:
    """The task of the store's pairs: its run's ``config.json``, else the first pair's info."""
    from rlhp_jax.config_fields import config_object

    config = config_object(store.root)
    if config is not None:
        env = config.get("env")
        return env if isinstance(env, str) else None
    rows = store.all_queries(limit=1)
    return json.loads(rows[0]["info"]).get("env") if rows else None


def make_queue(env: str, pairs: int, out: str | Path, seed: int = 0) -> Path:
    """``pairs`` pairs of segments of a uniformly random policy, rendered, in a fresh directory
    ``out`` with ``queue.jsonl``: a set to label with ``label --queue``.  The clips are drawn as
    the trainer draws its candidates (``queries.sample_segment_starts``): none runs across an
    episode's end or over a step that is no real transition (envpool's deferred reset)."""
    import jax
    import numpy as np

    from rlhp_jax import queries
    from rlhp_jax.envs import make_env
    from rlhp_jax.human.exchange import export_jsonl
    from rlhp_jax.human.store import LabelStore
    from rlhp_jax.human.teacher import HumanTeacher
    from rlhp_jax.rollout import collect_rollout, uniform_random_policy
    from rlhp_jax.core import clip_action
    from rlhp_jax.refusal import check_out_directory

    out = Path(out)
    check_out_directory(out)
    if (out / "queue.jsonl").exists():
        raise ValueError(f"{out} already holds a queue; choose another --out")
    if pairs < 1:
        raise ValueError(f"--pairs must be at least 1, got {pairs}")
    env_ = make_env(env, 8)
    spec = env_.spec
    seg = spec.segment_length

    policy = uniform_random_policy(spec)

    k_reset, k_rollout, k_clips = jax.random.split(jax.random.PRNGKey(seed), 3)
    state, obs = env_.reset(k_reset)
    steps = max(4 * seg, seg + pairs)
    _, _, ro = collect_rollout(env_, policy, None, state, obs, k_rollout, steps)
    t0, e = queries.sample_segment_starts(k_clips, ro.boundary, 2 * pairs, seg, excluded=~ro.valid)
    take = lambda x: np.asarray(queries.gather_segments(x, t0, e, seg)).reshape(pairs, 2, seg, *x.shape[2:])
    arrays = dict(obs=take(ro.obs), action=take(clip_action(spec, ro.action)), true_reward=take(ro.true_reward),
                  render=take(ro.render))
    store = LabelStore(out, path=out / "queue.sqlite")
    teacher = HumanTeacher(out, env, render_fields=getattr(env_, "render_fields", ()), wanted=0, store=store)
    teacher.queue(arrays, [dict(env_steps=0, policy="random", seed=seed)] * pairs)
    teacher.close()
    export_jsonl(store, out / "queue.jsonl", overwrite=False)
    return out / "queue.jsonl"


def fit_offline(file: str, members: int = 3, steps: int = 2000, seed: int = 0, labeler: str | None = None) -> dict:
    """Train a reward ensemble on a labeled set; returns held-out (1/e) accuracy and, where the
    pairs carry true rewards, how often the model agrees with the oracle on every labeled pair."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import numpy as np

    from rlhp_jax import labels as labels_lib
    from rlhp_jax.ensemble import EnsembleConfig, RewardEnsemble
    from rlhp_jax.envs import make_env
    from rlhp_jax.human.exchange import load_labeled
    from rlhp_jax.reward_models import reward_model_spec_for

    arrays, mu, env = load_labeled(file, labeler)
    spec = make_env(env, 1).spec
    ens = RewardEnsemble(reward_model_spec_for(spec), dataclasses.replace(EnsembleConfig(), num_members=members,
                                                                          reward_std=spec.reward_std))
    n, seg = mu.shape[0], arrays["obs"].shape[2]
    key = jax.random.PRNGKey(seed)
    k_init, k_add, k_fit = jax.random.split(key, 3)
    state = ens.init(k_init)
    buffer = ens.empty_buffer(n, seg)
    pairs = labels_lib.SegmentPairs(obs=jnp.asarray(arrays["obs"]), action=jnp.asarray(arrays["action"]),
                                    true_reward=jnp.asarray(arrays["true_reward"], jnp.float32))
    buffer = labels_lib.add_labels(buffer, k_add, pairs, jnp.asarray(mu))
    state, fit_m = ens.fitter()(state, buffer, k_fit, steps)
    ev = fit_m["evaluation"]
    r = np.asarray(ens.normalized_member_rewards(state, pairs.obs.reshape(-1, *pairs.obs.shape[3:]),
                                                 pairs.action.reshape(-1, *pairs.action.shape[3:]))).mean(0)
    ret = r.reshape(n, 2, seg).sum(-1)
    strict = mu != 0.5
    true_ret = arrays["true_reward"].sum(-1)
    return dict(env=env, answers=int(n), members=members, steps=steps,
                val_accuracy=float(np.nanmean(np.asarray(ev["val_accuracy"]))),
                train_agreement=float(np.mean((ret[strict, 0] > ret[strict, 1]) == (mu[strict] == 1.0)))
                if strict.any() else None,
                labels_agree_with_oracle=float(np.mean((true_ret[strict, 0] > true_ret[strict, 1]) == (mu[strict] == 1.0)))
                if strict.any() else None)


def main(argv=None) -> int:
    from rlhp_jax.human.server import add_server_flags

    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m rlhp_jax.human", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("serve", allow_abbrev=False, help="serve the labeling page for a run directory")
    p.add_argument("--run", required=True)
    add_server_flags(p)
    p = sub.add_parser("label", allow_abbrev=False, help="label a saved queue of pairs, no trainer")
    p.add_argument("--queue", required=True, help="a queue.jsonl (from `queue` or `export`)")
    p.add_argument("--once", action="store_true", help="each pair answered once in all (default: by every labeler)")
    add_server_flags(p)
    p = sub.add_parser("queue", allow_abbrev=False, help="make a queue of random-policy pairs to label")
    p.add_argument("--env", required=True)
    p.add_argument("--pairs", type=int, default=50)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p = sub.add_parser("export", allow_abbrev=False, help="pairs and answers to JSONL")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--run")
    g.add_argument("--queue")
    p.add_argument("--out", required=True, help="the JSONL file to write; an existing one is refused")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--labeled-only", action="store_true")
    p = sub.add_parser("import", allow_abbrev=False, help="JSONL into a run's store")
    p.add_argument("--run", required=True)
    p.add_argument("--file", required=True)
    p = sub.add_parser("stats", allow_abbrev=False, help="answers per labeler, agreement")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--run")
    g.add_argument("--queue")
    g.add_argument("--file")
    p = sub.add_parser("fit", allow_abbrev=False, help="train a reward ensemble on a labeled JSONL set")
    p.add_argument("--file", required=True)
    p.add_argument("--ensemble.num-members", "--members", dest="members", type=int, default=3,
                   help="reward models in the ensemble (the training commands' flag; --members as before)")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--labeler", default=None, help="only this labeler's answers")
    p = sub.add_parser("play", allow_abbrev=False, help="record demonstrations by playing a game in the browser")
    p.add_argument("--env", required=True, help="an Atari game (Pong, Breakout, ...) or a MinAtar game")
    p.add_argument("--out", required=True, help="the demo file to write (.npz)")
    p.add_argument("--episodes", type=int, default=None, help="stop (and save) after this many episodes")
    p.add_argument("--full-action-space", action="store_true", help="all 18 Atari actions (Ibarz et al. 2018)")
    p.add_argument("--fps", type=float, default=None, help="agent steps per second (default: the game's speed)")
    p.add_argument("--seed", type=int, default=None, help="the game's seed (default: a fresh one)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    add_server_flags(p)
    args = parser.parse_args(argv)

    from rlhp_jax.human import exchange

    try:
        if args.cmd in ("serve", "label", "play"):
            from rlhp_jax.human.server import check_binding

            check_binding(args.host, args.token)  # before anything is created
        if args.cmd == "serve":
            store = _store_for(args, create="in_run")
            store.check_writable()
            serve_forever(store, _env_of(store), args)
        elif args.cmd == "label":
            queue = Path(args.queue)
            checked = exchange.read_pairs(queue)  # every line and clip, before the store beside it is made
            store = _store_for(args)
            added = exchange.import_pairs(store, checked, wanted=1 if args.once else 0)
            print(f"{added['pairs']} new pairs ({added['skipped_pairs']} already there); answers go to {store.path}")
            serve_forever(store, _env_of(store), args)
            print(f"export them with: python -m rlhp_jax.human export --queue {queue} --out labels.jsonl")
        elif args.cmd == "queue":
            path = make_queue(args.env, args.pairs, args.out, args.seed)
            print(f"{args.pairs} pairs in {path}; label them with: python -m rlhp_jax.human label --queue {path}")
        elif args.cmd == "export":
            check_new_file(args.out, args.overwrite)  # an earlier export may be the only copy of its labels
            store = _store_for(args, create="no")
            n = exchange.export_jsonl(store, args.out, labeled_only=args.labeled_only, overwrite=args.overwrite)
            print(f"{n} pairs written to {args.out}")
        elif args.cmd == "import":
            run = Path(args.run)  # a trainer's run takes only pairs it can learn from
            checked = exchange.read_pairs(args.file, run if exchange.is_training_run(run) else None)
            added = exchange.import_pairs(_store_for(args), checked)  # checked first: a bad file makes no store
            print(json.dumps(added))
        elif args.cmd == "stats":
            if args.file:
                lines = exchange.read_jsonl(args.file)
            else:
                store = _store_for(args, create="no")
                lines = list(exchange.pair_lines(store, store.root, embed_segments=False))
            print(json.dumps(exchange.agreement_stats(lines), indent=2))
        elif args.cmd == "fit":
            print(json.dumps(fit_offline(args.file, args.members, args.steps, args.seed, args.labeler), indent=2))
        elif args.cmd == "play":
            from rlhp_jax.human.play_server import serve_play

            return serve_play(args)
    except (ValueError, OSError, sqlite3.Error) as e:  # sqlite3: a store damaged beyond its first page
        return refuse(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())

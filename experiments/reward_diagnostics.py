"""Does a run's learned reward prefer the better policy?  Score the newest policy of each run with
one run's reward model (r̂ as the agent sees it: the members' normalized rewards, averaged).

    python -m experiments.reward_diagnostics --rm runs/reproduce_mujoco/Swimmer-700labels-3M-seed0 \\
        runs/reproduce_mujoco/Swimmer-700labels-3M-seed0 runs/reproduce_mujoco/Swimmer-baseline-3M-seed0

For each run and each way of acting (``sampled``: the stochastic policy the agent trains;
``greedy``: its mean action) it rolls ``--steps`` steps of the task on each of the ``--rm`` run's
environments (its agent's ``num_envs``) and prints one row: the true return per episode, r̂ per step, the per-step correlation and least-squares
slope of r̂ on the true reward, and how much of r̂'s variance comes from the action noise (r̂ on the
sampled actions against r̂ on the mean actions, both clipped to the action bounds as the
environment receives them), and the members' spread: the per-step standard deviation of the
members' normalized rewards, averaged over the steps.  If r̂ ranks policies as the true reward does
but by a much smaller margin than ``slope × true difference``, r̂ carries an offset that depends on
the states a policy visits; a spread well above the run's own policy's says r̂ is extrapolating
there (Swimmer's faster gait: BUILD_NOTES).  Christiano runs only (their newest checkpoint); the
task is the reward model's run's.

    python -m experiments.reward_diagnostics --rm RUN RUN BASELINE_RUN --obs-features 0,1,8

``--obs-features I,J`` adds, beside each row, the mean ± std of those observation features over
the policy's steps: which gait a policy found.  On HalfCheetah (features 0, 1, 8: the torso's
height, its pitch and the forward velocity) a cheetah running on its back reads a pitch of about
+3 rad where an upright one reads 0.2–0.6 (docs/results.md, "HalfCheetah over ten seeds").

    python -m experiments.reward_diagnostics --rm RUN --retrain 120000 --retrain-seeds 3

``--retrain STEPS`` asks the other question: is a failed run's r̂ itself wrong, or did the agent
fail on a reward that moved while it learned?  It trains fresh agents (``--retrain-seeds`` of
them, the run's own agent settings) for STEPS steps on the run's *final* r̂, frozen (no labels, no
refit), and prints each one's greedy evaluation on the unmodified task (gymnax; elsewhere the
true return per episode of its training rollouts) every ``eval_every`` iterations.  If fresh
agents on the frozen r̂ fail the same way, the reward model is at fault.  ``--rm`` may also name
a run on the true reward: its agents then train on that reward, as a fresh run of it would.

    python -m experiments.reward_diagnostics --rm BASELINE_RUN --retrain 1500000 --retrain-from LEARNED_RUN

``--retrain-from RUN`` starts the agents from RUN's newest policy (and value function) instead of
fresh ones, so the swap answers whether a policy is stuck: the learned run's policy trained on
the true reward (``--rm`` a true-reward run) leaves a mediocre gait or does not, and the
true-reward run's policy trained on the frozen r̂ keeps its gait or loses it.  The value function
comes along: on the other reward its scale is wrong for the first iterations.  RUN must be of
the same task and agent as ``--rm``.

    python -m experiments.reward_diagnostics --rm RUN --attribute RUN_A RUN_B

``--attribute`` asks *why* r̂ pays two policies differently: both act, then r̂ is taken on A's
steps with one input at a time (an observation feature, or the action) given B's values of it,
and the change of r̂ per step is printed beside each feature's mean and std under both policies
(vector observations).  A large change on an input the true reward ignores is r̂ extrapolating:
on Swimmer, an r̂ fitted to an untrained policy's clips pays a slow gait for holding its first
action at the bound and for its joints' swing (BUILD_NOTES).  One input changes at a time, so
where the policies differ in several at once (Swimmer's mirror-image gaits) the mixed states can
lie further from the labels than either policy's, and the changes need not add up to the gap.

    python -m experiments.reward_diagnostics --rm RUN --labels

``--labels`` asks what the run's labels could teach: how many of them (the initial ones, from the
untrained policy, and the online ones) are ties, and how many of those compare two clips in which
nothing happens (the same true reward on every step of both: on InvertedPendulum, two fallen
poles); then how r̂ (the newest checkpoint's, as the agent sees it) follows the true reward over
the labeled clips' steps, and how much of it rides on the action: r̂ again with the actions
shuffled among those steps.  A reward model fitted to few decisive labels can explain them by the
action, which the agent controls directly.  On a task with a healthy range (Hopper, Walker2d, Ant,
the pendulums) it also says what share of the labeled steps are in range and how r̂ weighs being
there against the true reward (``healthy_weight``): a reward model that pays too little for
staying upright lets the agent trade the range for speed.  For vector observations it reads
out, per feature, what r̂ pays against what the true reward pays (``feature_weights``), and what
r̂ pays for moving each feature alone away from the task's start states, 2 to 10 of its stds over
the labeled clips (``feature_probe``): how r̂ extrapolates where the labels thin out.  A moved
state need not be one the task can reach (Pendulum's cosine beyond 1): the probe reads r̂'s
extrapolation, not what a policy could collect.  On the
README's CartPole job the runs that miss 475 pay the cart's speed and its distance from the middle
there, where the passing runs mostly do not (BUILD_NOTES).
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np

from experiments.cli import add_compile_cache_flag, start_compile_cache
from rlhp_jax.config import RunConfig
from rlhp_jax.driver import PreferenceRun
from rlhp_jax.rollout import collect_rollout
from rlhp_jax.core import clip_action
from rlhp_jax import tasks
from rlhp_jax.ensemble import INPUT_CLIP
from rlhp_jax.refusal import refuse
from rlhp_jax.envpool_envs import healthy
from rlhp_jax.loop import per_episode
from rlhp_jax.runs import read_run_config


def load(run: str) -> tuple[PreferenceRun, dict]:
    """A run's components and the state of its newest checkpoint."""
    cfg = read_run_config(run)
    if not isinstance(cfg, RunConfig):
        raise ValueError(f"{run} is an Ibarz et al. run: this tool reads Christiano runs")
    pr = PreferenceRun(cfg, progress=False, resume=True)
    restored = pr.restore_latest()
    if restored is None:
        raise ValueError(f"{run} has no checkpoint yet")
    return pr, restored[0]


def check_same_task(run: PreferenceRun, rm_run: PreferenceRun) -> None:
    """Refuse a run whose policy cannot act in ``rm_run``'s task (another observation or action space)."""
    if run.spec.obs_shape != rm_run.spec.obs_shape or run.spec.num_actions != rm_run.spec.num_actions:
        raise ValueError(f"{run.cfg.out} ran another task than {rm_run.cfg.out}")


def require_r_hat(rm_run: PreferenceRun) -> None:
    """Refuse a run on the true reward where its r̂ is asked for: its ensemble was never fitted."""
    if not rm_run.parts.learn:
        raise ValueError(f"{rm_run.cfg.out} trained on the true reward: it has no r̂ to score policies with "
                         f"(--retrain trains agents on its true reward)")


def policy_steps(rm_run: PreferenceRun, policy_run: PreferenceRun, policy_state: dict, *, greedy: bool, steps: int,
                 seed: int = 0) -> dict:
    """The valid steps of ``steps`` steps per environment of ``policy_run``'s newest policy acting in
    ``rm_run``'s task: observations, r̂'s inputs besides the action (``features``: the observations,
    or with ``--ensemble.next-obs`` each beside the next), actions (as sampled, and clipped to the
    bounds as the task receives them), the true reward and the true return per episode."""
    check_same_task(policy_run, rm_run)
    agent, params, spec = policy_run.agent, policy_state["agent"].params, rm_run.spec
    policy = agent.policy
    if greedy:
        policy = lambda p, o, k: (agent.act_deterministic(p, o), jnp.zeros(o.shape[0]), jnp.zeros(o.shape[0]))
    env_state, obs = rm_run.env.reset(jax.random.PRNGKey(seed))
    _, _, ro = collect_rollout(rm_run.env, policy, params, env_state, obs, jax.random.PRNGKey(seed + 1), steps)
    valid = np.asarray(ro.valid).reshape(-1)
    o = ro.obs.reshape(-1, *ro.obs.shape[2:])[valid]
    f = rm_run.parts.reward_obs(ro)  # what r̂ sees: the observation, or the transition (--ensemble.next-obs)
    f = f.reshape(-1, *f.shape[2:])[valid]
    sampled = ro.action.reshape(-1, *ro.action.shape[2:])[valid]
    return dict(obs=o, features=f, action=clip_action(spec, sampled),
                true=np.asarray(ro.true_reward).reshape(-1)[valid],
                true_return=float(per_episode(ro.true_reward, ro.valid, spec.horizon)))


def member_rewards(rm_run: PreferenceRun, rm_state: dict, obs, action) -> np.ndarray:
    """Each member's normalized reward on each step [M, steps]; r̂ is their mean (``predict_reward``)."""
    return np.asarray(rm_run.ensemble.normalized_member_rewards(rm_state["ensemble"], obs, action))


def score(rm_run: PreferenceRun, rm_state: dict, policy_run: PreferenceRun, policy_state: dict, *, greedy: bool,
          steps: int, seed: int = 0) -> dict:
    """One row: the policy of ``policy_run`` acting in ``rm_run``'s task, scored by its r̂."""
    require_r_hat(rm_run)
    st = policy_steps(rm_run, policy_run, policy_state, greedy=greedy, steps=steps, seed=seed)
    m = member_rewards(rm_run, rm_state, st["features"], st["action"])
    r, true = m.mean(axis=0), st["true"]
    row = dict(true_return=st["true_return"], r_hat=float(r.mean()),
               corr=float(np.corrcoef(true, r)[0, 1]) if true.std() > 0 and r.std() > 0 else float("nan"),
               slope=float(np.polyfit(true, r, 1)[0]) if true.std() > 0 else float("nan"), action_share=0.0,
               spread=float(m.std(axis=0).mean()) if m.shape[0] > 1 else float("nan"),
               obs_mean=st["obs"].mean(axis=0), obs_std=st["obs"].std(axis=0))
    if not rm_run.spec.discrete and not greedy:  # r̂ again on the policy's mean actions
        mean_action = clip_action(rm_run.spec, policy_run.agent.act_deterministic(policy_state["agent"].params, st["obs"]))
        r_mean = member_rewards(rm_run, rm_state, st["features"], mean_action).mean(axis=0)
        row["action_share"] = float(np.var(r - r_mean) / max(np.var(r), 1e-12))
    return row


def attribute(rm_run: PreferenceRun, rm_state: dict, run_a: PreferenceRun, state_a: dict, run_b: PreferenceRun,
              state_b: dict, *, steps: int, seed: int = 0) -> dict:
    """Which inputs make r̂ pay two policies differently (``--attribute``).  Both act (sampled) in
    ``rm_run``'s task; then r̂ is taken again on A's steps with one input at a time (an observation
    feature, or the action) replaced by B's values of it, drawn at random from B's steps.  Each
    change of r̂'s mean is what that input's distribution under B is worth on A's states: a large
    one on an input the true reward does not depend on is r̂ extrapolating between the policies.
    With ``--ensemble.next-obs`` the features are the observation's and then the next one's."""
    require_r_hat(rm_run)
    if len(rm_run.spec.obs_shape) != 1:
        raise ValueError("--attribute reads vector observations, one feature at a time; "
                         f"{rm_run.cfg.env}'s are {rm_run.spec.obs_shape}")
    a = policy_steps(rm_run, run_a, state_a, greedy=False, steps=steps, seed=seed)
    b = policy_steps(rm_run, run_b, state_b, greedy=False, steps=steps, seed=seed)
    n = min(len(a["true"]), len(b["true"]))
    pick = np.random.default_rng(seed).permutation(len(b["true"]))[:n]
    obs_a, act_a = np.asarray(a["features"][:n]), np.asarray(a["action"][:n])
    obs_b, act_b = np.asarray(b["features"])[pick], np.asarray(b["action"])[pick]
    r_hat = lambda o, act: float(member_rewards(rm_run, rm_state, jnp.asarray(o), jnp.asarray(act)).mean())
    base = r_hat(obs_a, act_a)
    features = []
    for j in range(obs_a.shape[1]):
        o = obs_a.copy()
        o[:, j] = obs_b[:, j]
        features.append(r_hat(o, act_a) - base)
    return dict(r_hat_a=base, r_hat_b=r_hat(obs_b, act_b), true_a=float(a["true"][:n].mean()),
                true_b=float(b["true"][pick].mean()), features=features, action=r_hat(obs_a, act_b) - base,
                mean_a=obs_a.mean(axis=0), mean_b=obs_b.mean(axis=0), std_a=obs_a.std(axis=0), std_b=obs_b.std(axis=0))


def retrain(rm_run: PreferenceRun, rm_state: dict, steps: int, seed: int, start_agent=None) -> list[tuple[int, float]]:
    """An agent trained for ``steps`` environment steps on ``rm_run``'s reward: its r̂ as it stands
    in ``rm_state`` (frozen), or, for a run on the true reward, that reward as a fresh run of it
    would scale it.  The agent is fresh, or ``start_agent`` (another run's agent state of the same
    task and agent).  Returns [(env steps, return)] every ``eval_every`` iterations and at the
    end — the greedy evaluation on the unmodified task where the run has one (gymnax), else the
    true return per fixed-length episode of that iteration's own rollout (the MuJoCo and Atari
    tables' measure)."""
    parts, cfg = rm_run.parts, rm_run.cfg
    iters = steps // parts.steps_per_iter
    if iters < 1:
        raise ValueError(f"--retrain needs at least one iteration: {parts.steps_per_iter} steps")
    state = parts.fresh(jax.random.PRNGKey(seed))
    if start_agent is not None:
        same = jax.tree.structure(start_agent) == jax.tree.structure(state.agent) and all(
            a.shape == b.shape for a, b in zip(jax.tree.leaves(start_agent), jax.tree.leaves(state.agent)))
        if not same:
            raise ValueError(f"--retrain-from names a run whose agent does not fit {cfg.out}'s "
                             f"({cfg.agent} on {cfg.env}): the same task and agent settings are needed")
        state = state.replace(agent=start_agent)
    if parts.learn:
        state = state.replace(ensemble=rm_state["ensemble"])
    key = jax.random.PRNGKey(seed + 1)
    evals = []
    for it in range(1, iters + 1):
        key, k_act, k_iter, k_eval = jax.random.split(key, 4)
        # the run's own compiled iteration and evaluation (a CNN agent on CPU: its host loop)
        state, rollout = parts.act(state.replace(key=k_act), k_iter, rm_run.compiled_iteration)[:2]
        if it % cfg.eval_every == 0 or it == iters:
            if rm_run.can_evaluate:
                ret = float(rm_run.evaluate_policy(state.agent.params, k_eval))
            else:
                ret = float(per_episode(rollout.true_reward, rollout.valid, parts.spec.horizon))
            evals.append((it * parts.steps_per_iter, ret))
    return evals


def healthy_weight(r_hat, true, healthy) -> dict | None:
    """How r̂ weighs staying in the healthy range, against the true reward, over the same steps.

    Least squares r̂ ≈ a·true + b·healthy + c (flat arrays of steps; ``healthy`` 0/1).  ``extra`` =
    b/a is what a step in range is worth to r̂ beyond what the true reward pays for it, in
    true-reward units: 0 when r̂ weighs the range as the true reward does, negative when less.  On
    Hopper and Walker2d the true reward pays 2 more a step in range (+1 against −1), so an
    ``extra`` of −1.3 leaves 0.7 of that 2 in r̂.  None when every step is in range, or none is,
    or when the true reward is the range alone (InvertedPendulum: then true and range cannot be
    told apart)."""
    r_hat, true, h = (np.asarray(x, np.float64).ravel() for x in (r_hat, true, healthy))
    if h.min() == h.max():
        return None
    design = np.stack([h, np.ones_like(h)], 1)
    rest = true - design @ np.linalg.lstsq(design, true, rcond=None)[0]  # the true reward apart from the range
    if rest.std() <= 1e-3 * true.std():
        return None
    (a, b, _), *_ = np.linalg.lstsq(np.stack([true, h, np.ones_like(h)], 1), r_hat, rcond=None)
    return dict(share=float(h.mean()), slope=float(a), extra=float(b / a) if a != 0 else float("nan"))


def feature_weights(features, r_hat, true) -> dict | None:
    """What r̂ and the true reward pay for each observation feature, over the same steps.

    Least squares of each on the features standardized over those steps (``features`` [S, D],
    ``r_hat`` and ``true`` [S]), r̂'s coefficients divided by r̂'s slope on the true reward, so both
    are in true-reward units per standard deviation of the feature: where r̂ follows the true
    reward the two rows agree; a feature r̂ pays for and the true reward does not is a term the
    labels left free (Swimmer's angular velocities: BUILD_NOTES).  A linear read-out of two
    nonlinear functions, for comparison only.  None for a constant true reward or r̂ flat in it."""
    x, r_hat, true = np.asarray(features, np.float64), np.asarray(r_hat, np.float64).ravel(), \
        np.asarray(true, np.float64).ravel()
    if true.std() == 0:
        return None
    slope = np.polyfit(true, r_hat, 1)[0]
    if abs(slope) < 1e-12:
        return None
    design = np.c_[(x - x.mean(0)) / np.where(x.std(0) > 0, x.std(0), 1.0), np.ones(len(x))]
    fit = lambda y: np.linalg.lstsq(design, y, rcond=None)[0][:-1]
    return dict(r_hat=(fit(r_hat) / slope).tolist(), true=fit(true).tolist(), slope=float(slope))


PROBE_STDS = (2.0, 5.0, 10.0)  # how far ``feature_probe`` moves a feature, in stds of the labeled clips
PROBE_STARTS = 256  # start states it moves them from


def feature_probe(r_hat, start, scale, stds=PROBE_STDS) -> np.ndarray:
    """What r̂ pays for moving one observation feature away from the task's start states.

    ``r_hat`` maps observations [S, D] to r̂ [S]; ``start`` [S, D] are start states and ``scale``
    [D] each feature's std over the labeled clips.  Returns [D, 2·len(stds)]: for feature i and k in
    (−stds[-1] … −stds[0], +stds[0] … +stds[-1]), the mean over the start states of r̂ with feature i
    moved by k·scale[i], less r̂ at the start states.  One call of ``r_hat`` on every moved copy."""
    start, scale = np.asarray(start, np.float32), np.asarray(scale, np.float32)
    ks = np.concatenate([-np.asarray(stds[::-1]), np.asarray(stds)]).astype(np.float32)
    n, d = start.shape
    moved = np.repeat(start[None, None], d, 0).repeat(len(ks), 1)  # [D, K, S, D]
    moved[np.arange(d), :, :, np.arange(d)] += ks[None, :, None] * scale[:, None, None]
    r = np.asarray(r_hat(np.concatenate([start, moved.reshape(-1, d)]))).astype(np.float64)
    return r[n:].reshape(d, len(ks), n).mean(-1) - r[:n].mean()


def probe_run(rm_run: PreferenceRun, rm_state: dict, obs_std, seed: int = 0) -> np.ndarray:
    """``feature_probe`` of a run's newest r̂ (as the agent gets it) from ``PROBE_STARTS`` of its task's
    start states, r̂ averaged over every action (discrete) or over uniform ones (continuous).  An r̂ of
    the transition (``--ensemble.next-obs``) is probed from the start states held still, [o, o]: its
    features are the observation's and then the next one's."""
    env, spec, ens = rm_run.env, rm_run.spec, rm_state["ensemble"]
    keys = jax.random.split(jax.random.PRNGKey(seed), -(-PROBE_STARTS // env.num_envs))
    start = np.concatenate([np.asarray(env.reset(k)[1]) for k in keys])[:PROBE_STARTS]
    if rm_run.ensemble.config.next_obs:
        start = np.concatenate([start, start], axis=-1)

    def r_hat(obs):
        obs = jnp.asarray(obs)
        if spec.discrete:
            acts = [jnp.full((len(obs),), a, jnp.int32) for a in range(spec.num_actions)]
        else:
            low, high = jnp.asarray(spec.action_low), jnp.asarray(spec.action_high)
            u = jax.random.uniform(jax.random.PRNGKey(seed + 1), (4, len(obs), spec.num_actions))
            acts = list(low + u * (high - low))
        return np.mean([np.asarray(rm_run.ensemble.predict_reward(ens, obs, a)) for a in acts], 0)

    return feature_probe(r_hat, start, obs_std)


def label_report(rm_run: PreferenceRun, rm_state: dict, seed: int = 0) -> dict:
    """What a run's labels hold and how its newest r̂ reads the labeled clips (see ``--labels``)."""
    if not rm_run.parts.learn:
        raise ValueError(f"{rm_run.cfg.out} trained on the true reward: it has no labels and no r̂")
    buffer = rm_state["buffer"]
    filled = np.asarray(buffer.filled)
    n = int(filled.sum())
    if n == 0:
        raise ValueError(f"{rm_run.cfg.out} has no labels yet")
    mu, true = np.asarray(buffer.mu)[filled], np.asarray(buffer.true_reward)[filled]  # [n], [n, 2, T]
    # the buffer keeps labels in the order they came until it wraps (a capacity below the budget)
    initial = None if int(buffer.count) > buffer.capacity else min(int(rm_run.schedule.initial), n)
    tie = mu == 0.5
    still = (true == true[:, :1, :1]).all(axis=(1, 2))  # one true reward on every step of both clips
    parts, ens = rm_run.parts, rm_state["ensemble"]
    r_hat = lambda b: np.asarray(parts.agent_rewards(ens, parts.ensemble.buffer_member_rewards(ens, b)))[filled]
    actions = np.asarray(buffer.action).copy()
    steps = actions[filled].reshape(-1, *actions.shape[3:])
    rng = np.random.default_rng(seed)
    actions[filled] = steps[rng.permutation(len(steps))].reshape(actions[filled].shape)
    r, r_shuffled = r_hat(buffer), r_hat(buffer.replace(action=jnp.asarray(actions)))

    def corr(x):
        return float(np.corrcoef(x.ravel(), true.ravel())[0, 1]) if x.std() > 0 and true.std() > 0 else float("nan")

    obs = np.asarray(buffer.obs)[filled]  # [n, 2, T, *obs_shape]
    in_range = None  # run-on MuJoCo tasks with a healthy range (A.1's penalty in place of termination)
    if parts.has_falls and rm_run.cfg.env in tasks.names("mujoco"):
        # a step's penalty follows from the observation it leads to: the clip's next one (its last step has none)
        nxt = obs[:, :, 1:]
        h = np.asarray(healthy(rm_run.cfg.env, nxt.reshape(-1, nxt.shape[-1])))
        in_range = healthy_weight(r[:, :, :-1], true[:, :, :-1], h)
    weights = probe = obs_std = None
    if obs.ndim == 4:  # vector observations
        flat = obs.reshape(-1, obs.shape[-1])
        weights = feature_weights(flat, r, true)
        obs_std = flat.std(0)
        probe = probe_run(rm_run, rm_state, obs_std, seed=seed)
    return dict(labels=n, initial=initial, ties=int(tie.sum()), weights=weights, probe=probe, obs_std=obs_std,
                initial_ties=None if initial is None else int(tie[:initial].sum()),
                still_ties=int((tie & still).sum()), corr=corr(r), corr_shuffled=corr(r_shuffled),
                r_std=float(r.std()), action_std=float((r - r_shuffled).std()), healthy=in_range)


def feature_list(text: str) -> tuple[int, ...]:
    """``--obs-features``' value: comma-separated feature indices, each at least 0, in the order given;
    a repeated index gives one column."""
    try:
        out = tuple(dict.fromkeys(int(x) for x in text.split(",")))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected indices separated by commas, such as 0,1,8; got {text!r}") from None
    if any(i < 0 for i in out):
        raise argparse.ArgumentTypeError(f"feature indices start at 0; got {text!r}")
    return out


def check_features(rm_run: PreferenceRun, features) -> None:
    """Refuse ``--obs-features`` the task's observations do not have (or images, which have no features)."""
    shape = rm_run.spec.obs_shape
    if not features:
        return
    if len(shape) != 1:
        raise ValueError(f"--obs-features reads vector observations; {rm_run.cfg.out}'s are {shape}")
    bad = [i for i in features if i >= shape[0]]
    if bad:
        raise ValueError(f"--obs-features {','.join(map(str, bad))}: {rm_run.cfg.out}'s observations have "
                         f"{shape[0]} features (0 to {shape[0] - 1})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, prog="python -m experiments.reward_diagnostics", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="*", help="run directories whose newest policies are scored")
    p.add_argument("--rm", required=True, help="the run whose reward model scores them")
    p.add_argument("--steps", type=int, default=1000, help="steps per environment (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--retrain", type=int, default=None, metavar="STEPS",
                   help="train agents for STEPS steps on --rm's reward: its final r̂, frozen, or a "
                        "true-reward run's reward (see above)")
    p.add_argument("--retrain-seeds", type=int, default=3, metavar="N", help="fresh agents to train (default 3)")
    p.add_argument("--retrain-from", default=None, metavar="RUN",
                   help="start the --retrain agents from RUN's newest policy instead of fresh ones (see above)")
    p.add_argument("--labels", action="store_true",
                   help="what --rm's labels hold and how its r̂ reads them (see above)")
    p.add_argument("--obs-features", type=feature_list, default=(), metavar="I,J,...",
                   help="beside each scored row, the mean ± std of these observation features over the policy's "
                        "steps (what a gait is: HalfCheetah's torso pitch, feature 1, reads about +3 rad on its back)")
    p.add_argument("--attribute", action="store_true",
                   help="with two runs A B: which inputs make r̂ pay their policies differently (see above)")
    add_compile_cache_flag(p)
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be positive")
    if args.retrain_from is not None and args.retrain is None:
        p.error("--retrain-from needs --retrain STEPS")
    if args.attribute and len(args.runs) != 2:
        p.error("--attribute compares two runs' policies: give exactly two run directories")
    if not args.runs and args.retrain is None and not args.labels:
        p.error("give run directories to score, --retrain STEPS or --labels")
    if args.retrain is not None and (args.retrain < 1 or args.retrain_seeds < 1):
        p.error("--retrain and --retrain-seeds must be positive")
    if args.obs_features and not args.runs:
        p.error("--obs-features describes the scored runs' policies: give run directories to score")
    if args.obs_features and args.attribute:
        p.error("--attribute already prints every feature's mean and std under both policies; "
                "--obs-features is for scored rows")
    start_compile_cache(args)  # a second look at the same run loads its programs instead of compiling them
    try:
        rm_run, rm_state = load(args.rm)
        if args.labels:
            rep = label_report(rm_run, rm_state, seed=args.seed)
            if rep["initial"] is None:
                held, split = "the newest, the label set having wrapped", ""
            else:
                held = f"{rep['initial']} initial, {rep['labels'] - rep['initial']} online"
                split = f": {rep['initial_ties']} of the initial, {rep['ties'] - rep['initial_ties']} of the online"
            print(f"labels of {args.rm}: {rep['labels']} ({held})\n"
                  f"  ties: {rep['ties']} ({100 * rep['ties'] / rep['labels']:.1f} %){split}\n"
                  f"  ties of two clips where nothing happens (one true reward on every step of both): "
                  f"{rep['still_ties']}\n"
                  f"  decisive: {rep['labels'] - rep['ties']}\n"
                  f"r̂ on the labeled clips' steps: corr with the true reward {rep['corr']:.2f}, "
                  f"{rep['corr_shuffled']:.2f} with the actions shuffled among the steps; std {rep['r_std']:.2f}, "
                  f"of the change the shuffle makes {rep['action_std']:.2f}", flush=True)
            if rep["weights"] is not None:
                w = rep["weights"]
                print("  r̂ per observation feature (per std, in true-reward units), against the true reward: "
                      + ", ".join(f"[{i}] {a:+.3f} ({b:+.3f})" for i, (a, b) in enumerate(zip(w["r_hat"], w["true"]))),
                      flush=True)
            if rep["probe"] is not None:
                ks = [f"{k:+g}" for k in (*(-k for k in PROBE_STDS[::-1]), *PROBE_STDS)]
                print(f"  r̂ from {PROBE_STARTS} of the task's start states with one feature moved by k stds of "
                      f"the labeled clips (r̂ as the agent gets it, less r̂ at the start states; r̂ clips its "
                      f"standardized inputs at ±{INPUT_CLIP:g} of its own stds of those clips):\n"
                      f"    {'feature':8s} {'std':>8s} " + " ".join(f"{k:>6s}" for k in ks), flush=True)
                for i, (sd, row) in enumerate(zip(rep["obs_std"], rep["probe"])):
                    print(f"    {f'[{i}]':8s} {sd:8.3g} " + " ".join(f"{x:+6.2f}" for x in row), flush=True)
            if rep["healthy"] is not None:
                h = rep["healthy"]
                print(f"  in the healthy range: {100 * h['share']:.1f} % of the labeled steps; r̂ ≈ "
                      f"{h['slope']:.2f} × (true reward {h['extra']:+.2f} per step in range)", flush=True)
            if not args.runs and args.retrain is None:
                return 0
        if args.retrain is not None:
            start = None
            if args.retrain_from is not None:
                start_run, start_state = load(args.retrain_from)
                check_same_task(start_run, rm_run)
                start = start_state["agent"]
            for i in range(args.retrain_seeds):
                evals = retrain(rm_run, rm_state, args.retrain, seed=args.seed + i, start_agent=start)
                if i == 0:
                    measure = ("greedy evaluation return" if rm_run.can_evaluate
                               else "true return per episode of the training rollouts")
                    who = "fresh agents" if start is None else f"agents starting from the newest policy of {args.retrain_from}"
                    reward = (f"the final r̂ of {args.rm}, frozen" if rm_run.parts.learn
                              else f"the true reward of {args.rm}")
                    print(f"{who} on {reward}: {measure} at env steps")
                print(f"seed {args.seed + i}: " + ", ".join(f"{s:,}: {r:.0f}" for s, r in evals), flush=True)
            if not args.runs:
                return 0
        if args.attribute:
            (run_a, state_a), (run_b, state_b) = load(args.runs[0]), load(args.runs[1])
            at = attribute(rm_run, rm_state, run_a, state_a, run_b, state_b, steps=args.steps, seed=args.seed)
            print(f"r̂ of {args.rm}, per step: A {at['r_hat_a']:.3f} (true {at['true_a']:.3f}), "
                  f"B {at['r_hat_b']:.3f} (true {at['true_b']:.3f})\n"
                  f"  A = {args.runs[0]}\n  B = {args.runs[1]}\n"
                  f"change of r̂ on A's steps when one input takes B's values:")
            print(f"  {'input':8s} {'Δr̂/step':>9s} {'A: mean':>8s} {'std':>6s} {'B: mean':>8s} {'std':>6s}")
            for j, d in enumerate(at["features"]):
                print(f"  {f'[{j}]':8s} {d:+9.3f} {at['mean_a'][j]:8.2f} {at['std_a'][j]:6.2f} "
                      f"{at['mean_b'][j]:8.2f} {at['std_b'][j]:6.2f}")
            print(f"  {'action':8s} {at['action']:+9.3f}")
            return 0
        require_r_hat(rm_run)
        check_features(rm_run, args.obs_features)
        print(f"r̂ of {args.rm}")
        print(f"{'run':44s} {'acting':8s} {'true return':>12s} {'r̂/step':>8s} {'corr':>6s} {'slope':>6s} {'action share':>12s}"
              f" {'spread':>6s}" + "".join(f" {f'obs[{i}]':>13s}" for i in args.obs_features))
        for run in args.runs:
            policy_run, policy_state = load(run)
            for greedy in (False, True):
                row = score(rm_run, rm_state, policy_run, policy_state, greedy=greedy, steps=args.steps, seed=args.seed)
                print(f"{run[-44:]:44s} {'greedy' if greedy else 'sampled':8s} {row['true_return']:12.1f} "
                      f"{row['r_hat']:8.3f} {row['corr']:6.3f} {row['slope']:6.2f} {row['action_share']:12.3f}"
                      f" {row['spread']:6.3f}"
                      + "".join(f" {row['obs_mean'][i]:+7.2f}±{row['obs_std'][i]:<5.2f}" for i in args.obs_features))
    except ValueError as e:
        return refuse(e)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Segments, candidate pairs and query selection (queries.py)."""

from __future__ import annotations

import hypothesis.extra.numpy as hnp
import hypothesis.strategies as st
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import fast_jit
from hypothesis import given, settings

from rlhp_jax.core import sample_indices
from rlhp_jax.loop import chunk_size, query_chunks
from rlhp_jax.queries import (
    gather_segments,
    sample_candidate_pairs,
    sample_segment_starts,
    sample_segments,
    select_by_disagreement,
    select_random,
    take_pairs,
    segment_sums,
    valid_segment_starts,
)

M, C = 3, 20  # members, candidates
T, N = 12, 3  # rollout steps, environments
OBS_DIM = 2

select_jit = fast_jit(select_by_disagreement, static_argnums=1)
starts_jit = fast_jit(valid_segment_starts, static_argnums=1)
segments_jit = fast_jit(sample_segments, static_argnums=(5, 6))
pairs_jit = fast_jit(sample_candidate_pairs, static_argnums=(5, 6))
sample_indices_jit = fast_jit(sample_indices, static_argnums=2)


# ------------------------------------------------------------------ disagreement
@given(hnp.arrays(np.float32, (M, C), elements=st.floats(0.0, 1.0, width=32)), st.integers(1, C))
def test_disagreement_picks_highest_variance(probs, k):
    idx = np.asarray(select_jit(jnp.asarray(probs), k))
    assert idx.shape == (k,) and len(set(idx.tolist())) == k
    var = probs.astype(np.float64).var(0)
    rest = np.setdiff1d(np.arange(C), idx)
    tol = 1e-6  # float32 variance vs float64
    if len(rest):
        assert var[idx].min() >= var[rest].max() - tol
    assert np.all(np.diff(var[idx]) <= tol), "highest variance first"


@given(st.permutations(list(range(C))), hnp.arrays(np.float32, (C,), elements=st.floats(0.25, 0.75, width=32)),
       st.integers(1, C))
def test_disagreement_matches_numpy_argsort(order, centre, k):
    # distinct spreads by construction: candidate c's members sit at centre ± spread[c]
    spread = (np.asarray(order, np.float32) + 1) * 0.01
    probs = centre[None, :] + np.array([-1.0, 0.0, 1.0], np.float32)[:, None] * spread[None, :]
    var = probs.astype(np.float64).var(0)
    expected = np.argsort(-var, kind="stable")[:k]
    np.testing.assert_array_equal(select_jit(jnp.asarray(probs), k), expected)


def test_disagreement_ignores_agreeing_confident_members():
    # all members sure (p≈1) → no disagreement; split members → maximal disagreement
    probs = jnp.array([[0.95, 0.95, 0.5, 0.05],
                       [0.95, 0.05, 0.5, 0.05],
                       [0.95, 0.95, 0.5, 0.05]])
    np.testing.assert_array_equal(select_by_disagreement(probs, 1), [1])


def test_disagreement_valid_mask():
    probs = jnp.array([[0.0, 0.5, 0.1, 0.9], [1.0, 0.5, 0.9, 0.1]])
    valid = jnp.array([False, True, True, True])
    np.testing.assert_array_equal(select_by_disagreement(probs, 2, valid), [2, 3])
    np.testing.assert_array_equal(select_by_disagreement(probs, 2), [0, 2])


def test_disagreement_bad_arguments():
    probs = np.full((M, 5), 0.5)
    for k in (0, -1, 6):
        with pytest.raises(ValueError, match=f"Cannot select {k} queries from 5 candidates"):
            select_by_disagreement(probs, k)
    with pytest.raises(AssertionError):
        select_by_disagreement(np.full((5,), 0.5), 2)


# ------------------------------------------------------------------ random
@pytest.mark.parametrize("k", [1, 7, C])
def test_select_random_distinct(k):
    seen = set()
    for seed in range(5):
        idx = np.asarray(select_random(jax.random.key(seed), C, k))
        assert idx.shape == (k,)
        assert len(set(idx.tolist())) == k
        assert idx.min() >= 0 and idx.max() < C
        seen |= set(idx.tolist())
    if k == 7:
        assert len(seen) > 10  # different keys pick different candidates


def test_select_random_roughly_uniform_and_valid_first():
    counts = np.zeros(C)
    picks = fast_jit(jax.vmap(lambda key: select_random(key, C, 5)))(jax.random.split(jax.random.key(0), 400))
    np.add.at(counts, np.asarray(picks).ravel(), 1)
    # each candidate is picked with probability 5/20: 100 ± 5σ (σ ≈ 8.7)
    assert np.all(np.abs(counts - 100) < 45), counts
    valid = np.arange(C) % 4 == 0  # 5 valid candidates
    idx = np.asarray(select_random(jax.random.key(1), C, 7, valid))
    assert set(idx[:5].tolist()) == {0, 4, 8, 12, 16}
    with pytest.raises(ValueError, match="Cannot select 21 queries"):
        select_random(jax.random.key(0), C, 21)
    with pytest.raises(ValueError):
        select_random(jax.random.key(0), C, 0)


# ------------------------------------------------------------------ segments
def brute_force_starts(boundary, excluded, length):
    t_len, n = boundary.shape
    ok = np.zeros((t_len - length + 1, n), bool)
    for s in range(t_len - length + 1):
        for e in range(n):
            crosses = boundary[s:s + length - 1, e].any()  # a boundary on the last step is fine
            bad = excluded is not None and excluded[s:s + length, e].any()
            ok[s, e] = not crosses and not bad
    return ok


sparse_flags = hnp.arrays(bool, (T, N), elements=st.sampled_from([False, False, False, True]))
lengths = st.integers(1, 5)


@given(sparse_flags, st.one_of(st.none(), sparse_flags), lengths)
def test_valid_segment_starts_matches_brute_force(boundary, excluded, length):
    got = starts_jit(jnp.asarray(boundary), length, None if excluded is None else jnp.asarray(excluded))
    np.testing.assert_array_equal(got, brute_force_starts(boundary, excluded, length))


def test_valid_segment_starts_examples():
    b = np.zeros((6, 1), bool)
    b[2] = True  # reset after step 2
    ok = np.asarray(valid_segment_starts(jnp.asarray(b), 3))[:, 0]
    # [0,1,2] ends on the boundary: fine; [1,2,3] and [2,3,4] cross it; [3,4,5] fine
    np.testing.assert_array_equal(ok, [True, False, False, True])
    ex = np.zeros((6, 1), bool)
    ex[5] = True
    ok = np.asarray(valid_segment_starts(jnp.asarray(b), 3, jnp.asarray(ex)))[:, 0]
    np.testing.assert_array_equal(ok, [True, False, False, False])
    with pytest.raises(ValueError, match="longer than the rollout"):
        valid_segment_starts(jnp.asarray(b), 7)


def rollout_arrays():
    """obs[t, n] = (t, n): every segment says where it came from."""
    t, n = np.meshgrid(np.arange(T), np.arange(N), indexing="ij")
    obs = np.stack([t, n], -1).astype(np.float32)
    action = (100 * t + n).astype(np.int32)
    reward = (t + 0.5 * n).astype(np.float32)
    return jnp.asarray(obs), jnp.asarray(action), jnp.asarray(reward)


def check_segments(obs, action, reward, boundary, excluded, length):
    obs, action, reward = np.asarray(obs), np.asarray(action), np.asarray(reward)
    t, n = obs[..., 0].astype(int), obs[..., 1].astype(int)
    ok = brute_force_starts(boundary, excluded, length)
    for s in range(obs.shape[0]):
        np.testing.assert_array_equal(t[s], t[s, 0] + np.arange(length))  # consecutive steps
        assert np.all(n[s] == n[s, 0])  # one environment
        assert ok[t[s, 0], n[s, 0]], (t[s], n[s])  # a valid start ...
        assert not boundary[t[s, :-1], n[s, :-1]].any()  # ... so no crossing
        if excluded is not None:
            assert not excluded[t[s], n[s]].any()
        # the other arrays come from the same positions
        np.testing.assert_array_equal(action[s], 100 * t[s] + n[s])
        np.testing.assert_array_equal(reward[s], t[s] + 0.5 * n[s])
    return t[:, 0], n[:, 0]


@given(sparse_flags, sparse_flags, st.sampled_from([1, 2, 4]), st.integers(0, 2**31 - 1))
def test_sample_segments_respect_boundaries_and_exclusions(boundary, excluded, length, seed):
    if not brute_force_starts(boundary, excluded, length).any():
        return  # nothing to draw from (sample_segments cannot report that inside jit)
    obs, action, reward = rollout_arrays()
    o, a, r = segments_jit(jax.random.key(seed), obs, action, reward, jnp.asarray(boundary), 16, length,
                           jnp.asarray(excluded))
    assert o.shape == (16, length, OBS_DIM) and a.shape == (16, length) and r.shape == (16, length)
    check_segments(o, a, r, boundary, excluded, length)


def test_sample_segments_cover_valid_starts_uniformly():
    rng = np.random.default_rng(0)
    boundary = rng.random((T, N)) < 0.2
    excluded = rng.random((T, N)) < 0.1
    length = 3
    ok = brute_force_starts(boundary, excluded, length)
    n_valid = ok.sum()
    assert n_valid > 5
    obs, action, reward = rollout_arrays()
    num = 400 * int(n_valid)
    o, a, r = segments_jit(
        jax.random.key(3), obs, action, reward, jnp.asarray(boundary), num, length, jnp.asarray(excluded))
    t0, n0 = check_segments(o, a, r, boundary, excluded, length)
    counts = np.zeros_like(ok, int)
    np.add.at(counts, (t0, n0), 1)
    assert np.all(counts[~ok] == 0)
    assert np.all(np.abs(counts[ok] - 400) < 100), counts[ok]  # 400 ± 5σ


@settings(max_examples=30, deadline=None)
@given(hnp.arrays(np.int32, 16, elements=st.integers(0, 3)), st.integers(0, 2**31 - 1))  # one shape: one compile
def test_sample_indices_draws_only_what_has_weight(counts, seed):
    idx = np.asarray(sample_indices_jit(jax.random.key(seed), jnp.asarray(counts), 64))
    assert idx.dtype == np.int32 and idx.shape == (64,) and np.all((0 <= idx) & (idx < counts.size))
    if counts.sum() > 0:
        assert np.all(counts[idx] > 0), (counts, idx)


def test_sample_indices_frequencies_follow_the_counts():
    """P(i) = counts[i] / Σ counts (bootstrap counts: a label drawn twice as often as a count of 1);
    all zero: uniform."""
    counts = np.array([0, 1, 3, 0, 2, 0, 0, 4], np.int32)
    n = 100_000
    freq = np.bincount(np.asarray(sample_indices_jit(jax.random.key(5), jnp.asarray(counts), n)), minlength=8) / n
    p = counts / counts.sum()
    assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12), freq
    freq0 = np.bincount(np.asarray(sample_indices_jit(jax.random.key(6), jnp.zeros(8, jnp.float32), n)),
                        minlength=8) / n
    assert np.all(np.abs(freq0 - 1 / 8) < 5 * np.sqrt(1 / 8 * 7 / 8 / n)), freq0


def test_boundary_on_final_step_allowed():
    boundary = np.zeros((T, N), bool)
    boundary[3::4] = True  # episodes of 4 steps: 0-3, 4-7, 8-11
    obs, action, reward = rollout_arrays()
    o, a, r = segments_jit(jax.random.key(0), obs, action, reward, jnp.asarray(boundary), 64, 4, None)
    t0, _ = check_segments(o, a, r, boundary, None, 4)
    assert set(t0.tolist()) == {0, 4, 8}  # only whole episodes fit


def test_sample_candidate_pairs_shapes_and_contents():
    boundary = np.zeros((T, N), bool)
    boundary[5] = True
    obs, action, reward = rollout_arrays()
    pairs = pairs_jit(jax.random.key(0), obs, action, reward, jnp.asarray(boundary), 10, 3, None)
    assert pairs.obs.shape == (10, 2, 3, OBS_DIM)
    assert pairs.action.shape == (10, 2, 3)
    assert pairs.true_reward.shape == (10, 2, 3)
    assert pairs.num_pairs == 10
    flat = lambda x: x.reshape(20, *x.shape[2:])
    check_segments(flat(pairs.obs), flat(pairs.action), flat(pairs.true_reward), boundary, None, 3)
    # the two clips of a pair are drawn independently: not all pairs are a clip with itself
    assert not np.all(np.asarray(pairs.obs[:, 0]) == np.asarray(pairs.obs[:, 1]))
    sub = take_pairs(pairs, jnp.array([7, 2]))
    np.testing.assert_array_equal(sub.obs, pairs.obs[jnp.array([7, 2])])
    np.testing.assert_array_equal(sub.true_reward[1], pairs.true_reward[2])


@settings(max_examples=8)  # each length compiles anew
@given(st.integers(1, T), st.integers(0, 2**31 - 1))
def test_segment_sums_equal_summing_the_gathered_clips(length, seed):
    """Scoring candidates through cumulative sums gives the sums of the clips themselves."""
    rng = np.random.default_rng(seed)
    values = rng.normal(size=(M, T, N)).astype(np.float32)
    t0, env = sample_segment_starts(jax.random.key(seed), jnp.zeros((T, N), bool), 16, length)
    sums = segment_sums(jnp.asarray(values), t0, env, length)
    clips = jnp.stack([gather_segments(jnp.asarray(values[m]), t0, env, length) for m in range(M)])
    np.testing.assert_allclose(np.asarray(sums), np.asarray(clips.sum(-1)), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(t0) + length <= T)


# ------------------------------------------------------------------ disagreement within a run (RunParts)
def test_run_selects_by_the_members_own_preference_predictions():
    """§2.2.4: the variance across members of each member's own P[σ¹ ≻ σ²], from its raw reward sums; the
    per-member normalization (what the agent's r̂ averages) must not enter.  Member 1's normalization scales
    its rewards up 50×, so normalized and raw disagreement rank the candidates differently here."""
    import lanes_check
    from rlhp_jax.loop import RunParts
    from rlhp_jax.preferences import preference_probability
    from rlhp_jax.core import clip_action

    parts = RunParts(lanes_check.test_config())  # CartPole, 2 members, 10-step clips
    ens, seg_len = parts.ensemble, parts.seg_len
    k_agent, k_ens, k_env, k_roll, k_cand = jax.random.split(jax.random.key(0), 5)
    state = ens.init(k_ens).replace(norm_mean=jnp.array([0.3, -2.0]), norm_std=jnp.array([1.0, 0.02]))
    env_state, obs = parts.env.reset(k_env)
    _, _, rollout, member_r = fast_jit(parts.rollout_only)(parts.agent.init(k_agent), env_state, obs, state, k_roll)
    flat = lambda x: x.reshape(-1, *x.shape[2:])
    raw = ens.member_rewards(state, flat(rollout.obs), flat(clip_action(parts.spec, rollout.action)))
    raw = np.asarray(raw).reshape(-1, *rollout.true_reward.shape)  # [M, T, N]
    normalized = ens.reward_std * (raw - np.asarray(state.norm_mean)[:, None, None]) \
        / np.asarray(state.norm_std)[:, None, None]
    # the agent still trains on the mean of the normalized members
    np.testing.assert_allclose(np.asarray(parts.agent_rewards(state, member_r)), normalized.mean(0), rtol=1e-5)

    q = 8
    pool = q * parts.cfg.candidate_factor
    pairs, _ = parts.candidates(member_r, rollout, k_cand, q, q)
    k_pairs, _ = jax.random.split(k_cand)  # the candidate pool candidates() draws
    t0, env = sample_segment_starts(k_pairs, rollout.boundary, 2 * pool, seg_len, excluded=~rollout.valid)

    def most_disputed(member_rewards):
        ret = np.asarray(segment_sums(jnp.asarray(member_rewards), t0, env, seg_len)).reshape(-1, pool, 2)
        p = np.asarray(preference_probability(ret[..., 0], ret[..., 1], ens.config.error_rate))
        return np.argsort(-p.var(axis=0), kind="stable")[:q]

    by_raw, by_normalized = most_disputed(raw), most_disputed(normalized)
    assert set(by_raw) != set(by_normalized)  # the two readings pick different pairs here
    chosen = lambda idx: (np.asarray(t0).reshape(pool, 2)[idx].reshape(-1), np.asarray(env).reshape(pool, 2)[idx]
                          .reshape(-1))
    expected = gather_segments(rollout.obs, *map(jnp.asarray, chosen(by_raw)), seg_len)
    np.testing.assert_array_equal(np.asarray(pairs.obs), np.asarray(expected).reshape(q, 2, seg_len, -1))


@given(st.integers(0, 5000), st.sampled_from([1, 2, 8, 64, 1024]))
def test_query_chunks_cover_the_count_at_one_size(n, size):
    chunks = query_chunks(n, size)
    assert all(q == size and 1 <= take <= size for q, take in chunks)
    assert sum(take for _, take in chunks) == n and all(take == size for _, take in chunks[:-1])


@pytest.mark.parametrize("most, size", [(0, 1), (1, 1), (3, 4), (64, 64), (65, 128), (5000, 1024)])
def test_chunk_size_is_the_largest_count_rounded_up_to_a_power_of_two(most, size):
    assert chunk_size(most) == size

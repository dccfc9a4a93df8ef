"""The benchmark suite (experiments/benchmark.py) on its cheapest settings: the files it writes,
their stamp, and that a failing or missing section is recorded instead of ending the run.
Speed itself is never asserted (DESIGN: measured in benchmarks, not in tests)."""

from __future__ import annotations

import json
import math
import sys
import types

import pytest

from experiments import benchmark


def _only_file(path, suffix):
    files = sorted(path.glob(f"benchmark-*{suffix}"))
    assert len(files) == 1, files
    return files[0]


def test_quick_env_and_reward_write_stamped_json_and_markdown(tmp_path, capsys):
    out = benchmark.main(["--quick", "--repeats", "1", "--sections", "env", "reward", "draws", "clips", "--tasks", "CartPole-v1",
                          "--envs", "8", "--models", "mlp", "--out", str(tmp_path)])
    data = json.loads(_only_file(tmp_path, ".json").read_text())
    md = _only_file(tmp_path, ".md").read_text()
    assert data["stamp"]["platform"] in _only_file(tmp_path, ".json").name

    stamp = data["stamp"]
    for field in ("date", "device_kind", "platform", "device_count", "cpu_model", "cpu_cores", "command"):
        assert stamp[field], field
    assert stamp["device_count"] >= 1 and stamp["cpu_cores"] >= 1
    for lib in ("python", "jax", "jaxlib", "flax", "optax", "envpool", "gymnax", "numpy"):
        assert lib in stamp["versions"], lib
    assert stamp["versions"]["jax"] and stamp["versions"]["python"]
    assert stamp["quick"] is True
    assert set(stamp["sections"]) == {"env", "reward", "draws", "clips"}
    assert all(s["status"] == "ok" and "note" not in s for s in stamp["sections"].values()), stamp["sections"]

    rows = data["rows"]
    names = [(r["section"], r["name"]) for r in rows]
    assert names == [("env", "CartPole-v1, 8 envs"),
                     ("reward", "MLP, 1 member, vmap"), ("reward", "MLP, 3 members, vmap"),
                     ("reward", "MLP vmap: 3 members / 1 member"),
                     ("draws", "inverse CDF, 640 among 4,160"), ("draws", "categorical, 640 among 4,160"),
                     ("clips", "CartPole-v1, 60 frames")]
    for r in rows:
        assert "error" not in r, r
        assert isinstance(r["value"], float) and math.isfinite(r["value"]) and r["value"] > 0, r
        assert r["unit"]
        assert r["peak_rss_mib"] > 0
    env, one, three, ratio, inverse, categorical, clips = rows
    assert inverse["unit"] == categorical["unit"] == "draws/s" and inverse["draws"] == 640
    assert clips["unit"] == "frames/s" and clips["frames"] == 60 and clips["size"] == 256
    assert math.isclose(clips["ms_per_clip"], 60_000 / clips["value"])
    assert env["unit"] == "env steps/s" and env["num_envs"] == 8 and env["library"] == "gymnax"
    assert one["unit"] == three["unit"] == "clip pairs/s" and (one["members"], three["members"]) == (1, 3)
    assert math.isclose(ratio["value"], one["steps_per_s"] / three["steps_per_s"])
    assert out["rows"] == rows

    # the Markdown table: header, then one line per row with its name and formatted value
    assert "| section | name | value | unit |" in md
    for r in rows:
        line = next((ln for ln in md.splitlines() if f"| {r['section']} | {r['name']} |" in ln), None)
        assert line is not None, r["name"]
        assert benchmark._fmt(r["value"]) in line
    assert stamp["device_kind"] in md and f"jax {stamp['versions']['jax']}" in md
    assert md in capsys.readouterr().out  # the same table is printed


def test_failing_section_and_missing_loop_module_are_recorded(tmp_path, monkeypatch):
    def broken(args):
        raise RuntimeError("no such accelerator")

    monkeypatch.setitem(benchmark.SECTIONS, "agent", broken)
    monkeypatch.setitem(sys.modules, "experiments.benchmark_loop", None)  # import -> ImportError
    # a measurement that fails inside a working section: an error row, the others still run
    monkeypatch.setitem(benchmark.ENV_TASKS, "NoSuchTask-v0", ((8,), (8,)))
    out = benchmark.main(["--quick", "--repeats", "1", "--sections", "agent", "loop", "env",
                          "--tasks", "NoSuchTask-v0", "--out", str(tmp_path)])
    sections = out["stamp"]["sections"]
    assert sections["agent"]["status"] == "failed" and "no such accelerator" in sections["agent"]["note"]
    assert sections["loop"]["status"] == "skipped" and sections["loop"]["rows"] == 0
    assert sections["env"]["status"] == "ok" and "1 measurement(s) failed" in sections["env"]["note"]
    errors = {r["section"]: r for r in out["rows"]}
    assert errors["agent"]["value"] is None and "RuntimeError" in errors["agent"]["error"]
    assert errors["env"]["value"] is None and "NoSuchTask-v0" in errors["env"]["error"]
    md = (tmp_path / out["markdown"].split("/")[-1]).read_text()
    assert "**failed**" in md and "section `loop` skipped" in md and "section `agent` failed" in md


def test_loop_section_takes_its_rows_from_benchmark_loop(tmp_path, monkeypatch):
    seen = []

    def rows(args):
        seen.append(args.quick)
        return [{"name": "CartPole-v1, 8 seeds", "value": 1234.5, "unit": "seeds·env steps/s", "seeds": 8}]

    monkeypatch.setitem(sys.modules, "experiments.benchmark_loop", types.SimpleNamespace(rows=rows))
    out = benchmark.main(["--quick", "--sections", "loop", "--out", str(tmp_path)])
    assert seen == [True]
    (row,) = out["rows"]
    assert row["section"] == "loop" and row["value"] == 1234.5 and row["peak_rss_mib"] > 0
    assert out["stamp"]["sections"]["loop"]["status"] == "ok"
    md = (tmp_path / out["markdown"].split("/")[-1]).read_text()
    assert "| loop | CartPole-v1, 8 seeds | 1,234 | seeds·env steps/s | seeds=8 |" in md


def test_an_out_that_is_a_file_is_refused_before_any_measurement(tmp_path, monkeypatch, capsys):
    def measured(args):
        raise AssertionError("a section ran before --out was checked")

    monkeypatch.setitem(benchmark.SECTIONS, "env", measured)
    (tmp_path / "file").write_text("mine")
    with pytest.raises(SystemExit) as stop:
        benchmark.main(["--quick", "--sections", "env", "--out", str(tmp_path / "file")])
    assert stop.value.code == 2
    assert "--out" in capsys.readouterr().err and (tmp_path / "file").read_text() == "mine"

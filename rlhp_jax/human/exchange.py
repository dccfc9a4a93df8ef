"""Labeled sets in and out of a label store, as JSONL (one pair per line).

A line::

    {"id": "q…", "env": "CartPole-v1", "created": 1.7e9, "wanted": 1, "withdrawn": null,
     "left_clip": "clips/q…-left.mp4", "right_clip": "clips/q…-right.mp4",   # relative to the JSONL file
     "info": {"env_steps": 4096, "true_returns": [12.0, 7.5], …},
     "segments": "<base64 of an .npz with obs, action, true_reward, render [2, T, …]>" | null,
     "labels": [{"labeler": "ann", "choice": "left", "mu": 1.0, "created": …, "offered": …, "response_s": 2.4}]}

The segment arrays travel inside the file, so an exported set trains another reward model
anywhere (``load_labeled``); clips stay files next to it.  Importing is idempotent: a pair or an
answer already in the store is skipped.  Importing copies clips that lie outside the store's
directory into its ``clips/`` folder and refuses paths that do not exist.
"""

from __future__ import annotations

import base64
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlhp_jax.human.store import CHOICES, MU, LabelStore, StoreError, check_query_id
from rlhp_jax.human.teacher import save_npz


def pair_lines(store: LabelStore, base: str | os.PathLike, labeled_only: bool = False, embed_segments: bool = True):
    """The store's pairs as JSONL records (clip paths relative to ``base``), oldest first."""
    base = Path(base).resolve()
    for q in store._conn().execute("SELECT * FROM queries ORDER BY rowid").fetchall():
        labels = store.labels_for(q["id"])
        if labeled_only and not labels:
            continue
        info = json.loads(q["info"])
        segments = None
        if embed_segments and q["segments"]:
            segments = base64.b64encode(store.resolve(q["segments"]).read_bytes()).decode("ascii")
        yield dict(
            id=q["id"], env=info.get("env"), created=q["created"], wanted=q["wanted"], withdrawn=q["withdrawn"],
            left_clip=os.path.relpath(store.resolve(q["left_clip"]), base),
            right_clip=os.path.relpath(store.resolve(q["right_clip"]), base),
            info=info, segments=segments,
            labels=[dict(labeler=lab.labeler, choice=lab.choice, mu=lab.mu, created=lab.created,
                         offered=lab.offered, response_s=lab.response_s) for lab in labels])


def export_jsonl(store: LabelStore, path: str | os.PathLike, labeled_only: bool = False,
                 embed_segments: bool = True) -> int:
    """Write every pair of ``store`` (or only answered ones) to ``path``; returns the line count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        for line in pair_lines(store, path.parent, labeled_only, embed_segments):
            f.write(json.dumps(line) + "\n")
            n += 1
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return n


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Lines of a labeled-set file, checked: a clear error names the first bad line."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    lines = []
    for i, text in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            d = json.loads(text)
            check_query_id(str(d["id"]))
            for k in ("left_clip", "right_clip"):
                if not isinstance(d[k], str):
                    raise ValueError(f"{k} must be a path")
            for lab in d.get("labels") or []:
                if lab.get("choice") not in CHOICES:
                    raise ValueError(f"choice must be one of {', '.join(CHOICES)}")
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, StoreError) as e:
            raise ValueError(f"{path}, line {i}: not a labeled pair ({e})") from None
        lines.append(d)
    return lines


def import_jsonl(store: LabelStore, path: str | os.PathLike, wanted: int | None = None) -> dict[str, int]:
    """Add the pairs and answers of ``path`` to ``store``; ``wanted`` overrides each pair's."""
    path = Path(path)
    base = path.parent.resolve()
    added = dict(pairs=0, labels=0, skipped_pairs=0, skipped_labels=0)
    for d in read_jsonl(path):
        exists = store._conn().execute("SELECT 1 FROM queries WHERE id = ?", (d["id"],)).fetchone() is not None
        if exists:
            added["skipped_pairs"] += 1
        else:
            clips = [_inside(store, base, d[k], d["id"]) for k in ("left_clip", "right_clip")]
            seg = None
            if d.get("segments"):
                seg = store.root / "segments" / f"{d['id']}.npz"
                seg.parent.mkdir(parents=True, exist_ok=True)
                try:
                    arrays = np.load(io.BytesIO(base64.b64decode(d["segments"])))
                    save_npz(seg, **{k: arrays[k] for k in arrays.files})
                except Exception as e:  # noqa: BLE001 — any decoding failure is the file's fault
                    raise ValueError(f"{path}: pair {d['id']} has unreadable segments ({e})") from None
            info = dict(d.get("info") or {})
            if d.get("env"):
                info.setdefault("env", d["env"])
            store.add_query(clips[0], clips[1], seg, info, wanted=d.get("wanted", 1) if wanted is None else wanted,
                            query_id=d["id"], created=d.get("created"))
            if d.get("withdrawn"):
                store.withdraw([d["id"]])
            added["pairs"] += 1
        for lab in d.get("labels") or []:
            ok = store.add_label(d["id"], lab["labeler"], lab["choice"], lab.get("created"), lab.get("offered"),
                                 lab.get("response_s"))
            added["labels" if ok else "skipped_labels"] += 1
    return added


def _inside(store: LabelStore, base: Path, rel: str, qid: str) -> Path:
    """A clip named in an imported file, as a path inside the store's directory (copied in if needed)."""
    src = (base / rel).resolve()
    if not src.is_file():
        raise ValueError(f"pair {qid}: clip {rel!r} not found (paths are relative to the JSONL file)")
    if src.is_relative_to(store.root):
        return src
    dst = store.root / "clips" / "imported" / f"{qid}-{src.name}"
    dst.parent.mkdir(parents=True, exist_ok=True)
    if not dst.exists():
        shutil.copyfile(src, dst)
    return dst


def load_labeled(path: str | os.PathLike, labeler: str | None = None):
    """Training data from a labeled-set file: ``(arrays, mu, env)`` with ``arrays`` holding
    ``obs``/``action``/``true_reward`` ``[n, 2, T, …]`` and ``mu`` ``[n]`` — one row per answer
    (of ``labeler`` only, if given) that can be trained on ("can't tell" and pairs without
    segments are left out)."""
    rows, mus, envs = [], [], set()
    for d in read_jsonl(path):
        if not d.get("segments"):
            continue
        arrays = None
        for lab in d.get("labels") or []:
            if MU[lab["choice"]] is None or (labeler is not None and lab["labeler"] != labeler):
                continue
            if arrays is None:
                z = np.load(io.BytesIO(base64.b64decode(d["segments"])))
                arrays = {k: z[k] for k in ("obs", "action", "true_reward")}
            rows.append(arrays)
            mus.append(MU[lab["choice"]])
            envs.add(d.get("env") or d.get("info", {}).get("env"))
    if not rows:
        raise ValueError(f"{path}: no answers that can be trained on (left, right or tie with saved segments)")
    if len(envs) > 1:
        raise ValueError(f"{path}: pairs from several tasks ({', '.join(map(str, envs))}); train one task at a time")
    out = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    return out, np.asarray(mus, np.float32), envs.pop()


def agreement_stats(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Per labeler: answers, share of each choice, median response time, agreement with the
    oracle (pairs whose ``info.true_returns`` differ; ties and "can't tell" excluded); and for
    every two labelers, how often they gave the same answer on the pairs both answered."""
    per: dict[str, dict[str, Any]] = {}
    answers: dict[str, dict[str, str]] = {}
    for d in lines:
        true = (d.get("info") or {}).get("true_returns")
        for lab in d.get("labels") or []:
            s = per.setdefault(lab["labeler"], dict(answers=0, choices={c: 0 for c in CHOICES}, times=[],
                                                    oracle_same=0, oracle_compared=0))
            s["answers"] += 1
            s["choices"][lab["choice"]] += 1
            if lab.get("response_s") is not None:
                s["times"].append(lab["response_s"])
            if true and len(true) == 2 and true[0] != true[1] and lab["choice"] in ("left", "right"):
                s["oracle_compared"] += 1
                s["oracle_same"] += int((lab["choice"] == "left") == (true[0] > true[1]))
            answers.setdefault(lab["labeler"], {})[d["id"]] = lab["choice"]
    labelers = {}
    for name, s in sorted(per.items()):
        labelers[name] = dict(
            answers=s["answers"], choices=s["choices"],
            median_response_s=float(np.median(s["times"])) if s["times"] else None,
            oracle_agreement=s["oracle_same"] / s["oracle_compared"] if s["oracle_compared"] else None,
            oracle_compared=s["oracle_compared"])
    pairs = {}
    names = sorted(answers)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            shared = set(answers[a]) & set(answers[b])
            if shared:
                same = sum(answers[a][q] == answers[b][q] for q in shared)
                pairs[f"{a} vs {b}"] = dict(shared=len(shared), agreement=same / len(shared))
    return dict(pairs=len(lines), answers=sum(s["answers"] for s in per.values()), labelers=labelers,
                between_labelers=pairs)

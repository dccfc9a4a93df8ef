"""The label store (layer 4: data): queries shown to people and their answers, in SQLite.

One file, ``labels.sqlite``, in a run directory (or beside a saved queue), opened in WAL mode
with ``synchronous=FULL``: every answer is one committed transaction before the page hears
"recorded", so killing the server or the trainer (even SIGKILL) loses nothing that was
acknowledged, and a restarted server offers the same open pairs again.  The trainer and the
web server may be different processes; SQLite's locking keeps them consistent.

Tables
  ``queries`` — one row per pair: its clips (paths relative to the store's root directory,
  never outside it), the saved segment arrays the trainer learns from, how many distinct
  labelers should answer it (``wanted``: 1 while training; 0 means every labeler, for
  agreement studies), whether the trainer withdrew it, and ``info`` (task, steps, the true
  returns for diagnostics — never shown on the page).
  ``leases`` — one row per offer of a pair to a labeler: a random token, when it was offered
  and when the offer lapses.  A pair is offered to one person at a time; when the lease lapses
  it is offered again.  Old leases are kept, so a late answer still identifies its offer.
  ``labels`` — one row per answer (``left``, ``right``, ``tie``, ``cant_tell``), with the
  labeler, the time and the response time (offer to answer).  ``UNIQUE(query, labeler)``:
  a second answer from the same person is a no-op, never a second label.
  ``meta`` — small key/value facts the trainer publishes for the page (labels due, …).

Labelers are known by the name they type (:func:`check_labeler`: NFC, 1-64 letters or numbers of
any script, spaces and - _ . @; the page checks the very same character class).

Answer semantics: the first answer from a labeler counts.  A repeated or late submission is
idempotent: it reports what was recorded and writes nothing.  A late answer to a pair that no
one else has answered yet is still recorded (a label is worth keeping).  An answer to a
withdrawn pair is refused.  Labels map to the preference μ of Christiano §2.2: left → 1
(σ¹ preferred), right → 0, tie → 0.5; "can't tell" is kept but never trained on.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import secrets
import sqlite3
import sys
import threading
import time
import unicodedata
from pathlib import Path
from typing import Any, Callable, Iterable

from rlhp_jax.files import ForeignLink, refuse_link

CHOICES = ("left", "right", "tie", "cant_tell")
MU = {"left": 1.0, "right": 0.0, "tie": 0.5, "cant_tell": None}
DEFAULT_LEASE_S = 120.0  # a pair not answered in 2 minutes goes back to the queue
MAX_LEASE_S = 86400.0  # a day: a longer lease would keep a pair from everyone else for good

_SCHEMA = """
CREATE TABLE IF NOT EXISTS queries (
    id TEXT PRIMARY KEY,
    created REAL NOT NULL,
    left_clip TEXT NOT NULL,
    right_clip TEXT NOT NULL,
    segments TEXT,
    wanted INTEGER NOT NULL DEFAULT 1,
    withdrawn REAL,
    info TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS leases (
    token TEXT PRIMARY KEY,
    query_id TEXT NOT NULL REFERENCES queries(id),
    labeler TEXT NOT NULL,
    offered REAL NOT NULL,
    expires REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS leases_query ON leases(query_id, expires);
CREATE TABLE IF NOT EXISTS labels (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    query_id TEXT NOT NULL REFERENCES queries(id),
    labeler TEXT NOT NULL,
    choice TEXT NOT NULL CHECK (choice IN ('left', 'right', 'tie', 'cant_tell')),
    created REAL NOT NULL,
    offered REAL,
    response_s REAL,
    UNIQUE (query_id, labeler)
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


class StoreError(Exception):
    """Base of the errors a client can cause; ``status`` is the HTTP status the server answers."""

    status = 400


class UnknownQuery(StoreError):
    status = 404


class QueryWithdrawn(StoreError):
    status = 410


class BadLease(StoreError):
    status = 409


class StoreUnavailable(ValueError):
    """The file is not a label store this process can use (not a database, damaged, a directory,
    read-only); raised when the store is opened, before anything is written."""


@dataclasses.dataclass(frozen=True)
class Offer:
    query_id: str
    token: str
    labeler: str
    left_clip: str
    right_clip: str
    offered: float
    expires: float


@dataclasses.dataclass(frozen=True)
class Label:
    id: int
    query_id: str
    labeler: str
    choice: str
    created: float
    offered: float | None
    response_s: float | None

    @property
    def mu(self) -> float | None:
        return MU[self.choice]


@dataclasses.dataclass(frozen=True)
class Submitted:
    recorded: bool  # False: this labeler had already answered, or the pair had its answers
    label: Label | None  # the label now on record for this labeler (None if the pair was full)
    reason: str = ""


LABELER_PUNCTUATION = " _.@-"


@functools.cache
def labeler_chars() -> str:
    """The characters a labeler's name may hold, as the body of a regular-expression character
    class that Python's ``re`` and JavaScript's ``RegExp(..., "u")`` read alike: every Unicode
    letter and number (general category L* or N*, as this Python's ``unicodedata`` has them) in
    ranges of literal characters, then space _ . @ - (the page gets this string, so its check is
    the server's, whatever Unicode version the browser knows)."""
    ranges, start = [], None
    for code in range(sys.maxunicode + 2):
        ok = code <= sys.maxunicode and unicodedata.category(chr(code))[0] in "LN"
        if ok and start is None:
            start = code
        elif not ok and start is not None:
            ranges.append(chr(start) if start == code - 1 else f"{chr(start)}-{chr(code - 1)}")
            start = None
    return "".join(ranges) + LABELER_PUNCTUATION


@functools.cache
def _labeler_re() -> re.Pattern:
    return re.compile(f"[{labeler_chars()}]{{1,64}}")


def normalize_labeler(name: str) -> str:
    """A name as typed -> as compared and recorded: NFC, spaces (only) stripped from both ends."""
    return unicodedata.normalize("NFC", name).strip(" ")


def check_labeler(name: str) -> str:
    """The labeler's name as recorded, or :class:`StoreError`: after :func:`normalize_labeler`,
    1-64 code points, each a letter or number in any script or one of space _ . @ -.  The page
    applies the same rule (``static/index.html``, with :func:`labeler_chars`)."""
    name = normalize_labeler(name if isinstance(name, str) else "")
    if _labeler_re().fullmatch(name) is None:
        raise StoreError("labeler must be 1-64 characters of letters, digits, spaces and - _ . @")
    return name


def check_lease_s(lease_s: float) -> float:
    """How long an offer holds: a finite number of seconds, more than 0 and at most a day."""
    try:
        value = float(lease_s)
    except (TypeError, ValueError):
        value = math.nan
    if not 0 < value <= MAX_LEASE_S:  # NaN fails every comparison
        raise ValueError(f"a lease must be a number of seconds more than 0 and at most {MAX_LEASE_S:g} "
                         f"(a day), got {lease_s!r}")
    return value


class LabelStore:
    """Thread- and process-safe access to one ``labels.sqlite``.

    ``root`` is the directory clip and segment paths are relative to (the run directory);
    ``clock`` is injectable so lease expiry can be tested without sleeping.
    """

    FILENAME = "labels.sqlite"

    def __init__(self, root: str | os.PathLike, path: str | os.PathLike | None = None,
                 clock: Callable[[], float] = time.time):
        self.root = Path(root).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.path = Path(path) if path is not None else self.root / self.FILENAME
        self.clock = clock
        self._local = threading.local()
        why = _unusable_reason(self.path)
        if why is not None:
            raise StoreUnavailable(f"{self.path} is not a label store: {why}")
        try:
            self._conn().executescript(_SCHEMA)  # idempotent (IF NOT EXISTS); executescript manages its own commit
        except sqlite3.Error as e:  # damaged beyond its header, unreadable: SQLite refused before writing to it
            self.close()
            raise StoreUnavailable(f"{self.path} is not a label store SQLite can use ({e})") from None

    # ------------------------------------------------------------------ connections
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30.0, isolation_level=None)
            conn.row_factory = sqlite3.Row
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")  # an acknowledged answer survives power loss too
            conn.execute("PRAGMA foreign_keys=ON")
            self._local.conn = conn
        return conn

    class _Tx:
        """One write transaction; inside another one (of this thread's connection) a savepoint of
        it instead, so :meth:`transaction` makes several writes commit together or not at all."""

        def __init__(self, conn):
            self.conn = conn

        def __enter__(self):
            self.nested = self.conn.in_transaction
            # one writer at a time: leases and answers never race
            self.conn.execute("SAVEPOINT nested" if self.nested else "BEGIN IMMEDIATE")
            return self.conn

        def __exit__(self, exc_type, *_):
            if not self.nested:
                self.conn.execute("ROLLBACK" if exc_type else "COMMIT")
                return
            if exc_type:  # undo this block only; the outer transaction decides the rest
                self.conn.execute("ROLLBACK TO nested")
            self.conn.execute("RELEASE nested")

    def _tx(self):
        return self._Tx(self._conn())

    def transaction(self):
        """A context in which this thread's writes (:meth:`add_query`, :meth:`add_label`,
        :meth:`withdraw`, …) form one transaction: all committed at its end, or none if it raises
        (importing a labeled set is all or nothing).  It holds the write lock throughout: keep it short."""
        return self._tx()

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def check_writable(self) -> None:
        """Raise :class:`StoreUnavailable` unless answers can be recorded here: the file and its
        directory (where SQLite keeps the write-ahead log) must be writable."""
        for what, path in (("file", self.path), ("directory", self.path.parent)):
            if path.exists() and not os.access(path, os.W_OK):
                raise StoreUnavailable(f"{self.path} is read-only (its {what} is not writable): answers could not "
                                       "be recorded")

    # ------------------------------------------------------------------ paths
    def relative(self, path: str | os.PathLike) -> str:
        """``path`` as stored: relative to the root, refused if it leaves the root."""
        p = Path(path)
        full = (p if p.is_absolute() else self.root / p).resolve()
        if not full.is_relative_to(self.root):
            raise StoreError(f"path {str(path)!r} is outside {self.root}")
        return full.relative_to(self.root).as_posix()

    def resolve(self, stored: str) -> Path:
        """The file behind a stored relative path; raises if it would leave the root (a
        tampered database or symlink cannot make the server read outside the run)."""
        full = (self.root / stored).resolve()
        if not full.is_relative_to(self.root):
            raise UnknownQuery("clip not found")
        return full

    # ------------------------------------------------------------------ queries
    def add_query(self, left_clip: str, right_clip: str, segments: str | None = None, info: dict | None = None,
                  wanted: int = 1, query_id: str | None = None, created: float | None = None) -> str:
        if wanted < 0:
            raise ValueError(f"wanted must be >= 0 (0: every labeler), got {wanted}")
        qid = query_id or f"q{int(self.clock() * 1000):013d}-{secrets.token_hex(4)}"
        check_query_id(qid)
        row = (qid, self.clock() if created is None else created, self.relative(left_clip),
               self.relative(right_clip), None if segments is None else self.relative(segments), int(wanted),
               json.dumps(info or {}))
        with self._tx() as db:
            db.execute("INSERT INTO queries (id, created, left_clip, right_clip, segments, wanted, info) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)", row)
        return qid

    def query(self, query_id: str) -> dict[str, Any]:
        r = self._conn().execute("SELECT * FROM queries WHERE id = ?", (query_id,)).fetchone()
        if r is None:
            raise UnknownQuery(f"unknown pair {query_id!r}")
        d = dict(r)
        d["info"] = json.loads(d["info"])
        return d

    def all_queries(self, limit: int | None = None) -> list[sqlite3.Row]:
        """Every pair's row (answered, open or withdrawn), oldest first; at most ``limit``."""
        sql = "SELECT * FROM queries ORDER BY rowid" + ("" if limit is None else f" LIMIT {int(limit)}")
        return self._conn().execute(sql).fetchall()

    def withdraw(self, query_ids: Iterable[str]) -> int:
        """Stop offering pairs (e.g. clips of a long-gone policy); answers already given stay."""
        ids = list(query_ids)
        with self._tx() as db:
            n = 0
            for q in ids:
                n += db.execute("UPDATE queries SET withdrawn = ? WHERE id = ? AND withdrawn IS NULL",
                                (self.clock(), q)).rowcount
        return n

    def open_queries(self) -> list[str]:
        """Pairs still waiting for answers (not withdrawn, fewer answers than wanted)."""
        rows = self._conn().execute(
            "SELECT q.id FROM queries q WHERE q.withdrawn IS NULL AND (q.wanted = 0 OR "
            "(SELECT COUNT(*) FROM labels l WHERE l.query_id = q.id) < q.wanted) ORDER BY q.rowid").fetchall()
        return [r["id"] for r in rows]

    # ------------------------------------------------------------------ offers
    def lease(self, labeler: str, lease_s: float = DEFAULT_LEASE_S) -> Offer | None:
        """The pair this labeler should answer next, leased to them for ``lease_s`` seconds.

        A labeler who still holds a live lease gets the same pair again (a page reload does not
        skip a pair).  Otherwise the oldest open pair that this labeler has not answered and that
        is not leased to someone else (beyond the answers still wanted) is leased.  ``lease_s``:
        see :func:`check_lease_s` (ValueError otherwise)."""
        labeler = check_labeler(labeler)
        lease_s = check_lease_s(lease_s)
        now = self.clock()
        with self._tx() as db:
            held = db.execute(
                "SELECT l.*, q.left_clip, q.right_clip FROM leases l JOIN queries q ON q.id = l.query_id "
                "WHERE l.labeler = ? AND l.expires > ? AND q.withdrawn IS NULL AND NOT EXISTS "
                "(SELECT 1 FROM labels x WHERE x.query_id = l.query_id AND x.labeler = l.labeler) "
                "AND (q.wanted = 0 OR (SELECT COUNT(*) FROM labels x WHERE x.query_id = q.id) < q.wanted) "
                "ORDER BY l.offered LIMIT 1", (labeler, now)).fetchone()
            if held is not None:
                return Offer(held["query_id"], held["token"], labeler, held["left_clip"], held["right_clip"],
                             held["offered"], held["expires"])
            q = db.execute(
                "SELECT q.id, q.left_clip, q.right_clip FROM queries q WHERE q.withdrawn IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM labels x WHERE x.query_id = q.id AND x.labeler = ?) "
                "AND (q.wanted = 0 OR (SELECT COUNT(*) FROM labels x WHERE x.query_id = q.id) + "
                "     (SELECT COUNT(DISTINCT l.labeler) FROM leases l WHERE l.query_id = q.id AND l.expires > ? "
                "      AND l.labeler != ?) < q.wanted) "
                "ORDER BY q.rowid LIMIT 1", (labeler, now, labeler)).fetchone()
            if q is None:
                return None
            token = secrets.token_urlsafe(16)
            db.execute("INSERT INTO leases (token, query_id, labeler, offered, expires) VALUES (?, ?, ?, ?, ?)",
                       (token, q["id"], labeler, now, now + lease_s))
            return Offer(q["id"], token, labeler, q["left_clip"], q["right_clip"], now, now + lease_s)

    def release(self, token: str) -> None:
        """Give a leased pair back at once (the labeler skipped it or closed the page)."""
        with self._tx() as db:
            db.execute("UPDATE leases SET expires = MIN(expires, ?) WHERE token = ?", (self.clock(), token))

    # ------------------------------------------------------------------ answers
    def submit(self, query_id: str, token: str, choice: str) -> Submitted:
        """Record the answer to the offer ``token`` of pair ``query_id`` (idempotent)."""
        if choice not in CHOICES:
            raise StoreError(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}")
        now = self.clock()
        with self._tx() as db:
            q = db.execute("SELECT * FROM queries WHERE id = ?", (query_id,)).fetchone()
            if q is None:
                raise UnknownQuery(f"unknown pair {query_id!r}")
            lease = db.execute("SELECT * FROM leases WHERE token = ?", (token,)).fetchone()
            if lease is None or lease["query_id"] != query_id:
                raise BadLease("this pair was not offered with that lease; load the next pair")
            labeler = lease["labeler"]
            mine = db.execute("SELECT * FROM labels WHERE query_id = ? AND labeler = ?", (query_id, labeler)).fetchone()
            if mine is not None:
                return Submitted(False, _label(mine), "already answered")
            if q["withdrawn"] is not None:
                raise QueryWithdrawn("this pair was withdrawn by the trainer; load the next pair")
            count = db.execute("SELECT COUNT(*) FROM labels WHERE query_id = ?", (query_id,)).fetchone()[0]
            if q["wanted"] and count >= q["wanted"]:
                return Submitted(False, None, "already answered by someone else")
            cur = db.execute(
                "INSERT INTO labels (query_id, labeler, choice, created, offered, response_s) VALUES (?, ?, ?, ?, ?, ?)",
                (query_id, labeler, choice, now, lease["offered"], now - lease["offered"]))
            db.execute("UPDATE leases SET expires = MIN(expires, ?) WHERE token = ?", (now, token))
            row = db.execute("SELECT * FROM labels WHERE id = ?", (cur.lastrowid,)).fetchone()
            return Submitted(True, _label(row))

    def add_label(self, query_id: str, labeler: str, choice: str, created: float | None = None,
                  offered: float | None = None, response_s: float | None = None) -> bool:
        """Record an answer without a lease (importing a labeled set); False if already there."""
        if choice not in CHOICES:
            raise StoreError(f"choice must be one of {', '.join(CHOICES)}, got {choice!r}")
        labeler = check_labeler(labeler)
        with self._tx() as db:
            if db.execute("SELECT 1 FROM queries WHERE id = ?", (query_id,)).fetchone() is None:
                raise UnknownQuery(f"unknown pair {query_id!r}")
            cur = db.execute(
                "INSERT OR IGNORE INTO labels (query_id, labeler, choice, created, offered, response_s) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (query_id, labeler, choice, self.clock() if created is None else created, offered, response_s))
            return cur.rowcount == 1

    def labels_since(self, cursor: int = 0, limit: int | None = None) -> list[Label]:
        """Answers with id > ``cursor`` in the order they were recorded (the trainer's feed)."""
        sql = "SELECT * FROM labels WHERE id > ? ORDER BY id" + (f" LIMIT {int(limit)}" if limit else "")
        return [_label(r) for r in self._conn().execute(sql, (int(cursor),)).fetchall()]

    def labels_for(self, query_id: str) -> list[Label]:
        rows = self._conn().execute("SELECT * FROM labels WHERE query_id = ? ORDER BY id", (query_id,)).fetchall()
        return [_label(r) for r in rows]

    # ------------------------------------------------------------------ status
    def counts(self, labeler: str | None = None) -> dict[str, int]:
        db, now = self._conn(), self.clock()
        one = lambda sql, *a: db.execute(sql, a).fetchone()[0]
        out = dict(
            queries=one("SELECT COUNT(*) FROM queries"),
            labels=one("SELECT COUNT(*) FROM labels"),
            cant_tell=one("SELECT COUNT(*) FROM labels WHERE choice = 'cant_tell'"),
            open=len(self.open_queries()),
            leased=one("SELECT COUNT(DISTINCT query_id) FROM leases WHERE expires > ?", now),
            withdrawn=one("SELECT COUNT(*) FROM queries WHERE withdrawn IS NOT NULL"),
            labelers=one("SELECT COUNT(DISTINCT labeler) FROM labels"),
        )
        if labeler is not None:
            out["mine"] = one("SELECT COUNT(*) FROM labels WHERE labeler = ?", labeler)
            out["queued_for_me"] = one(
                "SELECT COUNT(*) FROM queries q WHERE q.withdrawn IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM labels x WHERE x.query_id = q.id AND x.labeler = ?) "
                "AND (q.wanted = 0 OR (SELECT COUNT(*) FROM labels x WHERE x.query_id = q.id) < q.wanted)", labeler)
        return out

    def set_meta(self, **values: Any) -> None:
        with self._tx() as db:
            for k, v in values.items():
                db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (k, json.dumps(v)))

    def meta(self) -> dict[str, Any]:
        return {r["key"]: json.loads(r["value"]) for r in self._conn().execute("SELECT * FROM meta").fetchall()}


def _unusable_reason(path: Path) -> str | None:
    """Why the file at ``path`` cannot be opened as a store, judged from its first 100 bytes without
    SQLite (which would first create journal files beside it), or None (absent or empty: a new
    store; or a sound-looking SQLite database).  Damage deeper in a file that passes is reported
    by SQLite when the store is opened or read."""
    for name in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):  # SQLite opens (and writes) through links
        try:
            refuse_link(name, "label store")
        except ForeignLink as e:
            return str(e)
    try:
        if not path.exists():
            return None
        if path.is_dir():
            return "it is a directory"
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        return f"it cannot be read ({e.strerror or e})"
    if not head:
        return None
    if len(head) < 100 or not head.startswith(b"SQLite format 3\x00"):
        return "it is not an SQLite database"
    page = int.from_bytes(head[16:18], "big")
    page = 65536 if page == 1 else page
    pages = int.from_bytes(head[28:32], "big")
    size_valid = head[92:96] == head[24:28]  # the header's page count is current (SQLite >= 3.7.0)
    size = path.stat().st_size
    if size_valid and not Path(f"{path}-wal").exists() and size < page * pages:
        return f"it is cut short ({size} of its {page * pages} bytes)"
    return None


def check_query_id(qid: str) -> str:
    """A pair id names its clips' URLs (``/api/clip/ID/left``) and its segments' file: ASCII letters
    and digits first, then those and ``- _ .`` (``.`` or ``..`` alone would be read as a folder of
    the URL, and the pair's clips would never load)."""
    if not (isinstance(qid, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", qid)):
        raise StoreError("pair id must be 1-64 ASCII letters, digits and - _ ., beginning with a letter or digit")
    return qid


def _label(r: sqlite3.Row) -> Label:
    return Label(r["id"], r["query_id"], r["labeler"], r["choice"], r["created"], r["offered"], r["response_s"])

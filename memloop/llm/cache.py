"""Persistent response cache (sqlite, WAL) shared by threads and processes.

A key covers everything that changes an answer: base_url, model, messages, every generation
parameter and a sample index, so repeated stochastic draws stay distinct and a rerun replays
them exactly. The API key is never part of a key or a value.
"""

from __future__ import annotations

import errno
import json
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from memloop.core.errors import UserError
from memloop.core.files import file_lock, json_sha256, sqlite_problem


def cache_key(
    *,
    base_url: str,
    model: str,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    sample: int,
    draw: int = 0,
) -> str:
    """The key of one request.

    `draw` (a repeat of a whole run) enters it only when nonzero, so the keys of draw 0 are those
    of a run without repeats.
    """
    payload = {
        "base_url": base_url,
        "model": model,
        "messages": messages,
        "params": {k: v for k, v in params.items() if v is not None},
        "sample": sample,
    }
    if draw:
        payload["draw"] = draw
    return json_sha256(payload)


class ResponseCache:
    """key -> JSON value; one connection per thread, WAL so readers never block writers."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._local = threading.local()
        self._init_lock = threading.Lock()
        self.hits = 0  # lookups answered from the file by this object
        self.stores = 0  # new responses written by this object (= model responses received)
        self._make_folder()
        # processes opening a new cache at once would otherwise read each other's half-made
        # file (sqlite: "database disk image is malformed"): one opens it at a time
        try:
            with self._init_lock, file_lock(f"{self.path}.lock", "the response cache's lock"):
                self._open_checked()
        except OSError as exc:  # the lock file beside it: read-only folder, full disk, ...
            raise self._failure("open", exc) from None

    def _make_folder(self) -> None:
        folder = self.path.parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            blocker = next((p for p in (folder, *folder.parents) if p.is_file()), None)
            if blocker is not None:
                raise UserError(
                    f"{blocker}: is a file, not a folder, so the response cache {self.path} cannot "
                    "be created there; point MEMLOOP_CACHE_DIR (or --cache) elsewhere"
                ) from None
            raise UserError(
                f"{folder}: cannot create the response cache's folder ({exc.strerror}); point "
                "MEMLOOP_CACHE_DIR (or --cache) elsewhere"
            ) from None

    def _open_checked(self) -> None:
        """Open (or create) the file; anything but a response cache is one line naming it."""
        if self.path.is_dir():
            raise UserError(
                f"{self.path}: is a folder; --cache takes a file, e.g. "
                f"{self.path / 'responses.sqlite'}"
            )
        refusal = (
            f"{self.path}: not a memloop response cache (sqlite): delete it or pass another --cache"
        )
        if sqlite_problem(self.path) is not None:
            raise UserError(refusal)
        try:
            conn = self._conn()
            conn.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
            )
            columns = {row[1] for row in conn.execute("PRAGMA table_info(responses)")}
        except sqlite3.OperationalError as exc:  # locked, unreadable, no space: not corruption
            self.close()
            raise self._failure("open", exc) from None
        except sqlite3.DatabaseError as exc:
            self.close()
            raise UserError(f"{refusal} ({exc})") from None
        if not {"key", "value", "created"} <= columns:
            self.close()
            raise UserError(refusal)

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(
                self.path, timeout=60.0, isolation_level=None, check_same_thread=False
            )
            try:
                conn.execute("PRAGMA busy_timeout=60000")
                conn.execute("PRAGMA journal_mode=WAL")
                conn.execute("PRAGMA synchronous=NORMAL")
            except BaseException:
                conn.close()
                raise
            self._local.conn = conn
        return conn

    def get(self, key: str) -> dict[str, Any] | None:
        try:
            row = self._conn().execute("SELECT value FROM responses WHERE key=?", (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._failure("read", exc) from None
        if row is None:
            return None
        with self._init_lock:
            self.hits += 1
        return json.loads(row[0])

    def put(self, key: str, value: dict[str, Any]) -> None:
        try:
            self._conn().execute(
                "INSERT OR REPLACE INTO responses(key, value, created) VALUES (?, ?, ?)",
                (key, json.dumps(value, ensure_ascii=False), time.time()),
            )
        except sqlite3.Error as exc:
            raise self._failure("write to", exc) from None
        with self._init_lock:
            self.stores += 1

    def __len__(self) -> int:
        try:
            return self._conn().execute("SELECT COUNT(*) FROM responses").fetchone()[0]
        except sqlite3.Error as exc:
            raise self._failure("read", exc) from None

    def _failure(self, doing: str, exc: sqlite3.Error | OSError) -> UserError:
        """One line naming this file: a full disk, an I/O error, a lock or a damaged file.

        sqlite reports a full disk, a read-only file or an I/O error as an OperationalError
        (whose message is all it tells), the lock file beside the cache as an OSError.
        """
        if isinstance(exc, OSError):
            reason = exc.strerror or str(exc)
            full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        else:
            reason = str(exc) or type(exc).__name__
            full = "full" in reason
        if full:
            hint = "free space, or pass another --cache (or MEMLOOP_CACHE_DIR)"
        elif "readonly" in reason or "read-only" in reason or "ermission" in reason:
            hint = "check its permissions, or pass another --cache (or MEMLOOP_CACHE_DIR)"
        elif "locked" in reason:
            hint = "another process holds it: wait, or pass another --cache"
        elif not isinstance(exc, (OSError, sqlite3.OperationalError)):  # malformed, not a db
            hint = "the file is damaged: delete it, or pass another --cache"
        else:
            hint = "pass another --cache (or MEMLOOP_CACHE_DIR)"
        return UserError(f"{self.path}: cannot {doing} the response cache ({reason}); {hint}")

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

"""SQLite result store: one row per finished bench cell, written atomically, keyed by config hash.

Tables
  cells(key TEXT PRIMARY KEY, config TEXT (JSON), metrics TEXT (JSON), created TEXT)
  rows(cell_key, prompt_index, repeat, prompt, reference, response, utility, tokens, stats JSON)

A cell and all its rows are written in one transaction, so an interrupted run
leaves either the whole cell or nothing. `has(key)` lets a re-run skip it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "results.sqlite"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS cells (
    key TEXT PRIMARY KEY,
    config TEXT NOT NULL,
    metrics TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS rows (
    cell_key TEXT NOT NULL REFERENCES cells(key) ON DELETE CASCADE,
    prompt_index INTEGER NOT NULL,
    repeat INTEGER NOT NULL,
    prompt TEXT NOT NULL,
    reference TEXT NOT NULL,
    response TEXT NOT NULL,
    utility REAL NOT NULL,
    tokens INTEGER NOT NULL,
    stats TEXT NOT NULL,
    PRIMARY KEY (cell_key, prompt_index, repeat)
);
"""


def cell_key(config: dict) -> str:
    """Stable hash of a cell's full configuration (which includes code and model versions)."""
    blob = json.dumps(config, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


@dataclass
class Cell:
    key: str
    config: dict
    metrics: dict
    created: str


@dataclass
class Row:
    prompt_index: int
    repeat: int
    prompt: str
    reference: str
    response: str
    utility: float
    tokens: int
    stats: dict


class Store:
    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / DB_NAME
        self.conn = sqlite3.connect(self.path)
        self.conn.execute("PRAGMA foreign_keys = ON")
        with self.conn:
            self.conn.executescript(_SCHEMA)

    @classmethod
    def open_existing(cls, out_dir: str | Path) -> "Store":
        if not (Path(out_dir) / DB_NAME).is_file():
            raise FileNotFoundError(f"no {DB_NAME} in {out_dir} (run `relaxspec bench --out {out_dir}` first)")
        return cls(out_dir)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def has(self, key: str) -> bool:
        return self.conn.execute("SELECT 1 FROM cells WHERE key = ?", (key,)).fetchone() is not None

    def put(self, key: str, config: dict, metrics: dict, rows: list[Row]) -> None:
        """Write a finished cell and its rows in ONE transaction (replacing an older copy)."""
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with self.conn:  # BEGIN ... COMMIT, or ROLLBACK on any exception
            self.conn.execute("DELETE FROM rows WHERE cell_key = ?", (key,))
            self.conn.execute("DELETE FROM cells WHERE key = ?", (key,))
            self.conn.execute("INSERT INTO cells (key, config, metrics, created) VALUES (?, ?, ?, ?)",
                              (key, json.dumps(config, sort_keys=True), json.dumps(metrics, sort_keys=True), created))
            self.conn.executemany(
                "INSERT INTO rows (cell_key, prompt_index, repeat, prompt, reference, response, utility, tokens, stats)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(key, r.prompt_index, r.repeat, r.prompt, r.reference, r.response, float(r.utility), int(r.tokens),
                  json.dumps(r.stats)) for r in rows])

    def get(self, key: str) -> Cell | None:
        found = self.conn.execute("SELECT key, config, metrics, created FROM cells WHERE key = ?", (key,)).fetchone()
        return _cell(found) if found else None

    def cells(self):
        """All finished cells, oldest first."""
        for found in self.conn.execute("SELECT key, config, metrics, created FROM cells ORDER BY created, rowid"):
            yield _cell(found)

    __iter__ = cells

    def __len__(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]

    def rows(self, key: str) -> list[Row]:
        cur = self.conn.execute(
            "SELECT prompt_index, repeat, prompt, reference, response, utility, tokens, stats FROM rows"
            " WHERE cell_key = ? ORDER BY repeat, prompt_index", (key,))
        return [Row(*r[:7], stats=json.loads(r[7])) for r in cur]

    def utilities(self, key: str) -> dict[tuple[int, int], float]:
        cur = self.conn.execute("SELECT prompt_index, repeat, utility FROM rows WHERE cell_key = ?", (key,))
        return {(i, r): u for i, r, u in cur}


def _cell(found) -> Cell:
    key, config, metrics, created = found
    return Cell(key=key, config=json.loads(config), metrics=json.loads(metrics), created=created)

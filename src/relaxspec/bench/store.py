"""SQLite result store: one row per finished bench cell, written atomically, keyed by config hash.

Tables
  cells(key TEXT PRIMARY KEY, config TEXT (JSON), metrics TEXT (JSON), created TEXT)
  rows(cell_key, prompt_index, repeat, prompt, reference, response, utility, tokens, stats JSON, token_hash)

A cell grows by looks: each look's rows and the cell's updated metrics are written in one
transaction, so an interrupted run loses at most the look in flight; `repeats_done(key)` tells a
re-run where to continue. `token_hash` identifies a sample's output token ids (to count outputs
identical to strict's).
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
    token_hash TEXT NOT NULL DEFAULT '',
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
    token_hash: str = ""


def token_hash(token_ids) -> str:
    return hashlib.sha256(",".join(str(int(t)) for t in token_ids).encode()).hexdigest()[:16]


class Store:
    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / DB_NAME
        if self.path.is_dir():
            raise ValueError(f"{self.path} is a directory, not a relaxspec results store")
        existed = self.path.is_file()
        self.conn = sqlite3.connect(self.path)
        try:
            if existed:
                found = self.conn.execute("PRAGMA integrity_check").fetchone()[0]
                if found != "ok":
                    raise sqlite3.DatabaseError(found)
                self._check_tables()
            self.conn.execute("PRAGMA foreign_keys = ON")
            with self.conn:
                self.conn.executescript(_SCHEMA)
                columns = {c[1] for c in self.conn.execute("PRAGMA table_info(rows)")}
                if "token_hash" not in columns:  # a store written before token hashes were kept
                    self.conn.execute("ALTER TABLE rows ADD COLUMN token_hash TEXT NOT NULL DEFAULT ''")
        except sqlite3.DatabaseError as e:
            self.conn.close()
            raise ValueError(f"results store {self.path} is corrupted ({e}); move it away and re-run the bench")\
                from None
        except ValueError:
            self.conn.close()
            raise

    def _check_tables(self) -> None:
        """ValueError unless an existing file holds this store's tables (or none yet): a foreign database is
        'not a relaxspec results store', a cells table without its rows (or the reverse) is a damaged store."""
        tables = {name: {c[1] for c in self.conn.execute(f"PRAGMA table_info({name})")}
                  for (name,) in self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not tables:
            return
        wanted = {"cells": {"key", "config", "metrics", "created"},
                  "rows": {"cell_key", "prompt_index", "repeat", "prompt", "reference", "response", "utility",
                           "tokens", "stats"}}
        ours = [name for name in wanted if name in tables and wanted[name] <= tables[name]]
        if not ours:
            raise ValueError(f"{self.path} is not a relaxspec results store (its tables: {', '.join(sorted(tables))})")
        for name in wanted:
            if name not in ours:
                what = "missing" if name not in tables else \
                    f"without column {', '.join(sorted(wanted[name] - tables[name]))}"
                raise ValueError(f"results store {self.path} damaged: its {name} table is {what}")

    def check_consistent(self) -> None:
        """ValueError 'results store damaged: ...' when a cell's stored rows are not the samples its metrics count
        (looks write both in one transaction, so they always agree unless the file was edited)."""
        counts = dict(self.conn.execute("SELECT cell_key, COUNT(*) FROM rows GROUP BY cell_key"))
        for cell in self.cells():
            expected = cell.metrics.get("n_samples")
            if expected is not None and counts.get(cell.key, 0) != expected:
                raise ValueError(f"results store {self.path} damaged: cell {cell.key} ({_label(cell.config)}) has "
                                 f"{counts.get(cell.key, 0)} stored samples, its metrics count {expected}")

    @classmethod
    def open_existing(cls, out_dir: str | Path) -> "Store":
        if Path(out_dir).is_file():
            hint = f"; give its directory: {Path(out_dir).parent}" if Path(out_dir).name == DB_NAME else ""
            raise ValueError(f"{out_dir} is a file, not a bench directory{hint}")
        if not (Path(out_dir) / DB_NAME).exists():
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
        """Add rows to a cell (a new one, or one look more) and set its config and metrics, in ONE
        transaction. A (prompt_index, repeat) already stored for the cell is an error."""
        created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with self.conn:  # BEGIN ... COMMIT, or ROLLBACK on any exception
            if self.has(key):
                self.conn.execute("UPDATE cells SET config = ?, metrics = ?, created = ? WHERE key = ?",
                                  (json.dumps(config, sort_keys=True), json.dumps(metrics, sort_keys=True), created,
                                   key))
            else:
                self.conn.execute("INSERT INTO cells (key, config, metrics, created) VALUES (?, ?, ?, ?)",
                                  (key, json.dumps(config, sort_keys=True), json.dumps(metrics, sort_keys=True),
                                   created))
            self.conn.executemany(
                "INSERT INTO rows (cell_key, prompt_index, repeat, prompt, reference, response, utility, tokens, stats,"
                " token_hash) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(key, r.prompt_index, r.repeat, r.prompt, r.reference, r.response, float(r.utility), int(r.tokens),
                  json.dumps(r.stats), r.token_hash) for r in rows])

    def repeats_done(self, key: str) -> int:
        """Repeats stored for the cell (looks store whole repeats of every prompt): max repeat + 1, or 0."""
        found = self.conn.execute("SELECT MAX(repeat) FROM rows WHERE cell_key = ?", (key,)).fetchone()[0]
        return 0 if found is None else found + 1

    def get(self, key: str) -> Cell | None:
        found = self.conn.execute("SELECT key, config, metrics, created FROM cells WHERE key = ?", (key,)).fetchone()
        return _cell(found, self.path) if found else None

    def cells(self):
        """All finished cells, oldest first."""
        for found in self.conn.execute("SELECT key, config, metrics, created FROM cells ORDER BY created, rowid"):
            yield _cell(found, self.path)

    __iter__ = cells

    def __len__(self) -> int:
        return self.conn.execute("SELECT COUNT(*) FROM cells").fetchone()[0]

    def rows(self, key: str) -> list[Row]:
        cur = self.conn.execute(
            "SELECT prompt_index, repeat, prompt, reference, response, utility, tokens, stats, token_hash FROM rows"
            " WHERE cell_key = ? ORDER BY repeat, prompt_index", (key,))
        return [Row(*r[:7], stats=_json(r[7], f"the stats of sample ({r[0]}, {r[1]})", key, self.path),
                    token_hash=r[8]) for r in cur]

    def utilities(self, key: str) -> dict[tuple[int, int], float]:
        cur = self.conn.execute("SELECT prompt_index, repeat, utility FROM rows WHERE cell_key = ?", (key,))
        return {(i, r): u for i, r, u in cur}

    def token_hashes(self, key: str) -> dict[tuple[int, int], str]:
        cur = self.conn.execute("SELECT prompt_index, repeat, token_hash FROM rows WHERE cell_key = ?", (key,))
        return {(i, r): h for i, r, h in cur}


def _cell(found, path) -> Cell:
    key, config, metrics, created = found
    return Cell(key=key, config=_json(config, "its config", key, path), metrics=_json(metrics, "its metrics", key, path),
                created=created)


def _json(text, what: str, key: str, path) -> dict:
    """A stored JSON object, or ValueError 'results store damaged: <what> is not a JSON object, cell <key>'."""
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        value = None
    if not isinstance(value, dict):
        raise ValueError(f"results store {path} damaged: {what} is not a JSON object, cell {key}")
    return value


def _label(config: dict) -> str:
    """A short name of a stored cell for messages: its method, N and task."""
    return f"{config.get('method', '?')} N={config.get('draft_length', '?')} {config.get('task', '?')}"

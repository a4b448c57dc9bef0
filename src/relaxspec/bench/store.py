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
import os
import sqlite3
import stat
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "results.sqlite"
BUSY_TIMEOUT_S = 5.0  # how long opening or reading waits for another run's write (one look's commit) to end
# what every stored cell's config holds (bench.cell.cell_config) and what report reads of it
CONFIG_FIELDS = ("verifier", "drafter", "task", "method", "params", "draft_length", "seed", "temperature", "top_k",
                 "top_p", "max_new_tokens", "code_version")

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
        existed = self.path.exists()
        if existed:
            _check_readable(self.path)
        self.conn = None
        try:
            self.conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
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
            self._close_quietly()
            raise ValueError(_open_error(self.path, e)) from None
        except ValueError:
            self._close_quietly()
            raise

    def _close_quietly(self) -> None:
        if self.conn is not None:
            self.conn.close()

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
        """ValueError 'results store damaged: ...' when a cell's config lacks one of CONFIG_FIELDS, its metrics lack
        n_samples, its stored rows are not the samples its metrics count (looks write both in one transaction, so
        they always agree unless the file was edited) or a stored utility is not a number."""
        counts = dict(self.conn.execute("SELECT cell_key, COUNT(*) FROM rows GROUP BY cell_key"))
        for cell in self.cells():
            where = f"cell {cell.key} ({_label(cell.config)})"
            missing = [name for name in CONFIG_FIELDS if name not in cell.config]
            if missing:
                raise self._damaged(f"{where}: its config lacks {', '.join(missing)}")
            expected = cell.metrics.get("n_samples")
            if not isinstance(expected, int):
                raise self._damaged(f"{where}: its metrics " + ("are empty" if not cell.metrics else
                                                                f"have n_samples {expected!r}, not a count"))
            if counts.get(cell.key, 0) != expected:
                raise self._damaged(f"{where} has {counts.get(cell.key, 0)} stored samples, its metrics count "
                                    f"{expected}")
        bad = self.conn.execute("SELECT cell_key, prompt_index, repeat, utility FROM rows"
                                " WHERE typeof(utility) NOT IN ('integer', 'real') LIMIT 1").fetchone()
        if bad:
            key, prompt_index, repeat, utility = bad
            cell = self.get(key)
            raise self._damaged(f"cell {key} ({_label(cell.config if cell else {})}): the utility of sample "
                                f"({prompt_index}, {repeat}) is {utility!r}, not a number")

    def _damaged(self, what: str) -> ValueError:
        return ValueError(f"results store {self.path} damaged: {what}")

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


def _check_readable(path: Path) -> None:
    """ValueError unless an existing results store is a regular file this user can read (SQLite would say only
    'disk I/O error' or 'unable to open database file')."""
    mode = path.stat().st_mode
    if not stat.S_ISREG(mode):
        kind = next((name for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                                             (stat.S_ISSOCK, "a socket")) if test(mode)), "a device")
        raise ValueError(f"{path} is {kind}, not a relaxspec results store (a SQLite file): move it away or give "
                         "another directory")
    if not os.access(path, os.R_OK):  # not open() and close(): closing a file drops this process's SQLite locks on it
        raise ValueError(f"cannot read the results store {path}: permission denied (run as its owner, or give "
                         "another directory)")


def _open_error(path: Path, error: sqlite3.DatabaseError) -> str:
    """The one line for an error of SQLite while opening and checking a store: busy (another process is writing
    it), not usable (an operational error: I/O, permissions) or corrupted."""
    if "locked" in str(error) or "busy" in str(error):
        holders = _lock_holders(path)
        who = ", ".join(holders) if holders else "another run"
        return f"results store {path} is busy: {who} is writing it; try again when that run ends"
    if isinstance(error, sqlite3.OperationalError):
        return f"cannot use the results store {path}: {error}"
    return f"results store {path} is corrupted ({error}); move it away and re-run the bench"


def _lock_holders(path: Path) -> list[str]:
    """'process PID (its command line)' of each process holding a lock on the file (Linux's /proc/locks; [] where
    that is not readable)."""
    try:
        found = path.stat()
        locks = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return []
    inode = f"{os.major(found.st_dev):02x}:{os.minor(found.st_dev):02x}:{found.st_ino}"
    pids = dict.fromkeys(fields[4] for fields in map(str.split, locks) if len(fields) > 5 and fields[5] == inode)
    return [f"process {pid} ({_command(pid)})" for pid in pids]


def _command(pid: str) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(w.decode(errors="replace") for w in words if w)[:100]


def _label(config: dict) -> str:
    """A short name of a stored cell for messages: its method, N and task."""
    return f"{config.get('method', '?')} N={config.get('draft_length', '?')} {config.get('task', '?')}"

"""Checks of the settings the bench and tune share, made before any work (any model loads), and the TOML files
settings are read from.

The `phase` setting relaxes only inside a span of each response (relaxspec.engine.phase): None relaxes everywhere;
"think" or "BEGIN..END" as `generate` takes them; "task" is each task's own span (`relaxspec.tasks.relax_span`:
the worked steps before the final answer, for the built-in tasks), resolved per cell, so a cell's key and report
say which markers it ran with.
"""

from __future__ import annotations

from pathlib import Path

from relaxspec.engine.phase import TASK, Phase, parse_phase

# what the layers above use (relaxspec.bench.settings)
__all__ = ["check_settings_types", "check_out_dir", "check_sampling_setting", "check_draft_confidence_setting",
           "check_phase_setting", "phase_for", "load_toml"]


def check_phase_setting(value, tasks) -> None:
    """ValueError naming the setting unless it is None, "task" (every one of `tasks` offering a span) or a phase
    spec generate accepts; checked before any model loads."""
    if value is None:
        return
    if value == TASK:
        from relaxspec.tasks import relax_span
        for task in tasks:
            relax_span(task)
        return
    if not isinstance(value, str):
        raise ValueError(f"bench: phase must be a string ('task', 'think' or 'BEGIN..END'), got {value!r}")
    parse_phase(value)


def phase_for(value, task: str) -> str | None:
    """The phase spec a cell of `task` runs with (its markers, for "task")."""
    if value != TASK:
        return value
    from relaxspec.tasks import relax_span
    return str(Phase(*relax_span(task)))


def phase_options(value, task: str) -> dict:
    """generate's and a cell config's `phase` entry: empty when the bench relaxes everywhere (so the keys of
    cells run without a phase are what they always were)."""
    return {} if value is None else {"phase": phase_for(value, task)}


def check_sampling_setting(config, who: str) -> None:
    """ValueError '<who>: temperature must be a finite number >= 0, got nan' (and top_k's, top_p's) before any
    work, rather than when the first cell samples."""
    from relaxspec.acceptance.processing import check_sampling_args
    try:
        check_sampling_args(config.temperature, config.top_k, config.top_p)
    except ValueError as e:
        raise ValueError(f"{who}: {e}") from None


def check_settings_types(config, who: str, lists: dict, scalars: dict | None = None) -> None:
    """ValueError '<who>: <name> must be a list of <kind>' for a list setting (None allowed) of the wrong kind
    (e.g. `methods = 3` in a TOML file), and '<who>: <name> must be <kind>' for a scalar one."""
    def kind_ok(value, kind) -> bool:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool):
            return bool in kinds
        return isinstance(value, tuple(k for k in kinds if k is not float)) or (
            float in kinds and isinstance(value, (int, float)))

    def kind_name(kind, plural: bool) -> str:
        names = {str: ("a string", "strings"), int: ("an integer", "integers"), float: ("a number", "numbers")}
        return " or ".join(names[k][plural] for k in (kind if isinstance(kind, tuple) else (kind,)))

    for name, kind in lists.items():
        value = getattr(config, name)
        if value is not None and (not isinstance(value, (list, tuple)) or not all(kind_ok(v, kind) for v in value)):
            raise ValueError(f"{who}: {name.replace('_', ' ')} must be a list of {kind_name(kind, True)}, got {value!r}")
    for name, kind in (scalars or {}).items():
        value = getattr(config, name)
        if value is not None and not kind_ok(value, kind):
            raise ValueError(f"{who}: {name.replace('_', ' ')} must be {kind_name(kind, False)}, got {value!r}")


def check_draft_confidence_setting(value, who: str) -> None:
    """ValueError '<who>: draft_confidence must be ...' unless value is None or a threshold the engine takes."""
    if value is not None:
        from relaxspec.engine.generate import check_draft_confidence
        try:
            check_draft_confidence(value)
        except ValueError as e:
            raise ValueError(f"{who}: {e}") from None


def check_out_dir(out, flag: str) -> None:
    """ValueError unless `out` is a directory or can be created as one (no file in its way), and this user can
    write it and its results store: checked before any work, not when the first cell is stored."""
    import os
    from relaxspec.bench.store import DB_NAME
    for path in [Path(out), *Path(out).parents]:
        if path.exists():
            if not path.is_dir():
                raise ValueError(f"{flag} {out}: {path} is a file, not a directory")
            if not os.access(path, os.W_OK | os.X_OK):
                raise ValueError(f"{flag} {out}: {path} is not writable")
            store = Path(out) / DB_NAME
            if store.is_dir():
                raise ValueError(f"{flag} {out}: {store} is a directory, not a relaxspec results store")
            if store.exists() and not os.access(store, os.R_OK | os.W_OK):
                raise ValueError(f"{flag} {out}: the results store {store} is not writable")
            return


def load_toml(path: str | Path, what: str = "bench config") -> dict:
    import tomllib
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ValueError(f"{what} {str(path)!r} does not exist") from None
    except IsADirectoryError:
        raise ValueError(f"{what} {str(path)!r} is a directory, not a TOML file") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{what} {path}: invalid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{what} {path}: not UTF-8 text (byte {e.start}), as TOML must be") from None

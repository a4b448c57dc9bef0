import sqlite3

import pytest
import torch
from helpers import as_ordinary_user

from relaxspec.bench.config import BenchConfig
from relaxspec.bench.runner import run_grid
from relaxspec.bench.store import Row, Store

torch.set_num_threads(1)


def small_config(out, **kw):
    base = dict(verifiers=["verifier"], drafters=["drafter-weak"], tasks=["arithmetic"],
                methods=["ar", "strict", "cactus:delta=1/10", "typical"], draft_lengths=[2], limit=3, repeats=2,
                max_new_tokens=10, looks=1, speed_prompts=1, workers=1, out=str(out))
    base.update(kw)
    return BenchConfig(**base)


def row(i, utility=1.0, repeat=0):
    return Row(prompt_index=i, repeat=repeat, prompt=f"p{i}", reference="1", response="r", utility=utility, tokens=3,
               stats={}, token_hash=f"h{i}")


def test_put_is_atomic_and_has(tmp_path):
    with Store(tmp_path) as store:
        store.put("k1", {"method": "ar"}, {"utility": 1.0}, [row(0), row(1)])
        assert store.has("k1") and not store.has("k2")
        with pytest.raises(TypeError):  # the second row is broken: nothing of the cell may remain
            store.put("k2", {"method": "strict"}, {"utility": 0.5}, [row(0), row(1, utility=None)])
        assert not store.has("k2")
        assert len(store) == 1 and [c.key for c in store] == ["k1"]
        assert store.utilities("k1") == {(0, 0): 1.0, (1, 0): 1.0}
    conn = sqlite3.connect(tmp_path / "results.sqlite")
    assert conn.execute("SELECT COUNT(*) FROM rows WHERE cell_key = 'k2'").fetchone()[0] == 0


def test_a_cell_grows_by_looks(tmp_path):
    with Store(tmp_path) as store:
        assert store.repeats_done("k") == 0
        store.put("k", {"method": "strict"}, {"n_samples": 2}, [row(0), row(1)])
        store.put("k", {"method": "strict"}, {"n_samples": 4}, [row(0, 0.0, repeat=1), row(1, repeat=1)])
        assert store.repeats_done("k") == 2 and store.get("k").metrics == {"n_samples": 4}
        assert store.utilities("k") == {(0, 0): 1.0, (1, 0): 1.0, (0, 1): 0.0, (1, 1): 1.0}
        assert store.token_hashes("k")[(1, 1)] == "h1" and store.rows("k")[2].token_hash == "h0"
        with pytest.raises(sqlite3.IntegrityError):  # a sample stored twice is a bug, and the look is not kept
            store.put("k", {"method": "strict"}, {"n_samples": 6}, [row(2, repeat=2), row(0, repeat=1)])
        assert store.repeats_done("k") == 2 and store.get("k").metrics == {"n_samples": 4}


def test_corrupted_store_is_one_clear_error(tmp_path):
    (tmp_path / "results.sqlite").write_bytes(b"SQLite format 3\x00" + b"\x13" * 4000)
    with pytest.raises(ValueError, match="is corrupted"):
        Store.open_existing(tmp_path)
    (tmp_path / "results.sqlite").write_bytes(b"not a database at all" * 100)
    with pytest.raises(ValueError, match="is corrupted"):
        Store(tmp_path)


def test_store_without_token_hashes_is_upgraded(tmp_path):
    conn = sqlite3.connect(tmp_path / "results.sqlite")
    conn.executescript("CREATE TABLE cells (key TEXT PRIMARY KEY, config TEXT NOT NULL, metrics TEXT NOT NULL, "
                       "created TEXT NOT NULL); CREATE TABLE rows (cell_key TEXT NOT NULL, prompt_index INTEGER "
                       "NOT NULL, repeat INTEGER NOT NULL, prompt TEXT NOT NULL, reference TEXT NOT NULL, response "
                       "TEXT NOT NULL, utility REAL NOT NULL, tokens INTEGER NOT NULL, stats TEXT NOT NULL, "
                       "PRIMARY KEY (cell_key, prompt_index, repeat));"
                       "INSERT INTO cells VALUES ('old', '{}', '{}', '2026');"
                       "INSERT INTO rows VALUES ('old', 0, 0, 'p', '1', 'r', 1.0, 3, '{}');")
    conn.commit()
    conn.close()
    with Store(tmp_path) as store:
        assert store.token_hashes("old") == {(0, 0): ""}


def test_interrupted_grid_resumes_with_only_the_rest(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-resume")  # concurrent source edits must not change keys
    config = small_config(tmp_path)
    done = []

    def stop_after_two(index, spec, key, metrics):
        done.append(key)
        if len(done) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_grid(config, on_cell=stop_after_two, progress=False, log=lambda *a: None)
    with Store(tmp_path) as store:
        assert {c.key for c in store} == set(done)

    second = run_grid(small_config(tmp_path), progress=False, log=lambda *a: None)
    assert sorted(second.skipped) == sorted(done)
    assert len(second.ran) == 3 and not set(second.ran) & set(done)
    with Store(tmp_path) as store:
        cells = list(store)
        assert len(cells) == 5
        methods = sorted(c.config["method"] for c in cells)
        assert methods == ["ar", "cactus", "cactus", "strict", "typical"]
        for c in cells:
            assert len(store.rows(c.key)) == 6  # 3 prompts x 2 repeats
            assert c.metrics["n_samples"] == 6 and 0.0 <= c.metrics["utility"] <= 1.0
            if c.config["method"] != "ar":
                assert c.metrics["c_rel_measured"] > 0
                assert len(c.metrics["acceptance_rate_per_position"]) == 2

    with monkeypatch.context() as patch:  # every cell stored: no model loads, no speed constants are measured
        patch.setattr("relaxspec.models.load_model", lambda *a, **k: pytest.fail("a model was loaded"))
        third = run_grid(small_config(tmp_path), progress=False, log=lambda *a: None)
    assert third.ran == [] and len(third.skipped) == 5 and "speed constants" not in third.phases
    # a changed setting is a different cell
    fourth = run_grid(small_config(tmp_path, methods=["ar"], max_new_tokens=8), progress=False, log=lambda *a: None)
    assert len(fourth.ran) == 1


def test_code_version_enters_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "v1")
    first = run_grid(small_config(tmp_path, methods=["ar"], limit=1, repeats=1), progress=False, log=lambda *a: None)
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "v2")
    second = run_grid(small_config(tmp_path, methods=["ar"], limit=1, repeats=1), progress=False, log=lambda *a: None)
    assert len(first.ran) == len(second.ran) == 1 and first.ran != second.ran


def test_pad_cells_are_skipped_with_a_warning_without_a_classifier(tmp_path, monkeypatch):
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-pad")
    config = small_config(tmp_path, methods=["ar", "pad"], limit=1, repeats=1,
                          pad_classifier=str(tmp_path / "missing.pt"))
    with pytest.warns(UserWarning, match="skipping 3 pad cells"):
        summary = run_grid(config, progress=False, log=lambda *a: None)
    assert len(summary.ran) == 1 and len(summary.unavailable) == 3
    assert all("pad(threshold=" in label for label in summary.unavailable)


def test_pad_cells_run_with_the_shipped_classifier(tmp_path, monkeypatch):
    import relaxspec.pivot as pivot

    path = pivot.builtin_classifier_path()  # shipped with the package (pyproject's package-data): never skipped
    monkeypatch.setenv("RELAXSPEC_CODE_VERSION", "test-pad-run")
    config = small_config(tmp_path, methods=["ar", "pad:threshold=0.5"], limit=2, repeats=1)
    summary = run_grid(config, progress=False, log=lambda *a: None)
    assert len(summary.ran) == 2 and not summary.unavailable
    with Store(tmp_path) as store:
        pad = next(c for c in store if c.config["method"] == "pad")
        assert pad.config["params"] == {"threshold": 0.5} and pad.config["pad_classifier"]
        assert pad.metrics["n_samples"] == 2 and path.exists()


def test_a_classifier_shipped_for_another_pair_is_found_by_the_pair_names(tmp_path, monkeypatch):
    import relaxspec.pivot as pivot
    from relaxspec.bench.cell import CellSpec, pad_classifier
    from relaxspec.bench.workbench import Workbench

    shipped = tmp_path / "shipped"
    builtin = pivot.load_classifier(pivot.builtin_classifier_path())
    builtin.save(shipped / "a-builtin.pt")
    other = pivot.load_classifier(pivot.builtin_classifier_path())
    other.spec = {**other.spec, "drafter": "drafter-strong"}
    other.save(shipped / "b-other.pt")
    monkeypatch.setattr(pivot, "BUILTIN_DIR", shipped)
    for drafter, found in (("drafter-strong", "b-other.pt"), ("drafter-weak", "a-builtin.pt")):
        config = small_config(tmp_path, drafters=[drafter], methods=["pad:threshold=0.5"])
        pivot_fn, version, spec = pad_classifier(config)
        assert pivot_fn is not None and spec["drafter"] == drafter, drafter
        assert pivot.shipped_for_names([("verifier", drafter)]) == shipped / found
        cells = [CellSpec("verifier", drafter, "arithmetic", "pad", {"threshold": 0.5}, 1, 0)]
        assert Workbench(config).runnable(cells)[0] == cells  # not skipped as another pair's
    assert pivot.shipped_for_names([("verifier", "drafter-mtp")]) is None


def test_code_version_covers_the_whole_sample_path(tmp_path, monkeypatch):
    """A copy of the package: editing a scorer, the runner's seeding or a task's template changes the code
    version (so stored cells are not reused); editing the report does not."""
    import inspect
    import shutil
    from pathlib import Path

    import relaxspec
    from relaxspec.bench import cell
    from relaxspec.bench.versions import code_version
    from relaxspec.tasks import arithmetic
    monkeypatch.delenv("RELAXSPEC_CODE_VERSION", raising=False)
    src = Path(relaxspec.__file__).parent
    root = tmp_path / "relaxspec"
    shutil.copytree(src, root, ignore=shutil.ignore_patterns("__pycache__", "builtin"))
    base = code_version(root)
    assert base == code_version(src)  # built-in weights are not in it (hashed per model)

    def edited(rel: str, old: str, new: str) -> str:
        path = root / rel
        text = path.read_text()
        assert old in text, (rel, old)
        path.write_text(text.replace(old, new, 1))
        try:
            return code_version(root)
        finally:
            path.write_text(text)

    scorer = Path(inspect.getsourcefile(arithmetic)).relative_to(src).as_posix()
    seeding = Path(inspect.getsourcefile(cell.run_samples)).relative_to(src).as_posix()
    assert edited(scorer, "def ", "def  ") != base
    assert edited(seeding, "derive_seed(spec.seed, i, r)", "derive_seed(spec.seed, r, i)") != base
    assert edited("bench/report.py", "def ", "def  ") == base  # presentation only
    (root / "tasks" / "template.txt").write_text("{question}")  # a data file next to the tasks counts too
    assert code_version(root) != base


def test_a_store_another_process_is_writing_is_busy_not_corrupted(tmp_path, monkeypatch):
    import os

    from relaxspec.bench import store as store_module
    Store(tmp_path).close()
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_S", 0.1)
    writer = sqlite3.connect(tmp_path / "results.sqlite")
    writer.execute("BEGIN EXCLUSIVE")  # what a run holds while it commits a look
    try:
        with pytest.raises(ValueError) as found:
            Store(tmp_path)
    finally:
        writer.close()
    message = str(found.value)
    assert message.startswith(f"results store {tmp_path / 'results.sqlite'} is busy: process {os.getpid()} (")
    assert message.endswith("is writing it; try again when that run ends") and "corrupted" not in message
    Store(tmp_path).close()  # free again once the writer ends


def test_a_store_that_is_a_fifo_is_one_line(tmp_path, capsys):
    import os

    from relaxspec.cli import main
    os.mkfifo(tmp_path / "results.sqlite")
    assert main(["report", str(tmp_path), "--no-plots"]) == 2  # sqlite3.OperationalError: disk I/O error before
    assert capsys.readouterr().err == (f"relaxspec: error: {tmp_path / 'results.sqlite'} is a FIFO (named pipe), not "
                                       "a relaxspec results store (a SQLite file): move it away or give another "
                                       "directory\n")


def test_a_store_this_user_cannot_read_is_one_line():
    """As an ordinary user (root, which reads anything, runs the command without its capabilities): report on a
    results.sqlite nobody may read."""
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path
    base = Path(tempfile.mkdtemp(prefix="relaxspec-unreadable-"))
    try:
        base.chmod(0o755)
        Store(base).close()
        as_user = as_ordinary_user()
        (base / "results.sqlite").chmod(0)
        done = subprocess.run([*as_user, str(Path(sys.executable).with_name("relaxspec")), "report", str(base)],
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and done.stderr == (  # sqlite3.OperationalError: unable to open database file
            f"relaxspec: error: cannot read the results store {base / 'results.sqlite'}: permission denied (run as "
            "its owner, or give another directory)\n"), done.stderr
    finally:
        shutil.rmtree(base)

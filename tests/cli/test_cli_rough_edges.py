"""The command line's rough edges: repeated grid values, values checked before any work, damaged or unwritable
result stores, signals, silent settings and small things (each a one-line message or the documented behaviour)."""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaxspec.cli import main
from helpers import as_ordinary_user, one_line_error, usage_error

RELAXSPEC = str(Path(sys.executable).with_name("relaxspec"))
TINY = ["--limit", "2", "--max-new-tokens", "4", "--speed-prompts", "0", "--workers", "1", "--looks", "1",
        "--no-plots", "--no-progress"]
PROMPT = "Compute 12 + 7."


def cli(*args, env=None, timeout=120):
    """The installed `relaxspec` in a real subprocess: (exit code, stdout, stderr)."""
    done = subprocess.run([RELAXSPEC, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    return done.returncode, done.stdout, done.stderr


# ------------------------------------------------------------------ repeated grid values


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    """A real bench run with every grid value repeated (a UNIQUE constraint crash after the first cell before):
    (its output directory, exit code, stdout, stderr)."""
    out = tmp_path_factory.mktemp("small") / "b"
    code, stdout, stderr = cli("bench", *TINY, "--methods", "ar,strict,strict", "--draft-lengths", "3,3,auto,auto",
                               "--seed", "1,1", "--tasks", "arithmetic,arithmetic", "--drafter",
                               "drafter-weak,drafter-weak", "--out", out)
    return out, code, stdout, stderr


def test_a_repeated_grid_value_runs_its_cell_once(small_run):
    out, code, stdout, stderr = small_run
    assert code == 0, stderr
    assert "bench: 3 cells" in stdout and "ran 3 cells" in stdout, stdout  # ar, strict N=3, strict N=auto
    with sqlite3.connect(out / "results.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM cells").fetchone()[0] == 3


# ------------------------------------------------------------------ values checked before any work


def test_threads_and_counts_are_checked(capsys, tmp_path):
    for threads in ("-1", "0"):
        one_line_error(capsys, "bench", *TINY, "--threads", threads, "--out", tmp_path / "b",
                       says="--threads must be a positive integer")
    one_line_error(capsys, "tune", "--threads", "0", "--out", tmp_path / "t", says="--threads must be a positive")
    one_line_error(capsys, "models", "list", "--n", "0", says="--n must be > 0")
    for value in ("inf", "0", "nan"):
        usage_error(capsys, "tune", "--c-block", value, says="expected a finite number > 0 or 'measured'")


def test_config_files_of_the_wrong_kind(capsys, tmp_path):
    bench_toml = tmp_path / "bench.toml"
    bench_toml.write_text("methods = 3\n")
    one_line_error(capsys, "bench", "--config", bench_toml, "--out", tmp_path / "b",
                   says="bench: methods must be a list of strings, got [3]")
    gen_toml = tmp_path / "gen.toml"
    gen_toml.write_text("verifier = 7\n")
    one_line_error(capsys, "generate", "--config", gen_toml, "--prompt", PROMPT,
                   says=["gen.toml", "'verifier' must be a string, got 7"])
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes("system = \"caf\xe9\"\n".encode("latin-1"))
    one_line_error(capsys, "bench", "--config", latin1, "--out", tmp_path / "b", says=[str(latin1), "not UTF-8"])
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--method", "topk-delta", "--param", "topk=true",
                   says="parameter 'topk' must be an integer in [0, inf), got True")


def test_an_out_that_is_a_file(capsys, tmp_path):
    (tmp_path / "file").write_text("")
    one_line_error(capsys, "tune", "--out", tmp_path / "file", says="is a file, not a directory")


def test_dtype_messages(capsys, monkeypatch):
    from relaxspec.models.device import resolve_format
    cpu = torch.device("cpu")
    monkeypatch.setenv("RELAXSPEC_DTYPE", "float8")
    with pytest.raises(ValueError, match=r"unknown dtype 'float8' \(from \$RELAXSPEC_DTYPE\); use one of float32, "
                                         "bfloat16, float16, int4, auto"):
        resolve_format(None, cpu)
    monkeypatch.delenv("RELAXSPEC_DTYPE")
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--dtype", "float16", "--device", "cpu",
                   says="--dtype float16 runs on a GPU only; on a CPU use float32, bfloat16, int4 or auto")


def test_tune_takes_device_and_dtype(capsys, tmp_path):
    one_line_error(capsys, "tune", "--dtype", "int4", "--device", "meta", "--out", tmp_path / "t",
                   says="--dtype int4 runs on a CPU only (device 'meta')")


# ------------------------------------------------------------------ damaged or unwritable stores


def damaged_copy(small_run, tmp_path, *statements) -> Path:
    """A copy of the small run's directory with SQL `statements` run on its store."""
    import shutil
    out = tmp_path / "copy"
    shutil.copytree(small_run[0], out)
    with sqlite3.connect(out / "results.sqlite") as db:
        for statement in statements:
            db.execute(statement)
    db.close()
    return out


@pytest.mark.parametrize("statements, says", [
    (["UPDATE cells SET metrics = '{' WHERE rowid = 1"], "damaged: its metrics is not a JSON object, cell "),
    (["UPDATE cells SET config = '[1]' WHERE rowid = 2"], "damaged: its config is not a JSON object, cell "),
    (["DELETE FROM rows WHERE rowid = 1"], ["damaged: cell ", "has 1 stored samples, its metrics count 2"]),
    (["DROP TABLE rows"], "damaged: its rows table is missing"),
    (["DROP TABLE rows", "DROP TABLE cells", "CREATE TABLE runs (name TEXT)"],
     "is not a relaxspec results store (its tables: runs)"),
])
def test_a_damaged_store_is_named_by_report_and_bench(capsys, small_run, tmp_path, statements, says):
    out = damaged_copy(small_run, tmp_path, *statements)
    one_line_error(capsys, "report", out, "--no-plots", says=says)
    one_line_error(capsys, "bench", *TINY, "--methods", "ar,strict", "--draft-lengths", "3,auto", "--seed", "1",
                   "--drafter", "drafter-weak", "--out", out, says=says)


def test_a_store_that_is_a_directory(capsys, tmp_path):
    (tmp_path / "b" / "results.sqlite").mkdir(parents=True)
    one_line_error(capsys, "report", tmp_path / "b", says="results.sqlite is a directory, not a relaxspec results store")
    one_line_error(capsys, "bench", *TINY, "--out", tmp_path / "b",
                   says="results.sqlite is a directory, not a relaxspec results store")


def test_an_unwritable_out_or_store_is_refused_before_any_work(small_run):
    """As an ordinary user (root, which writes anything, runs the commands without its capabilities): a read-only
    --out, and a read-only results.sqlite."""
    import shutil
    import stat
    import tempfile
    base = Path(tempfile.mkdtemp(prefix="relaxspec-ro-"))
    try:
        base.chmod(0o755)
        read_only = base / "ro"
        read_only.mkdir(mode=0o755)
        store_dir = base / "store"
        shutil.copytree(small_run[0], store_dir)
        store_dir.chmod(0o777)
        (store_dir / "results.sqlite").chmod(0o444)
        read_only.chmod(stat.S_IRUSR | stat.S_IXUSR)
        as_user = as_ordinary_user()
        for out, says in ((read_only / "new", f"--out {read_only / 'new'}: {read_only} is not writable"),
                          (store_dir, f"the results store {store_dir / 'results.sqlite'} is not writable")):
            done = subprocess.run([*as_user, RELAXSPEC, "bench", *TINY, "--out", str(out)], capture_output=True,
                                  text=True, timeout=120)
            assert done.returncode == 2 and done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    finally:
        shutil.rmtree(base)


# ------------------------------------------------------------------ signals and pipes


def test_sigterm_ends_a_bench_and_its_workers_quietly(tmp_path):
    """SIGTERM to bench's main process while --workers 2 run a look: the workers are ended, no traceback from
    them (BrokenPipeError), no leaked semaphores; exit 143, what is stored kept."""
    import signal
    import time
    # a look of ~40 s on 2 cores (25 cells of 64 problems; the first done after ~9 s, the workers' start included):
    # the signal lands mid-look however fast the machine, once the first cell has finished (the workers are running)
    bench = subprocess.Popen([RELAXSPEC, "bench", "--limit", "64", "--max-new-tokens", "96", "--speed-prompts", "0",
                              "--workers", "2", "--looks", "1", "--no-plots", "--methods",
                              "ar,strict,cactus,mentored,ensemble", "--draft-lengths", "3,5", "--out", str(tmp_path / "b")],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err = ""
    while " 1/25 " not in err and bench.poll() is None:  # the progress bar: one cell done, the others running
        err += bench.stderr.read(1)
    time.sleep(1)
    bench.send_signal(signal.SIGTERM)
    _, rest = bench.communicate(timeout=120)
    err += rest
    assert bench.returncode == 143, err
    assert "bench: interrupted; finished cells are stored in" in err, err
    for noise in ("Traceback", "BrokenPipe", "leaked semaphore"):
        assert noise not in err, err


def test_ctrl_c_in_generate_is_one_line(tmp_path):
    import signal
    import time
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Compute {i} + 7."}) + "\n" for i in range(400)))
    generate = subprocess.Popen([RELAXSPEC, "generate", "--prompts", str(prompts), "--max-new-tokens", "200",
                                 "--temperature", "0.7"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(6)
    generate.send_signal(signal.SIGINT)
    _, err = generate.communicate(timeout=60)
    assert generate.returncode == 130 and err.strip() == "relaxspec: interrupted", err


def test_generate_into_a_closed_pipe_says_nothing():
    generate = subprocess.Popen([RELAXSPEC, "generate", "--json", "--prompt", PROMPT, "--max-new-tokens", "4"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    generate.stdout.close()  # as `| head -c 600` after its bytes
    err = generate.stderr.read()
    generate.wait(timeout=60)
    assert err == "" and generate.returncode == 141, err


# ------------------------------------------------------------------ silent settings


def test_compiled_and_eager_cells_are_apart_in_the_report(small_run, tmp_path):
    """A --compile cell beside an eager one of the same grid: two settings groups, and the CSV says which."""
    import csv
    from relaxspec.bench.report import build_rows, settings_groups
    from relaxspec.bench.store import Store
    out = damaged_copy(small_run, tmp_path,
                       "INSERT INTO cells SELECT key || 'c', json_set(config, '$.compile', json('true')), metrics, "
                       "created FROM cells", "INSERT INTO rows SELECT cell_key || 'c', prompt_index, repeat, prompt, "
                       "reference, response, utility, tokens, stats, token_hash FROM rows")
    with Store.open_existing(out) as store:
        groups = settings_groups(store)
        assert [bool(settings["compile"]) for settings, _ in groups] == [False, True]
        assert {len(cells) for _, cells in groups} == {3}
        assert {row["compile"] for row in build_rows(store, "latest")} == {True}
    assert main(["report", str(out), "--all", "--no-plots"]) == 0
    with open(out / "results.csv") as f:
        assert sorted(row["compile"] for row in csv.DictReader(f)) == ["False"] * 3 + ["True"] * 3


def test_phase_with_ar_is_refused(capsys):
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--method", "ar", "--phase", "think",
                   says="--phase: method 'ar' verifies no drafts")


# ------------------------------------------------------------------ minor


def test_failed_cells_say_whether_a_re_run_helps(capsys):
    from relaxspec.cli.bench import print_failed
    transient = "cactus delta=1 N=3: RuntimeError: worker died"
    on_inputs = "typical N=3: ValueError: rule 'typical' reads q"
    print_failed([transient])
    assert "re-run to retry them" in capsys.readouterr().err
    print_failed([on_inputs, "strict N=3: its stored samples follow another --repeats; use another --out"])
    err = capsys.readouterr().err
    assert "re-run" not in err and "each fails again until what it says is fixed" in err, err
    print_failed([transient, on_inputs])
    assert "a re-run retries 1; the 1 that failed on their inputs fail again" in capsys.readouterr().err


def test_a_repeated_param_is_refused(capsys):
    one_line_error(capsys, "generate", "--prompt", PROMPT, "--method", "cactus", "--param", "delta=1", "--param",
                   "delta=2", says="--param delta given twice (1 and 2); give it once")



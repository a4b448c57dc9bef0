import importlib.util
import os
import signal
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"

# A suite started in the background of a non-interactive shell (`nohup pytest &`) inherits SIGINT ignored, and so
# would every process it starts: the tests that press Ctrl-C in a child would see it ignored. Python's own handler
# here is reset to the default in each child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def benchmark_module(name: str):
    """benchmarks/<name>.py as module `name`, imported once: registered in sys.modules (its dataclasses look their
    module up there), with benchmarks/ on sys.path (a script imports another's pieces, as when run as a script)."""
    path = BENCHMARKS / f"{name}.py"
    module = sys.modules.get(name)
    if module is not None and getattr(module, "__file__", None) == str(path):
        return module
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session", autouse=True)
def _weight_cache_of_the_run(tmp_path_factory):
    # GGUF loads (and the subprocesses tests start) keep their converted weights in a folder of this test run, never
    # in the user's cache (models/weight_cache.py); a test that needs its own sets RELAXSPEC_WEIGHT_CACHE_DIR.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RELAXSPEC_WEIGHT_CACHE_DIR", str(tmp_path_factory.mktemp("weight-cache")))
        yield


@pytest.fixture(autouse=True)
def _one_thread():
    # Tiny models on a shared 2-core machine: one thread avoids oversubscription.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def builtin_pair():
    from relaxspec.models import load_model

    return load_model("verifier"), load_model("drafter-weak")


@pytest.fixture(scope="session")
def forker(_weight_cache_of_the_run):
    """A fork server for the scripts and `python -m relaxspec` runs that need a process of their own, not a fresh
    interpreter (forked.py): torch, transformers and matplotlib imported once for the run, relaxspec anew in each
    child. Its environment is fixed at its start (OpenMP and the Hugging Face hub read theirs at import): one torch
    thread, the hub offline, matplotlib's Agg backend, this tree's src first on the path and this Python's bin on the
    PATH."""
    from forked import Forker

    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]),
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    with Forker(["torch", "transformers", "transformers.models.llama.modeling_llama", "matplotlib.pyplot"],
                env=env) as server:
        yield server

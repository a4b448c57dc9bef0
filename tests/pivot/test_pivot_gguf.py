"""PAD for any pair, on two tiny random Qwen2 GGUF files loaded by path in int4 (as the real pair runs): a known
pivot recovered by the labeller, `relaxspec pivot build` (labels, resumable parts, classifier), and
`relaxspec generate --method pad` finding the classifier shipped for the pair by its fingerprints (a test-only
directory in place of pivot/builtin/), or saying in one line which command trains one."""

import shutil

import pytest
import torch
from helpers import one_line_error, run_cli, write_qwen2  # noqa: F401

import relaxspec.pivot as pivot
from relaxspec.cli import main
from relaxspec.models import load_model
from relaxspec.pivot import classifier_for_pair, label_pivots, load_classifier
from relaxspec.models.gguf import gguf_fingerprint
from relaxspec.tasks.base import Example, Task

torch.set_num_threads(1)
PROMPT = "Tell me"


@pytest.fixture(autouse=True)
def no_weight_cache(monkeypatch):
    """The commands load these throw-away files without writing converted weights into the user's cache."""
    monkeypatch.setenv("RELAXSPEC_WEIGHT_CACHE", "0")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("pair")
    return str(write_qwen2(d / "tiny-verifier.gguf", {}, seed=0)), str(write_qwen2(d / "tiny-drafter.gguf", {}, seed=1))


@pytest.fixture(scope="module")
def pair(files):
    return tuple(load_model(f, dtype="int4", weight_cache=False) for f in files)


def test_fingerprints_are_the_files(pair, files):
    verifier, drafter = pair
    fv, fd = gguf_fingerprint(verifier), gguf_fingerprint(drafter)
    assert fv.startswith("gguf-") and len(fv) == 21 and fv != fd
    assert gguf_fingerprint(load_model(files[0], dtype="float32", weight_cache=False)) == fv  # the file, whatever the dtype


def test_known_pivot_recovered_on_the_gguf_pair(pair, tmp_path):
    """Utility 1 iff the response starts with the verifier's first greedy token (an ASCII letter; the drafter's is
    another byte): that first mismatch is a pivot (the drafter's roll-outs all start with its token), every later
    one is not (the walk took the verifier's token, so every roll-out starts with it)."""
    verifier, drafter = pair
    tok = verifier.tokenizer
    ids = torch.tensor([tok(PROMPT)["input_ids"]])
    pos = torch.arange(ids.shape[1])[None]
    v0 = int(verifier.forward(ids, verifier.new_cache(), None, pos)[0][0, -1].argmax())
    d0 = int(drafter.forward(ids, drafter.new_cache(), None, pos)[0][0, -1].argmax())
    good = tok.decode([v0])
    assert v0 != d0 and len(good) == 1 and good.isascii() and good.isalpha()  # (prompt and seeds chosen so)
    task = Task(name="first-token", examples=[Example(PROMPT, "")], utility=lambda r, ref: float(r.startswith(good)),
                metric="m", meta={"split": "pivot"})
    data = label_pivots(verifier, drafter, task, 1, k=3, max_new_tokens=6, out=tmp_path / "l.pt", min_baseline=0.0,
                        min_prob=0.0, progress=False)
    labels, steps = data["labels"].tolist(), data["steps"].tolist()
    assert steps[0] == 0 and labels[0] == 1 and data["u_draft"][0] == 0 and data["u_verifier"][0] == 1
    assert len(labels) >= 2 and labels[1:] == [0] * (len(labels) - 1)
    assert data["meta"]["verifier_fingerprint"] == gguf_fingerprint(verifier)
    assert data["meta"]["weight_format"] == "int4"


def test_build_then_generate_finds_the_shipped_classifier(files, pair, tmp_path, capsys, monkeypatch):
    v, d = files
    out = tmp_path / "run"
    build = ["pivot", "build", "--verifier", v, "--drafter", d, "--dtype", "int4", "--task", "word-problems",
             "--prompts", "3", "--k", "2", "--max-new-tokens", "4", "--min-baseline", "0", "--min-prob", "0",
             "--epochs", "5", "--val-fraction", "0.34", "--threads", "1", "--out", str(out)]
    # a part of no time labels one prompt (the one in flight), and says how to go on; nothing trained yet
    assert main(build + ["--time-budget", "1e-9"]) == 0
    err = capsys.readouterr().err
    assert "2 of 3 prompts left" in err and "rerun the same command" in err
    assert not (out / "classifier.pt").exists() and len(list((out / "labels.pt.shards").glob("prompt_*.pt"))) == 1
    shard = out / "labels.pt.shards" / "prompt_00000.pt"
    mtime = shard.stat().st_mtime_ns
    assert main(build) == 0  # the rest, then training
    captured = capsys.readouterr()
    assert shard.stat().st_mtime_ns == mtime and "held-out" in captured.out
    clf = load_classifier(out / "classifier.pt")
    assert clf.spec["verifier"] == v and clf.spec["weight_format"] == "int4"
    assert clf.spec["task"] == "word-problems" and clf.check_models(*pair) == []
    name = pivot.shipped_name(clf.spec)
    assert name == "word-problems-tiny-verifier-tiny-drafter.pt" and name in captured.err

    gen = ["generate", "--verifier", v, "--drafter", d, "--dtype", "int4", "--method", "pad", "--prompt", PROMPT,
           "--max-new-tokens", "6", "--param", "threshold=1.0", "--param", "min_prob=0"]
    code, text, err = run_cli(capsys, *gen, "--param", f"classifier={out / 'classifier.pt'}")
    assert code == 0 and text.strip(), err

    shipped = tmp_path / "builtin"
    shipped.mkdir()
    monkeypatch.setattr(pivot, "BUILTIN_DIR", shipped)
    code, _, err = run_cli(capsys, *gen)  # (after the models' load notes) one error line naming the command
    errors = [line for line in err.splitlines() if line.startswith("relaxspec: error: ")]
    assert code == 2 and len(errors) == 1 and err.endswith(errors[0] + "\n") and "Traceback" not in err, err
    assert "no pivot classifier ships" in errors[0] and "tiny-drafter.gguf" in errors[0]
    assert f"`relaxspec pivot build --verifier {v} --drafter {d} --dtype int4 --task word-problems" in errors[0]
    shutil.copy(out / "classifier.pt", shipped / name)
    code, flagless, err = run_cli(capsys, *gen)
    assert code == 0 and flagless == text, err  # the same classifier, found by the pair's fingerprints
    assert classifier_for_pair(*pair) == shipped / name
    # another drafter (the verifier file itself) is not this pair
    with pytest.raises(FileNotFoundError, match="no pivot classifier ships"):
        classifier_for_pair(pair[0], pair[0])
    assert classifier_for_pair(pair[0], pair[0], force=True) == shipped / name


def test_bad_build_arguments_are_one_line(files, tmp_path, capsys):
    v, d = files
    base = ("pivot", "build", "--verifier", v, "--drafter", d, "--prompts", "1")
    afile = tmp_path / "a-file"
    afile.write_text("x")
    one_line_error(capsys, *base, "--out", str(afile), says="is a file; give a directory")
    one_line_error(capsys, *base, "--out", str(tmp_path / "no" / "such"), says="does not exist")
    one_line_error(capsys, *base, "--out", str(tmp_path / "o"), "--k", "0", says="--k")

"""The converted-weight cache (models/weight_cache.py): hit, miss, stale, damaged, read-only, interrupted, off, for
the weights' entries and the tokenizer's.

Each test gets its own cache folder (RELAXSPEC_WEIGHT_CACHE_DIR; the native kernels stay in the suite's cache).
A hit is told apart from a conversion by a counting wrapper around the real `GGUFWeights.__call__` (every tensor a
conversion reads goes through it), by the entry's weights file left untouched (same inode and mtime), and by the
model's tensors lying inside the process's mapping of that file (/proc/self/maps); a tokenizer read from its entry
from one built from the file's vocabulary by a counting wrapper around the real `gguf_weights.gguf_tokenizer`.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relaxspec.models import gguf_weights, load_model, weight_cache
from relaxspec.models.prompts import vocab_key as _vocab_key
from helpers import conversions, entries, inside, logits_of, mapped_ranges, qwen2_file, stderr_lines, weights_file, write_qwen2  # noqa: F401
from helpers import weight_cache_folder as cache  # noqa: F401  (fixtures: conversions, qwen2_file, cache)

FORMATS = ["int4", "auto"]


@pytest.fixture
def tokenizer_builds(monkeypatch):
    """How many tokenizers were built from a GGUF file's vocabulary since the test began."""
    count = {"n": 0}
    real = gguf_weights.gguf_tokenizer

    def counted(path):
        count["n"] += 1
        return real(path)

    monkeypatch.setattr(gguf_weights, "gguf_tokenizer", counted)
    return count


def tokenizer_entries(folder: Path) -> list[Path]:
    return sorted(folder.glob("*-tokenizer")) if folder.exists() else []


def convert_reference(path, fmt):
    """The model as loaded without the cache (converted in memory), its logits."""
    return logits_of(load_model(path, dtype=fmt, weight_cache=False))


NFC_SENSITIVE = "cafe\u0301 and caf\u00e9: def ab(x)"  # (a decomposed é: a normalizer would change its tokens)


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_second_load_maps_the_cache_and_converts_nothing(qwen2_file, cache, conversions, tokenizer_builds, capsys,
                                                           fmt):
    first = load_model(qwen2_file, dtype=fmt)
    assert conversions["n"] > 0 and tokenizer_builds["n"] == 1
    lines = stderr_lines(capsys)
    assert any("cached in" in line for line in lines), lines
    path = weights_file(cache, fmt)
    before = path.stat()
    expected = logits_of(first)
    first_ids = first.tokenizer(NFC_SENSITIVE)["input_ids"]
    del first

    conversions["n"] = tokenizer_builds["n"] = 0
    second = load_model(qwen2_file, dtype=fmt)
    assert conversions["n"] == 0 and tokenizer_builds["n"] == 0  # nothing read from the GGUF file
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns, after.st_size) == (before.st_ino, before.st_mtime_ns, before.st_size)
    lines = stderr_lines(capsys)
    assert not any("cached in" in line or "cache" in line for line in lines), lines
    assert any("4-bit tensors keep the file's codes" in line for line in lines), lines  # the format's note, as before
    assert torch.equal(logits_of(second), expected)  # bit-identical to the converting load
    assert "model" not in vars(second)  # FastLlama ran alone: no transformers model was built
    # the tokenizer read back is the one the converting load built from the file (no normalizer added on the way)
    assert second.tokenizer(NFC_SENSITIVE)["input_ids"] == first_ids

    ranges = mapped_ranges(path)  # the weights are views of the mapped entry, not copies
    fast = second.fast
    qkv, o, gate_up, down = (fast.layers[0][i] for i in (1, 2, 4, 5))
    assert ranges and inside(fast.embed, ranges) and inside(fast.final_norm, ranges)
    int4 = gate_up.block[0] if gate_up.block is not None else gate_up.packed
    assert inside(int4, ranges)
    if fmt == "auto":
        assert qkv.format == "bfloat16" and inside(qkv.w, ranges)
    assert inside(second.model.model.layers[0].self_attn.q_proj.bias, ranges)
    reference = load_model(qwen2_file, dtype=fmt, weight_cache=False)
    assert sorted(second.state_dict()) == sorted(reference.state_dict())
    # the vocabulary digest generate compares a pair by comes with the entry, and is the tokenizer's own
    assert second.tokenizer._relaxspec_vocab_key == (len(reference.tokenizer), _vocab_key(reference.tokenizer))
    assert second.tokenizer.get_vocab() == reference.tokenizer.get_vocab()
    text = "def ab(x): return x  # ab"
    assert second.tokenizer(text)["input_ids"] == reference.tokenizer(text)["input_ids"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_miss_converts_and_writes_one_entry_per_file_and_format(qwen2_file, tmp_path, cache, conversions,
                                                                  capsys, fmt):
    other = "int4" if fmt == "auto" else "auto"
    load_model(qwen2_file, dtype=other)
    conversions["n"] = 0
    lm = load_model(qwen2_file, dtype=fmt)  # another format: a miss
    assert conversions["n"] > 0 and len(entries(cache)) == 2
    assert torch.equal(logits_of(lm), convert_reference(qwen2_file, fmt))
    # a file rewritten at the same path (same size, other weights) is another key: a miss, never the old entry
    moved = write_qwen2(tmp_path / "moving.gguf", {})
    old = logits_of(load_model(moved, dtype=fmt))
    write_qwen2(moved, {}, seed=1)
    conversions["n"] = 0
    new = logits_of(load_model(moved, dtype=fmt))
    assert conversions["n"] > 0
    assert not torch.equal(new, old) and torch.equal(new, convert_reference(moved, fmt))
    # the same bytes at another path: the same entry (keyed by the file's SHA-256)
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(moved, copy)
    conversions["n"] = 0
    count = len(entries(cache))
    assert torch.equal(logits_of(load_model(copy, dtype=fmt)), new)
    assert conversions["n"] == 0 and len(entries(cache)) == count


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_cache_turned_off_writes_and_reads_nothing(qwen2_file, cache, conversions, monkeypatch, fmt):
    load_model(qwen2_file, dtype=fmt, weight_cache=False)
    assert not cache.exists()
    monkeypatch.setenv("RELAXSPEC_WEIGHT_CACHE", "0")
    load_model(qwen2_file, dtype=fmt)
    assert not cache.exists()
    monkeypatch.delenv("RELAXSPEC_WEIGHT_CACHE")
    load_model(qwen2_file, dtype=fmt)  # on again: written ...
    conversions["n"] = 0
    monkeypatch.setenv("RELAXSPEC_WEIGHT_CACHE", "0")
    load_model(qwen2_file, dtype=fmt)  # ... and off: not read
    assert conversions["n"] > 0


def test_the_default_folder_is_under_the_cache_root(tmp_path, monkeypatch):
    monkeypatch.delenv("RELAXSPEC_WEIGHT_CACHE_DIR", raising=False)
    monkeypatch.setenv("RELAXSPEC_CACHE", str(tmp_path))
    assert weight_cache.directory() == tmp_path / "weights"


def rewrite_header(path: Path, change) -> None:
    """weights.bin with its JSON header changed in place by `change(dict)` (same length: padded with spaces)."""
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[8:16], "little")
    header = json.loads(data[16:16 + n])
    change(header)
    text = json.dumps(header, separators=(",", ":")).encode()  # (shorter than the file's own spacing)
    assert len(text) <= n
    data[16:16 + n] = text + b" " * (n - len(text))
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_stale_entry_is_rebuilt_with_one_line(qwen2_file, cache, conversions, capsys, fmt):
    expected = logits_of(load_model(qwen2_file, dtype=fmt))
    path = weights_file(cache, fmt)
    rewrite_header(path, lambda h: h.update(version=weight_cache.VERSION - 1))
    capsys.readouterr()
    conversions["n"] = 0
    lm = load_model(qwen2_file, dtype=fmt)
    lines = stderr_lines(capsys)
    stale = [line for line in lines if "is stale" in line]
    assert len(stale) == 1 and stale == [line for line in lines if "weight cache entry" in line], lines
    assert f"version {weight_cache.VERSION - 1}, now {weight_cache.VERSION}" in stale[0]
    assert conversions["n"] > 0 and torch.equal(logits_of(lm), expected)
    header = json.loads(path.read_bytes()[16:16 + int.from_bytes(path.read_bytes()[8:16], "little")])
    assert header["version"] == weight_cache.VERSION  # rewritten ...
    conversions["n"] = 0
    assert torch.equal(logits_of(load_model(qwen2_file, dtype=fmt)), expected)
    assert conversions["n"] == 0 and not any("weight cache" in line for line in stderr_lines(capsys))  # ... and used


def truncate(entry: Path):
    path = entry / weight_cache.WEIGHTS
    data = path.read_bytes()
    path.write_bytes(data[:len(data) - 1000])


def garbage(entry: Path):
    path = entry / weight_cache.WEIGHTS
    path.write_bytes(os.urandom(path.stat().st_size))


def bad_header(entry: Path):
    path = entry / weight_cache.WEIGHTS
    data = bytearray(path.read_bytes())
    data[16:40] = b"{not json at all !!!!!!!"
    path.write_bytes(bytes(data))


def wrong_offsets(entry: Path):  # a header that parses but places a tensor past the end
    rewrite_header(entry / weight_cache.WEIGHTS,
                   lambda h: next(iter(h["tensors"].values())).__setitem__(2, h["data_bytes"] + 64))


def unreadable(entry: Path):  # a folder where the weights file goes: reading it fails (even as root)
    path = entry / weight_cache.WEIGHTS
    path.unlink()
    path.mkdir()


def missing_config(entry: Path):
    (entry / "config.json").unlink()


DAMAGE = [truncate, garbage, bad_header, wrong_offsets, unreadable, missing_config]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("damage", DAMAGE, ids=[d.__name__ for d in DAMAGE])
def test_a_damaged_entry_is_rebuilt_with_one_line_never_used(qwen2_file, cache, conversions, capsys, fmt, damage):
    expected = logits_of(load_model(qwen2_file, dtype=fmt))
    (entry,) = entries(cache)
    damage(entry)
    capsys.readouterr()
    conversions["n"] = 0
    lm = load_model(qwen2_file, dtype=fmt)
    lines = stderr_lines(capsys)
    damaged = [line for line in lines if "is damaged" in line]
    assert len(damaged) == 1 and "rebuilding it" in damaged[0], lines
    assert conversions["n"] > 0 and torch.equal(logits_of(lm), expected)
    conversions["n"] = 0
    assert torch.equal(logits_of(load_model(qwen2_file, dtype=fmt)), expected)  # the rebuilt entry serves
    assert conversions["n"] == 0 and not any("weight cache" in line for line in stderr_lines(capsys))


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_cache_folder_that_cannot_be_written_loads_as_without_it(qwen2_file, tmp_path, monkeypatch, capsys, fmt):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RELAXSPEC_WEIGHT_CACHE_DIR", str(blocker / "weights"))  # (mkdir fails, root or not)
    lm = load_model(qwen2_file, dtype=fmt)
    lines = [line for line in stderr_lines(capsys) if "cache" in line]
    assert len(lines) == 2 and "cannot write the tokenizer cache" in lines[0], lines
    assert "cannot write the weight cache" in lines[1], lines
    assert torch.equal(logits_of(lm), convert_reference(qwen2_file, fmt))
    assert blocker.read_text() == "not a folder"


LOAD_SCRIPT = """
import sys, torch
sys.path.insert(0, {tests!r})
from relaxspec.models import load_model
from helpers import logits_of
for fmt in ("int4", "auto"):
    torch.save(logits_of(load_model({gguf!r}, dtype=fmt)), {out!r} + "/" + fmt + ".pt")
"""


def read_only_mounts_work(tmp_path: Path) -> bool:
    probe = tmp_path / "probe"
    probe.mkdir()
    if shutil.which("unshare") is None:
        return False
    result = subprocess.run(["unshare", "-m", "sh", "-c", f"mount --bind -o ro {probe} {probe} && "
                             f"! touch {probe}/x 2>/dev/null"], capture_output=True)
    return result.returncode == 0


def run_on_read_only_cache(folder: Path, gguf: Path, out: Path) -> subprocess.CompletedProcess:
    """Both formats loaded in a process that sees `folder` (the weight cache) mounted read-only (a private mount
    namespace: EROFS for root as for anyone)."""
    script = LOAD_SCRIPT.format(tests=str(Path(__file__).resolve().parents[1]), gguf=str(gguf), out=str(out))
    env = {**os.environ, "RELAXSPEC_WEIGHT_CACHE_DIR": str(folder)}
    env.pop("RELAXSPEC_WEIGHT_CACHE", None)
    return subprocess.run(["unshare", "-m", "sh", "-c", f'mount --bind -o ro "$0" "$0" && exec "$1" -c "$2"',
                           str(folder), sys.executable, script], capture_output=True, text=True, env=env,
                          timeout=600)


def test_a_read_only_cache_folder_is_read_but_never_written(qwen2_file, tmp_path, cache, capsys):
    if not read_only_mounts_work(tmp_path):
        pytest.skip("no private mount namespace here (unshare -m; mount --bind -o ro) for a read-only folder")
    cache.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    empty = run_on_read_only_cache(cache, qwen2_file, out)  # nothing in it: converted in memory, one line each
    assert empty.returncode == 0, empty.stderr[-3000:]
    for kind in ("weight", "tokenizer"):
        lines = [line for line in empty.stderr.splitlines() if f"{kind} cache" in line]
        assert len(lines) == 2 and all(f"cannot write the {kind} cache" in line and "Read-only file system" in line
                                       for line in lines), lines
    assert not any(cache.iterdir())
    for fmt in FORMATS:
        assert torch.equal(torch.load(out / f"{fmt}.pt"), convert_reference(qwen2_file, fmt))
    for fmt in FORMATS:  # written here, then read by the read-only process: a hit, no line
        load_model(qwen2_file, dtype=fmt)
    held = run_on_read_only_cache(cache, qwen2_file, out)
    assert held.returncode == 0, held.stderr[-3000:]
    assert not any("cache" in line for line in held.stderr.splitlines()), held.stderr
    for fmt in FORMATS:
        assert torch.equal(torch.load(out / f"{fmt}.pt"), convert_reference(qwen2_file, fmt))


@pytest.mark.parametrize("fmt", FORMATS)
def test_an_interrupted_write_leaves_nothing_that_is_used(qwen2_file, cache, conversions, fmt):
    load_model(qwen2_file, dtype=fmt)
    (entry,) = entries(cache)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    work = cache / f".fetch-{int(dead.stdout)}-weights-abc"  # a write killed before its rename: a whole copy even
    shutil.copytree(entry, work)
    shutil.rmtree(entry)
    expected = convert_reference(qwen2_file, fmt)
    conversions["n"] = 0
    assert torch.equal(logits_of(load_model(qwen2_file, dtype=fmt)), expected)
    assert conversions["n"] > 0  # not used: converted again
    assert not work.exists() and len(entries(cache)) == 1  # the dead process's work removed, the entry written


# ------------------------------------------------------------------ the tokenizer's entry


TEMPLATE = "{% for m in messages %}<|im_end|>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}ab{% endif %}"


def same_tokenizer(a, b) -> None:
    for text in ("def ab(x): return x  # ab", NFC_SENSITIVE, "<|im_end|>ab<|endoftext|>"):
        ids = a(text)["input_ids"]
        assert ids == b(text)["input_ids"] and a.decode(ids) == b.decode(ids), text
    assert a.get_vocab() == b.get_vocab() and len(a) == len(b)
    assert (a.bos_token_id, a.eos_token_id, a.pad_token_id) == (b.bos_token_id, b.eos_token_id, b.pad_token_id)
    assert a.all_special_tokens == b.all_special_tokens and a.chat_template == b.chat_template
    assert json.loads(a.backend_tokenizer.to_str()) == json.loads(b.backend_tokenizer.to_str())


def tokenizer_manifest(folder: Path) -> Path:
    (entry,) = tokenizer_entries(folder)
    return entry / weight_cache.TOKENIZER_ENTRY


def test_a_tokenizer_is_built_from_the_file_once_then_read_from_its_entry_in_every_format(qwen2_file, cache,
                                                                                          tokenizer_builds):
    reference = gguf_weights.gguf_tokenizer(qwen2_file)
    tokenizer_builds["n"] = 0
    first = load_model(qwen2_file, dtype="int4")  # a miss: built from the file, written
    assert tokenizer_builds["n"] == 1 and len(tokenizer_entries(cache)) == 1
    others = [load_model(qwen2_file, dtype="auto"), load_model(qwen2_file, dtype="int4")]  # a weight miss, a hit
    assert tokenizer_builds["n"] == 1 and len(tokenizer_entries(cache)) == 1
    for lm in (first, *others):
        same_tokenizer(lm.tokenizer, reference)
    assert others[1].tokenizer._relaxspec_vocab_key == (len(reference), _vocab_key(reference))


def test_files_with_the_same_vocabulary_share_one_parsed_tokenizer(tmp_path, cache, tokenizer_builds):
    a = write_qwen2(tmp_path / "a.gguf", {}, chat_template=TEMPLATE)
    b = write_qwen2(tmp_path / "b.gguf", {}, seed=1, chat_template=TEMPLATE.replace("ab{% endif", "{% endif"))
    references = [gguf_weights.gguf_tokenizer(path) for path in (a, b)]
    for path in (a, b):
        load_model(path, dtype="int4")
    assert len(tokenizer_entries(cache)) == 2  # (an entry per file)
    tokenizer_builds["n"] = 0
    verifier, drafter = load_model(a, dtype="int4"), load_model(b, dtype="int4")
    assert tokenizer_builds["n"] == 0
    assert verifier.tokenizer.backend_tokenizer is drafter.tokenizer.backend_tokenizer  # parsed once
    for lm, reference in zip((verifier, drafter), references):
        same_tokenizer(lm.tokenizer, reference)  # each its own chat template
        messages = [{"role": "user", "content": "ab"}]
        assert (lm.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
                == reference.apply_chat_template(messages, add_generation_prompt=True))
    assert verifier.tokenizer.chat_template != drafter.tokenizer.chat_template


def test_a_stale_tokenizer_entry_is_rebuilt_with_one_line(qwen2_file, cache, conversions, tokenizer_builds,
                                                          capsys):
    reference = load_model(qwen2_file, dtype="int4").tokenizer
    manifest = tokenizer_manifest(cache)
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "version": weight_cache.TOKENIZER_VERSION - 1}))
    capsys.readouterr()
    conversions["n"] = tokenizer_builds["n"] = 0
    lm = load_model(qwen2_file, dtype="int4")
    lines = [line for line in stderr_lines(capsys) if "cache" in line]
    assert len(lines) == 1 and "tokenizer cache entry" in lines[0] and "is stale" in lines[0], lines
    assert f"tokenizer version {weight_cache.TOKENIZER_VERSION - 1}, now {weight_cache.TOKENIZER_VERSION}" in lines[0]
    assert conversions["n"] == 0 and tokenizer_builds["n"] == 1  # the weights' entry served; the tokenizer rebuilt
    same_tokenizer(lm.tokenizer, reference)
    assert json.loads(tokenizer_manifest(cache).read_text())["version"] == weight_cache.TOKENIZER_VERSION
    same_tokenizer(load_model(qwen2_file, dtype="int4").tokenizer, reference)  # ... and used
    assert tokenizer_builds["n"] == 1 and not any("cache" in line for line in stderr_lines(capsys))


def garbled_entry(entry: Path):
    (entry / weight_cache.TOKENIZER_ENTRY).write_text("{not json")


def entry_not_an_object(entry: Path):
    (entry / weight_cache.TOKENIZER_ENTRY).write_text("[1, 2]")


def short_tokenizer(entry: Path):
    path = entry / weight_cache.TOKENIZER
    path.write_bytes(path.read_bytes()[:100])


def changed_in_place(entry: Path):  # the right size, still a tokenizer the package reads, another pre-tokenizer
    path = entry / weight_cache.TOKENIZER
    data = path.read_bytes()
    assert b'"add_prefix_space": false' in data
    path.write_bytes(data.replace(b'"add_prefix_space": false', b'"add_prefix_space": true ', 1))


def missing_tokenizer(entry: Path):
    (entry / weight_cache.TOKENIZER).unlink()


def not_a_tokenizer(entry: Path):  # size and SHA-256 agree with entry.json, but the tokenizers package cannot read it
    import hashlib

    data = b'{"version": "1.0", "model": {"type": "nothing"}}'
    (entry / weight_cache.TOKENIZER).write_bytes(data)
    manifest = entry / weight_cache.TOKENIZER_ENTRY
    record = json.loads(manifest.read_text())
    record["tokenizer_json"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest.write_text(json.dumps(record))


def bad_settings(entry: Path):
    manifest = entry / weight_cache.TOKENIZER_ENTRY
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "settings": ["not", "settings"]}))


TOKENIZER_DAMAGE = [garbled_entry, entry_not_an_object, short_tokenizer, changed_in_place, missing_tokenizer,
                    not_a_tokenizer, bad_settings]


@pytest.mark.parametrize("damage", TOKENIZER_DAMAGE, ids=[d.__name__ for d in TOKENIZER_DAMAGE])
def test_a_damaged_tokenizer_entry_is_rebuilt_with_one_line_never_used(qwen2_file, cache, conversions,
                                                                       tokenizer_builds, capsys, damage):
    reference = load_model(qwen2_file, dtype="int4").tokenizer
    (entry,) = tokenizer_entries(cache)
    damage(entry)
    capsys.readouterr()
    conversions["n"] = tokenizer_builds["n"] = 0
    lm = load_model(qwen2_file, dtype="int4")
    lines = [line for line in stderr_lines(capsys) if "cache" in line]
    assert len(lines) == 1 and "tokenizer cache entry" in lines[0] and "is damaged" in lines[0], lines
    assert "rebuilding it" in lines[0]
    assert conversions["n"] == 0 and tokenizer_builds["n"] == 1
    same_tokenizer(lm.tokenizer, reference)
    same_tokenizer(load_model(qwen2_file, dtype="int4").tokenizer, reference)  # the rebuilt entry serves
    assert tokenizer_builds["n"] == 1 and not any("cache" in line for line in stderr_lines(capsys))


HIT_SCRIPT = """
import sys
from relaxspec.engine import generate
from relaxspec.models import load_model
lm = load_model({gguf!r}, dtype="int4")
out = generate(lm, None, ["def ab(x):"], method="ar", max_new_tokens=3, chat_template="off")
modeling = sorted(m for m in sys.modules if m == "transformers.modeling_utils" or (
    m.startswith("transformers.models.") and ".modeling_" in m and not m.startswith("transformers.models.auto.")))
print(modeling, "model" in vars(lm), len(out.results[0].token_ids))
print(type(lm.model).__name__, sorted(lm.state_dict()) == sorted(lm.model.state_dict()))
"""


def test_a_hit_generates_without_transformers_model_classes(qwen2_file, cache):
    load_model(qwen2_file, dtype="int4")  # (the entries written)
    env = {**os.environ, "RELAXSPEC_WEIGHT_CACHE_DIR": str(cache)}
    env.pop("RELAXSPEC_WEIGHT_CACHE", None)
    run = subprocess.run([sys.executable, "-c", HIT_SCRIPT.format(gguf=str(qwen2_file))], capture_output=True,
                         text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    # not imported (seconds), not built; the transformers model is built from the entry when something reads it
    assert run.stdout.splitlines() == ["[] False 3", "Qwen2ForCausalLM True"], run.stdout

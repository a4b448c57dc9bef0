"""Compiled steps (models/compiled.py): the same tokens as the eager FastLlama path at T=0, strict still
lossless at T>0, no recompile after warm-up. Compiling costs tens of seconds on a loaded 2-core machine, so
every test shares one pair of tiny Llamas made from a config and one batch size (one graph per width)."""

import pytest
import torch

from relaxspec.engine.generate import generate
from relaxspec.models import load_model
from relaxspec.models.compiled import CompiledLlama, StaticKVCache
from relaxspec.models.device import resolve_device
from relaxspec.models.fast_llama import FastLlama
from relaxspec.models.hf import CausalLM
from helpers import task_prompts

B = 4  # every compiled call uses this batch size (one graph per step width)
# The default device ($RELAXSPEC_DEVICE, else cuda when available): benchmarks/gpu_check.sh runs this file on
# CUDA, where the compiled steps replay CUDA graphs.
DEVICE = resolve_device(None)


def _tiny(layers: int, hidden: int, seed: int, sharpen: float):
    """A random Llama on the built-in tokenizer's vocabulary, its output head scaled by `sharpen` so that
    sampling is neither uniform nor deterministic (a random init gives near-uniform logits)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = load_model("verifier").tokenizer
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4,
                      max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=tokenizer.eos_token_id,
                      pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(cfg).to(DEVICE).eval()  # float32
    with torch.no_grad():
        model.lm_head.weight.mul_(sharpen)
    return model, tokenizer


@pytest.fixture(scope="module")
def tiny_pairs():
    """(eager verifier, eager drafter), (compiled verifier, compiled drafter): the same weights."""
    (vm, tok), (dm, _) = _tiny(2, 64, 0, 40.0), _tiny(1, 64, 1, 40.0)
    dm.load_state_dict(vm.state_dict(), strict=False)  # the verifier's first block, embedding and head:
    # a drafter that agrees often but not always
    eager = CausalLM("tiny-v", vm, tok, FastLlama(vm)), CausalLM("tiny-d", dm, tok, FastLlama(dm))
    compiled = CausalLM("tiny-v", vm, tok, CompiledLlama(vm)), CausalLM("tiny-d", dm, tok, CompiledLlama(dm))
    assert compiled[0].compiled and not eager[0].compiled
    return eager, compiled


def test_compiled_greedy_equals_eager_and_ar_on_a_ragged_batch_without_recompiling(tiny_pairs):
    (v, d), (vc, dc) = tiny_pairs
    prompts = task_prompts(B)  # different lengths: left padding; rows accept differently and stop at different rounds
    ar = generate(v, None, prompts, method="ar", max_new_tokens=24)
    for verifier, drafter in ((v, d), (vc, dc)):
        sd = generate(verifier, drafter, prompts, method="strict", draft_length=3, max_new_tokens=24)
        assert [r.token_ids for r in sd.results] == [r.token_ids for r in ar.results]
    ar_c = generate(vc, None, prompts, method="ar", max_new_tokens=24)
    assert [r.token_ids for r in ar_c.results] == [r.token_ids for r in ar.results]
    assert len({r.stats.mean_acceptance_length for r in sd.results}) > 1  # rows did accept differently
    # A model drafting for itself: two live caches of one compiled model (the buffer pool must not share them).
    own = generate(vc, vc, prompts, method="strict", draft_length=3, max_new_tokens=24)
    assert [r.token_ids for r in own.results] == [r.token_ids for r in ar.results]
    assert own.stats.drafts_accepted == own.stats.drafts_proposed  # its own drafts: all accepted
    # Warmed up: other prompts (other lengths), other max_new_tokens within the same capacity, an early
    # stop of some rows: no step may compile again.
    others = task_prompts(B, offset=B)
    with torch.compiler.set_stance("fail_on_recompile"):
        sd_c = generate(vc, dc, others, method="strict", draft_length=3, max_new_tokens=20)
        ar_c = generate(vc, None, others, method="ar", max_new_tokens=20)
    ar = generate(v, None, others, method="ar", max_new_tokens=20)
    assert [r.token_ids for r in sd_c.results] == [r.token_ids for r in ar.results]
    assert [r.token_ids for r in ar_c.results] == [r.token_ids for r in ar.results]


def test_compiled_steps_match_eager_logits_with_holes_and_rows_leaving(tiny_pairs):
    # The cache mechanics directly: a prefill, a padded block, a rollback leaving holes, rows leaving.
    from relaxspec.models.stream import Stream, left_pad

    (v, _), (vc, _) = tiny_pairs
    encoded = [v.tokenizer(p)["input_ids"] for p in task_prompts(B)]
    ids, mask = left_pad(encoded, v.tokenizer, DEVICE)
    vc.fast.plan(ids.shape[1] + 16, (4,))
    outs = []
    for lm in (v, vc):
        s = Stream(lm)
        s.prefill(ids[:, :-3], mask[:, :-3])
        a, _ = s.feed(ids[:, -3:])  # 3 tokens: padded to the planned width 4 when compiled
        s.invalidate_tail(torch.tensor([1, 3, 2, 3], device=DEVICE), 3)  # holes
        b, hidden = s.feed(ids[:, -2:], hidden_layer=(0, -1))  # 2 tokens: padded to 4 too
        s.select(torch.tensor([2, 0], device=DEVICE))  # rows leave: the compiled cache keeps its buffers' shape
        s.compact(slack=0)  # eager: the holes are gathered away; compiled: its static cache is left as it is
        assert s.compactions == (0 if lm is vc else 1)
        c, _ = s.feed(ids[[2, 0], -1:])
        outs.append((a, b, hidden, c))
    assert isinstance(Stream(vc).cache, StaticKVCache)
    for x, y in zip(*outs):
        assert x.shape == y.shape
        assert torch.allclose(x, y, atol=1e-4, rtol=1e-4), (x - y).abs().max()


def test_compiled_strict_sampling_is_lossless(tiny_pairs):
    # Monte Carlo: compiled strict (T=1, top-p) vs eager AR, token frequencies at several positions within
    # 5 sigma of a two-sample comparison (fixed seeds), as tests/engine/test_engine.py does for the eager engine.
    (v, _), (vc, dc) = tiny_pairs
    prompt, n, positions = task_prompts(1)[0], 240, (0, 3, 7)
    sampling = dict(max_new_tokens=8, temperature=1.0, top_p=0.95)
    sd, ar = [], []
    for call in range(n // B):  # B rows per call: the compiled graphs' batch size
        sd += generate(vc, dc, [prompt] * B, method="strict", draft_length=3, seed=call, **sampling).results
        ar += generate(v, None, [prompt] * B, method="ar", seed=10_000 + call, **sampling).results
    V = v.vocab_size  # bin V: the sequence had ended (EOS) before that position

    def freq(results, position):
        tokens = [r.token_ids[position] if len(r.token_ids) > position else V for r in results]
        return torch.bincount(torch.tensor(tokens), minlength=V + 1).double() / n

    spread = []
    for position in positions:
        a, b = freq(sd, position), freq(ar, position)
        pooled = (a + b) / 2
        tol = 5 * torch.sqrt(pooled * (1 - pooled) * 2 / n) + 2e-3
        assert ((a - b).abs() <= tol).all(), position
        spread.append(float(pooled.max()))
    assert min(spread) < 0.7  # not a deterministic position (the comparison would be vacuous)
    assert sum(r.stats.drafts_accepted for r in sd) > 0  # drafts were accepted: the block path ran


def test_compile_api():
    from relaxspec.drafters import load_drafter

    with pytest.raises(ValueError, match="backend 'transformers'"):
        load_model("verifier", compile=True, backend="transformers")
    verifier = load_model("verifier", compile=True)
    assert verifier.compiled and not load_model("verifier").compiled
    assert load_drafter("drafter-weak", verifier).lm.compiled  # an LM drafter follows its verifier


@pytest.mark.slow
def test_builtin_pair_compiled_equals_eager_greedy():
    # Opt-in (pytest -m slow): the built-in pair compiles for about a minute on a loaded 2-core machine.
    # benchmarks/compile_speed.py checks the same equality on every prompt it times.
    v, d = load_model("verifier"), load_model("drafter-weak")
    vc, dc = load_model("verifier", compile=True), load_model("drafter-weak", compile=True)
    prompts = task_prompts(3)
    ar = generate(v, None, prompts, method="ar", max_new_tokens=48)
    for drafter in (dc, "drafter-weak"):
        sd = generate(vc, drafter, prompts, method="strict", draft_length=3, max_new_tokens=48)
        assert [r.token_ids for r in sd.results] == [r.token_ids for r in ar.results]


def test_compile_flag_reaches_load_model_and_the_cell_key():
    from dataclasses import replace

    from relaxspec.bench.cell import CellSpec, cell_config, model_options
    from relaxspec.cli.bench import config_from_args
    from relaxspec.cli import build_parser
    from relaxspec.tune.run import TuneConfig

    parser = build_parser()
    off = config_from_args(parser.parse_args(["bench"]))
    on = config_from_args(parser.parse_args(["bench", "--compile"]))
    assert (off.compile, on.compile) == (False, True)
    assert "compile" not in model_options(off) and model_options(on)["compile"] is True
    spec = CellSpec(verifier="verifier", drafter="drafter-weak", task="arithmetic", method="strict", params={},
                    draft_length=3, seed=0)
    versions = {"verifier": "v", "drafter-weak": "d", "code": "c"}
    assert "compile" not in cell_config(spec, off, versions)  # keys of runs without --compile are unchanged
    assert cell_config(spec, on, versions) == {**cell_config(spec, off, versions), "compile": True}
    assert replace(TuneConfig(), compile=True).bench_config(10).compile
    assert parser.parse_args(["generate", "--compile", "--prompt", "x"]).compile
    assert parser.parse_args(["tune", "--compile"]).compile


def test_cache_buffers_are_pooled_per_shape_but_never_shared_by_live_caches(tiny_pairs):
    # CUDA graphs read the cache in place: a later call must find the same buffers (same addresses).
    _, (vc, _) = tiny_pairs
    first = vc.new_cache()
    first.reserve(B, 40)
    address = first.kv[0].data_ptr()
    del first
    second = vc.new_cache()
    second.reserve(B, 40)
    assert second.kv[0].data_ptr() == address and second.capacity % 256 == 0
    third = vc.new_cache()  # while `second` lives: its own buffers
    third.reserve(B, 40)
    assert third.kv[0].data_ptr() != address and third.mask.data_ptr() != second.mask.data_ptr()


def test_compiled_keeps_every_weight_transposed_even_where_the_eager_path_packs_it_for_onednn():
    # Weights above the oneDNN threshold (SmolLM2's) are packed by the eager float32 path; the compiled step
    # multiplies W^T itself, so it must get a plain W^T for every linear (it read None before).
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=64, hidden_size=512, intermediate_size=1024, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    eager, compiled = FastLlama(model), CompiledLlama(model)
    from relaxspec.models.quant import Linear

    assert any(linear.t is None for layer in eager.layers for linear in layer if isinstance(linear, Linear))
    for w_in, qkv_t, o_t, w_post, gate_up_t, down_t in compiled.weights:
        for t in (qkv_t, o_t, gate_up_t, down_t):
            assert isinstance(t, torch.Tensor) and t.dtype == torch.float32
    for mine, theirs in zip(compiled.layers[0], eager.layers[0]):
        if isinstance(mine, Linear):
            x = torch.randn(3, mine.shape[1])
            torch.testing.assert_close(mine(x), theirs(x), rtol=1e-4, atol=1e-4)


def test_compile_with_a_non_float32_cpu_format_is_one_clear_error():
    with pytest.raises(ValueError, match="compile runs float32 weights on a CPU"):
        load_model("verifier", device="cpu", dtype="int4", compile=True)

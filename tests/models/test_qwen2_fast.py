"""Qwen2 (q/k/v biases, GQA, an untied or tied head, RoPE base from the config) through the lean FastLlama path,
against transformers' own Qwen2ForCausalLM, in every CPU weight format."""

import pytest
import torch

from relaxspec.engine import generate
from relaxspec.models.fast_llama import FastLlama
from relaxspec.models.hf import CausalLM
from relaxspec.models.quant import dequantize_int4, quantize_int4
from relaxspec.models.stream import Stream


def qwen2(tied: bool = False, seed: int = 0, layers: int = 2):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      rope_theta=1e6, tie_word_embeddings=tied)
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():  # biases are zero at init: make them matter
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def run(lm, ids, mask):
    s = Stream(lm)
    s.prefill(ids[:, :9], mask[:, :9])
    block, hidden = s.feed(ids[:, 9:14], torch.ones((2, 5), dtype=torch.long), hidden_layer=(0, -1))
    s.invalidate_tail(torch.tensor([1, 3]), 5)  # rows keep different numbers of slots
    one, _ = s.feed(ids[:, 14:15], torch.ones((2, 1), dtype=torch.long))
    return block, hidden, one


@pytest.mark.parametrize("tied", [False, True])
def test_qwen2_fast_path_matches_transformers_logits_and_hidden_states(tied):
    model = qwen2(tied)
    assert FastLlama.supports(model)
    ids = torch.randint(0, 512, (2, 15), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0  # a left-padded row
    slow = run(CausalLM("qwen2", model, None), ids, mask)
    fast = run(CausalLM("qwen2", model, None, FastLlama(model)), ids, mask)
    for a, b in zip(fast, slow):
        assert torch.allclose(a, b, atol=2e-4), (a - b).abs().max()


def test_qwen2_biases_are_applied_and_read_back():
    model = qwen2()
    fast = FastLlama(model)
    assert fast.qkv_bias[0] is not None and fast.qkv_bias[0].abs().sum() > 0
    before = {k: v.clone() for k, v in model.state_dict().items()}
    FastLlama.release_weights(model)
    lm = CausalLM("qwen2", model, None, fast)
    after = lm.state_dict()
    for name, t in before.items():
        assert torch.allclose(after[name], t, atol=1e-6), name


@pytest.mark.parametrize("fmt, atol", [("bfloat16", 0.05), ("int4", 0.05)])
def test_qwen2_formats_match_their_dequantized_weights(fmt, atol):
    # Each format multiplies by its own rounded weights: compare with transformers on exactly those weights.
    model = qwen2()
    fast = FastLlama(model, fmt)
    reference = qwen2()
    with torch.no_grad():
        for name, w in fast.linear_weights(head=True).items():
            reference.get_parameter(name).copy_(w)
    ids = torch.randint(0, 512, (2, 15), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    a = run(CausalLM("q", model, None, fast), ids, mask)
    b = run(CausalLM("q", reference, None), ids, mask)
    for x, y in zip(a, b):
        assert torch.allclose(x, y, atol=atol), (x - y).abs().max()
    if fmt == "int4":  # and the int4 copy is the quantized weight, not the float one
        w = model.model.layers[0].mlp.down_proj.weight
        assert torch.allclose(reference.model.layers[0].mlp.down_proj.weight,
                              dequantize_int4(*quantize_int4(w)), atol=1e-2)


def save_qwen2(path, model):
    """`model` and a byte-level tokenizer (no merges: one token per character) saved as a Hugging Face directory
    (transformers rebuilds a Qwen2 model's tokenizer as byte-level BPE from its vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    words = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate(sorted(alphabet))}}
    words.update({f"<x{i}>": i for i in range(len(words), model.config.vocab_size)})
    tok = Tokenizer(models.BPE(words, merges=[]))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    model.config.eos_token_id, model.config.pad_token_id = 1, 0
    model.save_pretrained(path)
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(path)
    return path


@pytest.mark.parametrize("fmt", ["float32", "int4"])
def test_qwen2_directory_runs_fast_and_strict_greedy_equals_ar_greedy(tmp_path, fmt):
    from relaxspec.models import load_model

    v = save_qwen2(tmp_path / "v", qwen2(seed=0, layers=3))
    d = save_qwen2(tmp_path / "d", qwen2(seed=5, layers=1))
    verifier = load_model(v, dtype=fmt)
    assert verifier.backend == "fast" and verifier.weight_format == fmt
    prompts = ["def add(a, b):", "print('hello')", "for i in range(10): x += i"]
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=24, temperature=0.0,
                  chat_template="off")
    for drafter in (load_model(d, dtype=fmt), load_model(v, dtype=fmt)):
        strict = generate(verifier, drafter, prompts, method="strict", draft_length=3, max_new_tokens=24,
                          temperature=0.0, chat_template="off")
        assert [r.token_ids for r in strict.results] == [r.token_ids for r in ar.results]
    assert strict.stats.mean_acceptance_length > 2.0  # the verifier drafting for itself

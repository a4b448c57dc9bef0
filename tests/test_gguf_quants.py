"""GGUF files read tensor by tensor in their own quantization (models/gguf_weights.py): each quant type against
the `gguf` package's dequantization, the 4-bit types' codes kept exactly in int4, and a small Qwen2 file written
here loaded natively against transformers' own GGUF loader."""

import numpy as np
import pytest
import torch

from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize, quantize

from relaxspec.models import load_model
from relaxspec.models.gguf_weights import AFFINE, GGUFWeights, affine_dense, architecture, open_reader
from relaxspec.models.quant import quantize_int4

RNG = np.random.default_rng(0)
BLOCK_BYTES = {"Q4_K": 144, "Q6_K": 210}


def random_blocks(kind: str, rows: int, cols: int, scale: float = 2e-4, rng=RNG) -> np.ndarray:
    """Random bytes of a K-quant tensor [rows, cols] with valid, small float16 scales (the python `gguf` package
    quantizes no K-quant): weights of about the size of a trained model's (|w| ~ 0.05), so that a model made of them
    keeps its activations small."""
    size = BLOCK_BYTES[kind]
    blocks = rng.integers(0, 256, (rows, cols // 256, size), dtype=np.uint8)
    d = rng.uniform(0.5, 1.0, (rows, cols // 256)).astype(np.float16) * np.float16(scale)
    if kind == "Q4_K":  # d, dmin at the start
        blocks[..., 0:2] = d.view(np.uint8).reshape(rows, -1, 2)
        blocks[..., 2:4] = (d * np.float16(4)).view(np.uint8).reshape(rows, -1, 2)
    else:  # Q6_K: d at the end
        blocks[..., 208:210] = d.view(np.uint8).reshape(rows, -1, 2)
    return blocks.reshape(rows, -1)


def four_bit(kind: str, rows: int, cols: int) -> np.ndarray:
    if kind == "Q4_K":
        return random_blocks(kind, rows, cols)
    return quantize(RNG.standard_normal((rows, cols)).astype(np.float32) * 0.05, GGMLQuantizationType[kind])


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_0", "Q4_1"])
def test_four_bit_types_map_exactly_onto_the_int4_form(kind):
    data = four_bit(kind, 8, 512)
    reference = dequantize(data, GGMLQuantizationType[kind])
    codes, scale, zero = AFFINE[kind](data)
    assert codes.min() >= 0 and codes.max() <= 15 and codes.shape == reference.shape
    assert np.array_equal(affine_dense(codes, scale, zero), reference)  # the file's own values, exactly


def add_byte_tokenizer(w: GGUFWriter, pre: str, reserved: int = 0) -> int:
    """A byte-level BPE tokenizer (one merge) written into `w`'s fields, with `reserved` control tokens after its
    own (a vocabulary of any size, read in a moment where a real model's 49k tokens and merges take seconds); its
    vocabulary size."""
    from tokenizers import pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|endoftext|>", "<|im_end|>", *alphabet, "ab", *(f"<|reserved_{i}|>" for i in range(reserved))]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3, 3] + [1] * (len(tokens) - 2 - reserved) + [3] * reserved)
    w.add_token_merges(["a b"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    w.add_pad_token_id(0)
    return len(tokens)


def write_qwen2(path, kinds: dict, layers: int = 2, hidden: int = 256, ffn: int = 512, heads: int = 4,
                kv_heads: int = 2, seed: int = 0, chat_template: str | None = None):
    """A small Qwen2 GGUF file (random weights in the given quant types, a byte-level tokenizer, optionally a chat
    template) at `path`; the same file for the same arguments, whichever tests ran before."""
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen2")
    w.add_context_length(512)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    vocab = add_byte_tokenizer(w, "qwen2")
    if chat_template is not None:
        w.add_chat_template(chat_template)

    def matrix(name, rows, cols, kind):
        if kind in BLOCK_BYTES:
            w.add_tensor(name, random_blocks(kind, rows, cols, rng=rng), raw_dtype=GGMLQuantizationType[kind])
        elif kind == "F32":
            w.add_tensor(name, rng.standard_normal((rows, cols)).astype(np.float32) * 0.05)
        else:
            w.add_tensor(name, quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.05,
                                        GGMLQuantizationType[kind]), raw_dtype=GGMLQuantizationType[kind])

    def vector(name, n, value=None):
        w.add_tensor(name, (np.full(n, value, np.float32) if value is not None
                            else rng.standard_normal(n).astype(np.float32) * 0.3))

    d, kv = hidden // heads, kv_heads * hidden // heads
    matrix("token_embd.weight", vocab, hidden, kinds.get("embed", "Q4_K"))
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden, 1.0)
        matrix(f"blk.{i}.attn_q.weight", heads * d, hidden, kinds.get("q", "Q4_K"))
        vector(f"blk.{i}.attn_q.bias", heads * d)
        matrix(f"blk.{i}.attn_k.weight", kv, hidden, kinds.get("k", "Q4_K"))
        vector(f"blk.{i}.attn_k.bias", kv)
        matrix(f"blk.{i}.attn_v.weight", kv, hidden, kinds.get("v", "Q8_0"))
        vector(f"blk.{i}.attn_v.bias", kv)
        matrix(f"blk.{i}.attn_output.weight", hidden, heads * d, kinds.get("o", "Q4_0"))
        vector(f"blk.{i}.ffn_norm.weight", hidden, 1.0)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden, kinds.get("gate", "Q4_K"))
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden, kinds.get("up", "Q4_1"))
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn, kinds.get("down", "Q5_0"))
    vector("output_norm.weight", hidden, 1.0)
    if kinds.get("head", "Q6_K") is not None:
        matrix("output.weight", vocab, hidden, kinds.get("head", "Q6_K"))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def qwen2_file(tmp_path_factory):
    return write_qwen2(tmp_path_factory.mktemp("gguf") / "tiny-qwen2.gguf", {})


def logits_of(lm, text="def ab(x): return x"):
    ids = torch.tensor([lm.tokenizer(text)["input_ids"]])
    out, _ = lm.forward(ids, lm.new_cache(), None, torch.arange(ids.shape[1])[None])
    return out


def test_native_float32_load_matches_transformers_gguf_loader(qwen2_file):
    assert architecture(qwen2_file) == "qwen2"
    native = load_model(qwen2_file, dtype="float32")
    slow = load_model(qwen2_file, dtype="float32", backend="transformers")
    assert native.backend == "fast" and native.model.lm_head.weight.numel() == 0  # one copy: FastLlama's
    assert native.vocab_size == slow.vocab_size and native.num_layers == slow.num_layers
    a, b = logits_of(native), logits_of(slow)
    assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()
    state, reference = native.state_dict(), slow.model.state_dict()
    for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.bias", "lm_head.weight"):
        assert torch.allclose(state[name], reference[name], atol=1e-5), name


def test_int4_keeps_the_files_codes_and_requantizes_the_rest(qwen2_file, capsys):
    source = GGUFWeights(qwen2_file, open_reader(qwen2_file), "int4")
    gate = source("model.layers.0.mlp.gate_proj.weight")  # Q4_K: the file's codes
    reader = open_reader(qwen2_file)
    raw = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate.weight")
    codes, _, _ = AFFINE["Q4_K"](np.asarray(raw.data))
    assert np.array_equal(gate.codes.numpy(), codes)
    down = source("model.layers.0.mlp.down_proj.weight")  # Q5_0: re-quantized
    assert down.codes.max() <= 15 and source.converted == {"Q5_0": 1}
    int4 = load_model(qwen2_file, dtype="int4")
    assert int4.weight_format == "int4"
    assert "re-quantized to int4" in capsys.readouterr().err
    # int4 computes with the weights it holds (read back dequantized): transformers on those weights agrees
    reference = load_model(qwen2_file, dtype="float32", backend="transformers")
    with torch.no_grad():
        for name, weight in int4.state_dict().items():
            reference.model.get_parameter(name).copy_(weight)
    a, b = logits_of(int4), logits_of(reference)
    # the kernels round every linear's input (bfloat16 on aten's and the bf16 path; int8 per group of 32 on the VNNI
    # path, up to max|x| / 254 an input, as llama.cpp's Q8_0): measured 0.8 % (aten) and 1.2 % (VNNI) of the largest
    # logit through this seeded model, 0.8-1.6 % over seeds 0-4
    from relaxspec.models import int4_block
    tol = 0.025 if int4_block.path() == "vnni" else 0.02
    assert (a - b).abs().max() < tol * b.abs().max(), (a - b).abs().max()


def test_auto_keeps_four_bit_in_int4_and_the_rest_in_bfloat16(qwen2_file, capsys):
    lm = load_model(qwen2_file, dtype="auto")
    assert lm.weight_format == "auto"
    qkv, o, gate_up, down = (lm.fast.layers[0][i] for i in (1, 2, 4, 5))
    assert o.format == "int4" and gate_up.format == "int4"  # Q4_0; Q4_K and Q4_1 stacked
    assert qkv.format == "bfloat16" and down.format == "bfloat16"  # q, k Q4_K with v Q8_0; Q5_0
    assert "kept in bfloat16" in capsys.readouterr().err


def test_a_file_truncated_mid_tensor_is_one_line(qwen2_file, tmp_path):
    cut = tmp_path / "cut.gguf"
    data = qwen2_file.read_bytes()
    cut.write_bytes(data[:len(data) - 5000])
    with pytest.raises(ValueError, match="truncated or corrupt") as error:
        load_model(cut, dtype="int4")
    assert "\n" not in str(error.value)


def test_gguf_weights_float_formats_match_the_packages_dequantization(qwen2_file):
    reader = open_reader(qwen2_file)
    raw = {t.name: t for t in reader.tensors}
    for fmt, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        source = GGUFWeights(qwen2_file, reader, fmt)
        for hf, name in (("lm_head.weight", "output.weight"), ("model.layers.0.mlp.down_proj.weight",
                                                                "blk.0.ffn_down.weight"),
                         ("model.layers.1.self_attn.v_proj.weight", "blk.1.attn_v.weight")):
            t = raw[name]
            reference = torch.from_numpy(dequantize(np.asarray(t.data), t.tensor_type)).to(dtype)
            assert torch.equal(source(hf), reference), (fmt, hf)


# (transformers name, file name, type) of every tensor type the fixture file holds
TYPES = [("model.layers.0.mlp.gate_proj.weight", "blk.0.ffn_gate.weight", "Q4_K"),
         ("model.layers.0.self_attn.o_proj.weight", "blk.0.attn_output.weight", "Q4_0"),
         ("model.layers.0.mlp.up_proj.weight", "blk.0.ffn_up.weight", "Q4_1"),
         ("model.layers.0.mlp.down_proj.weight", "blk.0.ffn_down.weight", "Q5_0"),
         ("model.layers.0.self_attn.v_proj.weight", "blk.0.attn_v.weight", "Q8_0"),
         ("lm_head.weight", "output.weight", "Q6_K")]


@pytest.mark.parametrize("fmt", ["int4", "auto"])
@pytest.mark.parametrize("hf, name, kind", TYPES)
def test_each_quant_type_in_int4_and_auto_follows_the_documented_policy(qwen2_file, fmt, hf, name, kind):
    reader = open_reader(qwen2_file)
    raw = next(t for t in reader.tensors if t.name == name)
    assert raw.tensor_type.name == kind
    reference = dequantize(np.asarray(raw.data), raw.tensor_type)  # the gguf package's own values
    got = GGUFWeights(qwen2_file, reader, fmt)(hf)
    if kind in AFFINE:  # the file's codes; its values up to bfloat16's rounding of each group's scale and zero
        codes, scale, zero = AFFINE[kind](np.asarray(raw.data))
        assert np.array_equal(got.codes.numpy(), codes)
        rounded = affine_dense(codes, torch.from_numpy(scale).bfloat16().float().numpy(),
                               torch.from_numpy(zero).bfloat16().float().numpy())
        assert torch.equal(got.dense(), torch.from_numpy(rounded))
        bound = 2 ** -8 * (8 * np.abs(scale) + np.abs(zero))  # bfloat16: a relative 2^-9 on each of scale, zero
        error = np.abs(rounded - reference).reshape(*scale.shape, -1).max(axis=-1)
        assert (error <= bound + 1e-12).all()
    elif fmt == "int4":  # 5-, 6- and 8-bit: re-quantized min-max from the file's dequantized values
        codes, scale_zero = quantize_int4(torch.from_numpy(reference))
        assert torch.equal(got.codes, codes) and torch.equal(got.scale_zero, scale_zero)
    else:  # auto: those in bfloat16
        assert got.dtype == torch.bfloat16 and torch.equal(got, torch.from_numpy(reference).bfloat16())


def test_a_tied_head_file_loads_natively_and_strict_greedy_equals_ar_greedy(qwen2_file, tmp_path):
    """No output.weight (the 0.5B's layout: the head is the embedding, here Q8_0): each format loads natively with
    transformers' properties; float32 against transformers' loader; an int4 pair of files decodes greedy alike."""
    from relaxspec.engine import generate

    tied = write_qwen2(tmp_path / "tied.gguf", {"head": None, "embed": "Q8_0"}, layers=1)
    slow = load_model(tied, dtype="float32", backend="transformers")
    for fmt in ("float32", "bfloat16", "int4", "auto"):
        lm = load_model(tied, dtype=fmt)
        assert lm.backend == "fast" and lm.model.config.tie_word_embeddings
        assert (lm.vocab_size, lm.num_parameters(), lm.device.type) == (slow.vocab_size, slow.num_parameters(), "cpu")
        assert sorted(lm.state_dict()) == sorted(slow.model.state_dict())
        if fmt == "float32":
            a, b = logits_of(lm), logits_of(slow)
            assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()
    verifier, drafter = load_model(qwen2_file, dtype="int4"), load_model(tied, dtype="int4")
    prompts = ["def ab(x):", "print(ab)"]
    ar = generate(verifier, None, prompts, method="ar", max_new_tokens=16, temperature=0.0, chat_template="off")
    strict = generate(verifier, drafter, prompts, method="strict", draft_length=3, max_new_tokens=16,
                      temperature=0.0, chat_template="off")
    assert [r.token_ids for r in strict.results] == [r.token_ids for r in ar.results]
    assert min(len(r.token_ids) for r in ar.results) > 4, [r.token_ids for r in ar.results]

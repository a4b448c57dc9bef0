import torch

from relaxspec.models.stream import Stream
from relaxspec.models import load_model
from relaxspec.tasks import synthetic


def test_fast_path_matches_transformers_logits_and_hidden_states_with_holes():
    fast, slow = load_model("verifier"), load_model("verifier", backend="transformers")
    assert fast.backend == "fast" and slow.backend == "transformers"
    prompts = [e.prompt for e in synthetic.examples("arithmetic", "test", 2)]
    ids = [torch.tensor(fast.tokenizer(p)["input_ids"]) for p in prompts]
    width = max(map(len, ids))
    batch = torch.zeros((2, width), dtype=torch.long)
    mask = torch.zeros((2, width), dtype=torch.long)
    for i, row in enumerate(ids):  # left padding: a ragged batch
        batch[i, width - len(row):], mask[i, width - len(row):] = row, 1
    outs = []
    for lm in (fast, slow):
        s = Stream(lm)
        s.prefill(batch[:, :-4], mask[:, :-4])
        s.feed(batch[:, -4:], torch.ones((2, 4), dtype=torch.long))
        s.invalidate_tail(torch.tensor([1, 3]), 4)  # rows keep different numbers of slots: holes
        logits, hidden = s.feed(batch[:, -2:], torch.ones((2, 2), dtype=torch.long), hidden_layer=-1)
        _, mid = s.feed(batch[:, -1:], torch.ones((2, 1), dtype=torch.long), hidden_layer=3)
        outs.append((logits, hidden, mid))
    for a, b in zip(*outs):
        assert torch.allclose(a, b, atol=2e-4), (a - b).abs().max()


def test_fast_path_accepts_positions_beyond_the_cache_length():
    # The RoPE table grows with the cache; position ids a caller offsets past it must still match.
    fast, slow = load_model("verifier"), load_model("verifier", backend="transformers")
    ids = torch.tensor([fast.tokenizer("Compute 12 + 7.")["input_ids"]])
    positions = torch.arange(ids.shape[1])[None] + 1000
    mask = torch.ones_like(ids)
    a, _ = fast.forward(ids, fast.new_cache(), mask, positions)
    b, _ = slow.forward(ids, slow.new_cache(), mask, positions)
    assert torch.allclose(a, b, atol=2e-4), (a - b).abs().max()


def test_blocks_of_large_weights_go_through_onednn_and_match_transformers():
    # Weights >= ONEDNN_MIN_ELEMENTS are stored once, reordered for oneDNN (one row and blocks), smaller ones
    # once as W^T for sgemm.
    from transformers import LlamaConfig, LlamaForCausalLM

    from relaxspec.models.fast_llama import FastLlama
    from relaxspec.models.hf import CausalLM
    from relaxspec.models.quant import ONEDNN_MIN_ELEMENTS

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    fast = FastLlama(model)
    assert fast.lm_head.packed is not None and fast.layers[0][4].packed is not None  # lm head, gate/up
    assert fast.lm_head.t is None and fast.layers[0][4].t is None  # one copy each
    assert fast.layers[0][2].packed is None and 384 * 384 < ONEDNN_MIN_ELEMENTS  # o_proj: below the cut
    ids = torch.randint(0, 1024, (2, 20))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    outs = []
    for lm in (CausalLM("big", model, None, fast), CausalLM("big", model, None)):
        s = Stream(lm)
        s.prefill(ids[:, :13], mask[:, :13])  # 26 rows
        block, _ = s.feed(ids[:, 13:19], torch.ones((2, 6), dtype=torch.long))  # 12 rows: a verify block
        one, _ = s.feed(ids[:, 19:], torch.ones((2, 1), dtype=torch.long))  # 2 rows
        single, _ = lm.forward(ids[:1, :1], lm.new_cache(), mask[:1, :1], torch.zeros((1, 1), dtype=torch.long))
        outs.append((block, one, single))
    for a, b in zip(*outs):
        assert torch.allclose(a, b, atol=2e-4), (a - b).abs().max()


def test_native_kernels_and_torch_ops_give_the_same_logits():
    # FastLlama on a CPU runs RMSNorm, RoPE with the cache write, and attention as native calls (f32_kernels); the
    # torch ops serve everywhere else. Same inputs (a ragged batch, holes, a block, single steps, GQA): the same
    # logits, cache and hidden states within float32 rounding of the reordered sums.
    from transformers import LlamaConfig, LlamaForCausalLM

    from relaxspec.models import f32_kernels
    from relaxspec.models.fast_llama import FastLlama
    from relaxspec.models.hf import CausalLM

    from relaxspec import native
    if native.compiler() is None or not native.enabled():  # (where one can be built, a failed build fails here)
        import pytest
        pytest.skip("no C compiler, or RELAXSPEC_NATIVE=0")
    assert f32_kernels.library() is not None
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=300, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    native, plain = FastLlama(model), FastLlama(model)
    plain._native = None
    assert native._native is not None
    ids = torch.randint(0, 300, (2, 14))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding
    outs = []
    for fast in (native, plain):
        s = Stream(CausalLM("m", model, None, fast))
        s.prefill(ids[:, :8], mask[:, :8])
        s.feed(ids[:, 8:12])
        s.invalidate_tail(torch.tensor([2, 4]), 4)  # holes
        a, h = s.feed(ids[:, 12:13], hidden_layer=(0, 1))
        b, _ = s.feed(ids[:, 13:14])
        outs.append((a, h, b, s.cache.kv[1][:, :, :s.length].clone()))
    for x, y in zip(*outs):
        assert (x - y).abs().max() < 1e-4, (x - y).abs().max()


def test_a_stream_without_masked_slots_tells_the_model_so_and_gets_the_same_logits():
    # Stream.dense: no slot in use is masked, so the model gets attention_mask None (no mask read, no host look
    # at it per step); a padded prompt or a per-row rollback turns it off. Same logits as with the mask spelled out.
    lm = load_model("verifier")
    ids = torch.tensor([lm.tokenizer("Compute 12 + 7 and then 3 * 4.")["input_ids"]])
    s = Stream(lm)
    s.prefill(ids[:, :-4], torch.ones_like(ids[:, :-4]))
    assert s.dense
    s.feed(ids[:, -4:-1])
    s.invalidate_tail(None, 3, longest=1)  # a lone row keeps one slot of three: a crop, no hole
    assert s.dense and s.length == ids.shape[1] - 3
    got, _ = s.feed(ids[:, -1:])
    ref = Stream(lm)
    ref.prefill(ids[:, :-4], torch.ones_like(ids[:, :-4]))
    ref._ones_from = ref.length  # spell the mask out (its columns from there on hold 1, as they do)
    ref.feed(ids[:, -4:-1])
    ref.invalidate_tail(None, 3, longest=1)
    ref._ones_from = ref.length
    assert not ref.dense
    want, _ = ref.feed(ids[:, -1:])
    assert torch.allclose(got, want, atol=1e-6)
    padded = Stream(lm)
    padded.prefill(torch.cat([ids, ids], 0)[:, :-2], torch.tensor([[0] + [1] * (ids.shape[1] - 3)] * 2))
    assert not padded.dense
    two = Stream(lm)
    two.prefill(torch.cat([ids, ids], 0)[:, :-4], torch.ones((2, ids.shape[1] - 4), dtype=torch.long))
    two.feed(torch.cat([ids, ids], 0)[:, -4:-1])
    two.invalidate_tail(torch.tensor([1, 3]), 3, longest=3)  # rows keep different numbers: holes
    assert not two.dense


def _count_head_rows(lm, monkeypatch) -> list:
    """The rows the LM head is applied to from now on, one entry per call (fast path: its Linear; transformers: a
    forward hook on its lm_head)."""
    from relaxspec.models.quant import Linear

    rows = []
    if lm.fast is None:
        lm.model.lm_head.register_forward_hook(lambda module, args, out: rows.append(args[0].shape[1]))
        return rows
    call = Linear.__call__

    def counted(self, x, residual=None):
        if self is lm.fast.lm_head:
            rows.append(x.shape[0])
        return call(self, x, residual)
    monkeypatch.setattr(Linear, "__call__", counted)
    return rows


def test_a_prefill_skips_the_lm_head_and_leaves_the_same_cache_and_hidden_states(monkeypatch):
    # Nobody reads a prefill's logits: the fast path skips its LM head, transformers computes the last position's
    # only (logits_to_keep); the cache, the hidden states and every later step are those of a prefill with logits.
    for backend in ("fast", "transformers"):
        lm = load_model("verifier", backend=backend)
        ids = torch.tensor([lm.tokenizer("Compute 12 + 7 and then 3 * 4.")["input_ids"]])
        mask, positions, T = torch.ones_like(ids), torch.arange(ids.shape[1])[None], ids.shape[1] - 1
        head_rows = _count_head_rows(lm, monkeypatch)
        outs = []
        for logits in (True, False):
            cache = lm.new_cache()
            head_rows.clear()
            z, hidden = lm.forward(ids[:, :-1], cache, mask[:, :-1], positions[:, :-1], hidden_layer=(1, -1),
                                   logits=logits)
            assert (z is None) == (not logits)
            assert head_rows == ([T] if logits else [] if backend == "fast" else [1])
            step, _ = lm.forward(ids[:, -1:], cache, None, positions[:, -1:])
            outs.append((hidden, step))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
        monkeypatch.undo()
    lm = load_model("verifier")  # a Stream's prefill asks for none
    head_rows = _count_head_rows(lm, monkeypatch)
    s = Stream(lm)
    assert s.prefill(ids[:, :-1], mask[:, :-1], hidden_layer=-1).shape[:2] == (1, T)
    assert head_rows == []
    assert s.feed(ids[:, -1:])[0].shape == (1, 1, lm.vocab_size) and head_rows == [1]

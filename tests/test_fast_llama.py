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
    # Weights >= _ONEDNN_MIN_ELEMENTS take oneDNN (reordered copy) for several rows, sgemm for one row.
    from transformers import LlamaConfig, LlamaForCausalLM

    from relaxspec.models.fast_llama import _ONEDNN_MIN_ELEMENTS, FastLlama
    from relaxspec.models.hf import CausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=1024, hidden_size=384, intermediate_size=1024, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    fast = FastLlama(model)
    assert fast.lm_head.packed is not None and fast.layers[0][4].packed is not None  # lm head, gate/up
    assert fast.layers[0][2].packed is None and 384 * 384 < _ONEDNN_MIN_ELEMENTS  # o_proj: below the cut
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

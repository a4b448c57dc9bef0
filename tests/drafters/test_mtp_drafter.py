"""The MTP drafter's inference path (drafters/mtp.py: `HeadLayers`, FastLlama's layer step, fed by a `Stream`)
against the head's own forward (`MTPHead.forward`, the training path) recomputed from scratch, row by row; and
that a round allocates nothing that grows with the context and reads nothing back from the device."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from relaxspec.drafters import load_drafter
from relaxspec.drafters.mtp import head_rows, verifier_weights
from helpers import task_prompts, verifier_prefix_hidden

# Logits of the lean path against the head's forward from scratch: both float32, different kernels and orders of
# summation; |logits| <= ~25 (about 2e-6 per float32 ulp). Measured: <= 2e-5. A wrong position, a missing or extra
# entry or a stale slot moves them by 1e-2 or more.
ATOL = 1e-4


def _forced(tokens):
    """A sampler proposing `tokens` [rounds * steps] in turn, the same in every row (greedy: no probabilities)."""
    it = iter(tokens.tolist())
    return lambda logits, i: (torch.full((logits.shape[0],), next(it), dtype=torch.long), None)


def _reference(drafter, verifier, entries):
    """(output feature, logits) of the last of one row's entries [(feature [H], token)]: the head's forward over
    all of them, from scratch."""
    head = drafter.head
    embed, lm_head = verifier_weights(verifier)
    features = torch.stack([f for f, _ in entries])[None]
    tokens = torch.tensor([[t for _, t in entries]])
    T = tokens.shape[1]
    out, _ = head(head.entries(features, embed[tokens]), torch.ones((1, T), dtype=torch.long), torch.arange(T)[None])
    return out[0, -1], out[0, -1] @ head_rows(head, lm_head).t()


@pytest.mark.parametrize("longest, native, slack", [(True, True, None), (False, True, None), (True, False, None),
                                                    (True, True, 2)])
def test_rounds_on_a_ragged_batch_equal_the_heads_forward_row_by_row(builtin_pair, longest, native, slack):
    """Three left-padded prompts, four rounds with ragged acceptance (none, some, all), the bonus row once, a row
    leaving the batch: every proposed row of logits equals the head's forward over that row's entries alone
    (the accepted drafts' entries with the verifier's features, the round's guesses with the head's own). With
    `longest` from the host or not; through the native kernels or torch's ops (native=False: the path off a CPU);
    with the stream's dead slots compacted away every few slots (slack 2)."""
    verifier, _ = builtin_pair
    drafter = load_drafter("drafter-mtp", verifier)
    if not native:
        drafter.fast._native = None
    rows = [verifier.tokenizer(p)["input_ids"] for p in task_prompts(2) + task_prompts(1, "sorting")]
    rows[1] = rows[1][:9]  # a short one: more padding
    ids, mask, hidden = verifier_prefix_hidden(verifier, [r[:-1] for r in rows])
    drafter.prefill(ids, mask, hidden)
    if slack is not None:
        drafter.stream.slack = slack
    # per row (by its original index): the entries in the drafter's cache, and those still to feed
    committed, pending = {}, {}
    for b, r in enumerate(rows):
        h = hidden[b, mask[b].bool()]
        committed[b] = [(h[k - 1], r[k]) for k in range(1, len(r) - 1)]
        pending[b] = [(h[-1], None)]
    live = [0, 1, 2]
    gen = torch.Generator().manual_seed(0)
    last = torch.tensor([r[-1] for r in rows])
    rounds = [(3, 0, [0, 2, 3]), (4, 1, [4, 0, 1]), (2, 0, [1, 2]), (5, 0, [5, 3])]  # (n, extra, accepted)
    for rnd, (n, extra, accepted) in enumerate(rounds):
        drafts = torch.randint(5, verifier.vocab_size, (n,), generator=gen)
        proposal = drafter.propose(last, n, extra, _forced(drafts))
        assert proposal.tokens.tolist() == [drafts.tolist()] * len(live)
        assert proposal.logits.shape == (len(live), n + extra, verifier.vocab_size)
        block = torch.randn((len(live), n + 1, hidden.shape[-1]), generator=gen)  # the verifier's features of the block
        for j, b in enumerate(live):
            entries = committed[b] + [(f, int(last[j]) if t is None else t) for f, t in pending[b]]
            for i in range(n + extra):
                if i:  # a guess: the head's own output feature of the entry before
                    entries = entries + [(feature, int(drafts[i - 1]))]
                feature, want = _reference(drafter, verifier, entries)
                got = proposal.logits[j, i]
                assert torch.allclose(got, want, atol=ATOL), (rnd, b, i, (got - want).abs().max())
            committed[b] += [(f, int(last[j]) if t is None else t) for f, t in pending[b]]
            a = accepted[j]
            pending[b] = [(block[j, e], int(drafts[e])) for e in range(a)] + [(block[j, a], None)]
        acc = torch.tensor(accepted)
        drafter.rollback(acc, block, longest=int(acc.max()) if longest else None)
        last = torch.randint(5, verifier.vocab_size, (len(live),), generator=gen)
        if rnd == 1:  # row 1 leaves the batch
            keep = torch.tensor([0, 2])
            drafter.select(keep)
            live, last = [0, 2], last[keep]
    assert (drafter.stream.compactions > 0) == (slack is not None)


def test_a_batch_proposes_what_each_row_proposes_alone(builtin_pair):
    """Ragged prompts and acceptance, through the engine's calls (longest from the host): the batch's drafts and
    logits equal each row's run alone (a batch of one: no mask, the one-row rollback)."""
    verifier, _ = builtin_pair
    rows = [verifier.tokenizer(p)["input_ids"] for p in task_prompts(2) + task_prompts(2, "sorting")]
    accepted = [[0, 3, 1, 3], [2, 0, 3, 1], [3, 3, 0, 2]]

    def run(batch):
        drafter = load_drafter("drafter-mtp", verifier)
        ids, mask, hidden = verifier_prefix_hidden(verifier, [rows[b][:-1] for b in batch])
        drafter.prefill(ids, mask, hidden)
        last = torch.tensor([rows[b][-1] for b in batch])
        gen = torch.Generator().manual_seed(1)
        out = []
        for rnd, acc in enumerate(accepted):
            proposal = drafter.propose(last, 3, 0, lambda logits, i: (logits.argmax(-1), None))
            block = torch.randn((4, 4, hidden.shape[-1]), generator=gen)[batch]
            nxt = torch.randint(5, verifier.vocab_size, (4,), generator=gen)[batch]
            a = torch.tensor(acc)[batch]
            drafter.rollback(a, block, longest=int(a.max()))
            out.append(proposal)
            last = nxt
        return out

    together = run(list(range(4)))
    for b in range(4):
        alone = run([b])
        for rnd, (t, s) in enumerate(zip(together, alone)):
            assert t.tokens[b].tolist() == s.tokens[0].tolist(), (b, rnd)
            assert torch.allclose(t.logits[b], s.logits[0], atol=1e-5), (b, rnd, (t.logits[b] - s.logits[0]).abs().max())


class _Allocations(TorchDispatchMode):
    """Records every tensor an op allocates (an output sharing no storage with its inputs: not a view, not in
    place) and every read of a tensor's value on the host (aten._local_scalar_dense: item(), int(), bool())."""

    def __init__(self):
        super().__init__()
        self.sizes, self.reads = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads += 1
        inputs = {_storage(t) for t in tree_leaves((args, kwargs))}
        self.sizes += [(str(func), t.numel()) for t in tree_leaves(out) if _storage(t) not in inputs]
        return out


def _storage(t):
    """Where a tensor's data starts (None: not a tensor, or oneDNN's opaque packed weight, never an output)."""
    return t.untyped_storage().data_ptr() if isinstance(t, torch.Tensor) and not t.is_mkldnn else None


@pytest.mark.parametrize("native", [True, False])
def test_a_round_allocates_nothing_that_grows_with_the_context_and_reads_nothing_back(builtin_pair, native):
    """Batch of one, as the engine runs it: a propose / rollback round at a context of 48 entries and at one of
    480 allocates the same tensors (the KV and mask buffers are written in place: their storage stays put), and
    reads no value back to the host (`longest` comes from the engine's host copy). Both the native kernels and
    torch's ops (native=False)."""
    verifier, _ = builtin_pair
    H = verifier.model.config.hidden_size
    gen = torch.Generator().manual_seed(2)
    largest = []
    for context in (48, 480):
        drafter = load_drafter("drafter-mtp", verifier)
        if not native:
            drafter.fast._native = None
        with torch.no_grad():  # every entry-table row made (on a CPU a row is made when its token first comes)
            drafter.fast._fill_rows(torch.arange(verifier.vocab_size))
        drafter.fast.filled[:] = True
        ids = torch.randint(5, verifier.vocab_size, (1, context), generator=gen)
        drafter.prefill(ids, torch.ones_like(ids), torch.randn((1, context, H), generator=gen))
        accepted = torch.tensor([2])

        def round_(record=None):
            last = torch.randint(5, verifier.vocab_size, (1,), generator=gen)
            block = torch.randn((1, 6, H), generator=gen)
            with record or _Allocations():
                drafter.propose(last, 5, 0, lambda logits, i: (logits.argmax(-1), None))
                drafter.rollback(accepted, block, longest=2)

        for _ in range(3):
            round_()  # buffers grown to the context
        buffers = [buf.data_ptr() for buf in drafter.stream.cache.kv] + [drafter.stream._mask.data_ptr()]
        for _ in range(3):
            record = _Allocations()
            round_(record)
            assert record.reads == 0
            assert record.sizes  # (the mode sees the ops)
        assert [buf.data_ptr() for buf in drafter.stream.cache.kv] + [drafter.stream._mask.data_ptr()] == buffers
        largest.append(max(size for _, size in record.sizes))
        if context == 480:
            assert sorted(size for _, size in record.sizes) == sorted(size for _, size in small)
        small = record.sizes
    # the largest: the MLP's gate and up of the round's first feed (3 entries: the 2 accepted drafts' and last's)
    assert largest[0] == largest[1] == 3 * 2 * drafter.head.cfg.ffn


def test_on_a_cpu_the_entry_table_is_made_row_by_row_as_tokens_first_need_it(builtin_pair):
    """A CPU head makes an entry-table row when a token first needs one (a 1.5B's whole table: 0.93 GB and 3.8 s):
    none at load, exactly the rows of the tokens fed after a prefill and a round, and each the row the whole table
    holds (made at once, as off a CPU), to float32 summation order."""
    verifier, _ = builtin_pair
    drafter = load_drafter("drafter-mtp", verifier)
    fast = drafter.fast
    assert fast.filled is not None and not fast.filled.any()
    rows = [verifier.tokenizer(p)["input_ids"] for p in task_prompts(2)]
    ids, mask, hidden = verifier_prefix_hidden(verifier, [r[:-1] for r in rows])
    drafter.prefill(ids, mask, hidden)
    last = torch.tensor([r[-1] for r in rows])
    drafts = torch.tensor([7, 11, 7])
    drafter.propose(last, 3, 0, _forced(drafts))
    seen = set(ids[:, 1:].flatten().tolist()) | set(last.tolist()) | {7, 11}  # (a padded slot's entry is made too)
    assert set(fast.filled.nonzero().flatten().tolist()) == seen
    lazy = fast.entry_table[fast.filled].clone()
    fast._fill_rows(torch.arange(fast.entry_table.shape[0]))
    # the same sums in another GEMM blocking (a slice of other rows): float32 summation order only (|x| <= ~5)
    assert torch.allclose(lazy, fast.entry_table[fast.filled], rtol=0, atol=1e-5)

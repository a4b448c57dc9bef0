"""Shared helpers for the acceptance tests (no tests here).

Monte Carlo tolerances come from the sample size: a category with probability
p seen n times passes if |freq - p| <= 5·sqrt(p(1-p)/n) + 1e-3.
"""

from __future__ import annotations

import pytest
import torch

from relaxspec.acceptance import process_logits, relaxed_targets, verify

SAMPLINGS = {
    "t1": dict(temperature=1.0, top_k=None, top_p=None),
    "t07_k5_p09": dict(temperature=0.7, top_k=5, top_p=0.9),
}


@pytest.fixture(autouse=True)
def single_thread():
    """One torch thread while an acceptance test runs, restored afterwards: these
    tests run many small ops, and on a shared 2-core machine thread hand-offs
    cost more than they save (about 5-10x here)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_block(seed: int, B: int, N: int, V: int, *, scale: float = 1.5, noise: float = 1.0,
                 bonus_draft: bool = False):
    """Verifier logits [B, N+1, V] and a correlated drafter [B, N(+1), V]."""
    g = torch.Generator().manual_seed(seed)
    target = scale * torch.randn(B, N + 1, V, generator=g)
    rows = N + 1 if bonus_draft else N
    draft = target[:, :rows] + noise * torch.randn(B, rows, V, generator=g)
    return target, draft


def sample_drafts(draft_logits: torch.Tensor, N: int, sampling: dict, seed: int) -> torch.Tensor:
    """Drafts x_i ~ q_i, independently per position (torch.multinomial, not the library)."""
    B, _, V = draft_logits.shape
    q = process_logits(draft_logits[:, :N], **sampling)
    g = torch.Generator().manual_seed(seed)
    return torch.multinomial(q.reshape(B * N, V), 1, generator=g).reshape(B, N)


def replicate(t: torch.Tensor, M: int) -> torch.Tensor:
    return t.unsqueeze(0).expand(M, *t.shape).contiguous()


def run_mc(method: str, target: torch.Tensor, draft: torch.Tensor, M: int, sampling: dict,
           seed: int = 0, **params):
    """verify on M copies of one block (target [N+1, V], draft [N(+1), V])."""
    N = target.shape[0] - 1
    t, d = replicate(target, M), replicate(draft, M)
    x = sample_drafts(d, N, sampling, seed)
    params = {k: (replicate(v, M) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    g = torch.Generator().manual_seed(seed + 1)
    return verify(method, t, d, x, generator=g, **sampling, **params)


def exact_first_law(method: str, target: torch.Tensor, draft: torch.Tensor, sampling: dict,
                    **params) -> torch.Tensor:
    """Law of the token emitted at position 1 implied by the rule's targets:
    sum_x q(x) [a(x)·1{v=x} + (1 - a(x))·r_x(v)], enumerating the draft x."""
    N, V = target.shape[0] - 1, target.shape[-1]
    t, d = replicate(target, V), replicate(draft, V)
    x = torch.zeros(V, N, dtype=torch.long)
    x[:, 0] = torch.arange(V)
    params = {k: (replicate(v, V) if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    tg = relaxed_targets(method, t.double(), d.double(), x, **sampling, **params)
    q = process_logits(draft[0].double(), **sampling)
    a = tg.accept_prob[:, 0]
    return q * a + (q * (1 - a)) @ tg.residual[:, 0]


def assert_law(samples: torch.Tensor, probs: torch.Tensor, what: str = "") -> None:
    samples = samples.reshape(-1)
    n = samples.numel()
    assert n > 1000, f"{what}: too few samples ({n})"
    V = probs.numel()
    assert int(samples.min()) >= 0 and int(samples.max()) < V, f"{what}: sample out of range"
    freq = torch.bincount(samples, minlength=V).double() / n
    probs = probs.double()
    tol = 5 * torch.sqrt(probs * (1 - probs) / n) + 1e-3
    err = (freq - probs).abs()
    assert bool((err <= tol).all()), (
        f"{what}: frequencies {freq.numpy().round(4)} vs probabilities {probs.numpy().round(4)} "
        f"(worst excess {float((err - tol).max()):.2e}, n={n})"
    )


__all__ = ["single_thread", "SAMPLINGS", "random_block", "sample_drafts", "replicate", "run_mc",
           "exact_first_law", "assert_law"]

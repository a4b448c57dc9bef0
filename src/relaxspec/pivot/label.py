"""Labelling pivot tokens by verifier roll-outs (PAD, Ziashahabi et al. 2025, section 2 of
../shared/reference/pad.md).

Per prompt of the task's "pivot" split (disjoint from "train" and "test"):

1. Baseline: the verifier samples k completions; prompts whose mean utility is
   below `min_baseline` (0.5) are skipped (the verifier mostly fails them, so
   roll-outs say nothing about a token).
2. Walk the verifier's greedy trajectory with the drafter's greedy proposal
   beside it. Each mismatch is a candidate (a token greedy strict SD rejects).
3. From prefix + drafter token and from prefix + verifier token the verifier
   samples k continuations each, as ONE batch of 2k rows. The prefix is not
   re-run: the trajectory's own KV cache (which already holds the prefix) is
   copied and expanded across the 2k rows (`_expand_cache`: selecting row 0
   2k times, which both transformers' DynamicCache and the FastLlama cache do).
   Utility = mean task utility of the k full responses.
4. Pivot rule (`is_pivot`): the drafter token is a pivot iff
       u_draft < alpha * u_verifier - margin.
   Default alpha = 1.0 and margin = 1/k (one roll-out out of k; 0.125 for
   k = 8): with k = 8 roll-outs per side, the standard error of a difference of
   two utilities near 0.8 is about 0.2, so a one-roll-out dip is mostly noise;
   the margin keeps such tokens negative while a real drop (an answer digit
   that flips the result moves u by far more) is still labelled pivot.
5. Continue the trajectory with the drafter's token if it is not a pivot, with
   the verifier's otherwise.

Gating (a deliberate saving, `min_prob`, default 1e-4 = the pad rule's own
default): a mismatch whose verifier probability p(x) is below `min_prob` is
never accepted by the pad rule whatever the classifier says, so it is not
rolled out: the walk takes the verifier's token and the mismatch is only
counted (`gated`). This spends the roll-out budget on the candidates the
classifier actually decides (with drafter-weak most mismatches are wrong digits
at p(x) ~ 1e-8). `min_prob=0` rolls out every mismatch, as the paper does.

Output: a per-run directory `<out>.shards/` with `meta.pt` (identity: model
names AND weight fingerprints, task, split, hidden_layer, k, alpha, margin, ...)
and one `prompt_XXXXX.pt` per prompt done, written atomically (so an interrupt
loses at most the prompt in flight, and a rerun with the same identity resumes;
a rerun with other settings or retrained weights is refused). At the end of
every run (also one stopped by `time_budget_s`, then `complete` is False) the
shards are merged into `out` (a torch.save'd dict, see `merge_shards`).
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Callable

import torch

from relaxspec.pivot.features import SCALAR_FEATURES, candidate_features

FORMAT = "relaxspec-pivot-labels/1"


def _expand_cache(cache, n: int, device: torch.device):
    """A copy of a batch-1 cache repeated to n rows; the original is left untouched."""
    rc = copy.deepcopy(cache)
    rc.batch_select_indices(torch.zeros(n, dtype=torch.long, device=device))
    return rc


def model_fingerprint(lm) -> str:
    """A short hash of a model's weights, so labels, resumes and classifiers can tell retrained
    weights apart from the ones they were made with (names alone cannot): a GGUF model's file
    (`gguf_fingerprint`), else its state dict's float32 values."""
    import hashlib

    from relaxspec.models.gguf import gguf_fingerprint

    from_file = gguf_fingerprint(lm)
    if from_file is not None:
        return from_file
    h = hashlib.sha256()
    for name, t in sorted(lm.state_dict().items()):  # (weights FastLlama holds read back from it, exactly)
        h.update(name.encode())
        h.update(t.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def is_pivot(u_draft: float, u_verifier: float, alpha: float = 1.0, margin: float = 0.125) -> bool:
    """The drafter token is a pivot iff accepting it lowers the utility by more than the tolerance:
    u_draft < alpha * u_verifier - margin."""
    return bool(u_draft < alpha * u_verifier - margin)


@torch.inference_mode()
def sample_continuations(lm, cache, logits: torch.Tensor, length: int, budget: int, temperature: float,
                         generator: torch.Generator) -> list[list[int]]:
    """Sample up to `budget` tokens per row from `logits` [R, V] (the distribution of the next token)
    onward, feeding each back through `lm` with `cache` (R rows, `length` tokens each, no padding).
    Each row's list stops before its EOS. The cache is consumed (extended in place)."""
    R = logits.shape[0]
    eos = lm.eos_token_id
    out: list[list[int]] = [[] for _ in range(R)]
    device = logits.device
    rows = torch.arange(R)  # live rows (original indices; bookkeeping on the host)
    for step in range(budget):
        if temperature > 0:
            probs = torch.softmax(logits.float() / temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        else:
            tok = logits.argmax(dim=-1)
        done = tok == eos if eos is not None else torch.zeros_like(tok, dtype=torch.bool)
        for r, t, d in zip(rows.tolist(), tok.tolist(), done.tolist()):
            if not d:
                out[r].append(t)
        if step == budget - 1:
            break
        if done.any():
            keep = (~done).nonzero().squeeze(1)
            if not len(keep):
                break
            cache.batch_select_indices(keep)
            rows, tok = rows[keep.cpu()], tok[keep]
        n = len(rows)
        logits, _ = lm.forward(tok[:, None], cache, torch.ones((n, length + 1), dtype=torch.long, device=device),
                               torch.full((n, 1), length, dtype=torch.long, device=device))
        logits = logits[:, -1]
        length += 1
    return out


@torch.inference_mode()
def rollout_utilities(verifier, cache, length: int, generated: list[int], candidates: list[int], k: int,
                      score: Callable[[str], float], budget: int, temperature: float, generator: torch.Generator,
                      hidden_layer: int | None = None):
    """Mean utility of k verifier continuations of prefix + [c] for each candidate token c, all in one
    batch of len(candidates) * k rows. `cache` holds the prefix (batch 1, `length` tokens; prompt +
    `generated`) and is left untouched: a copy is expanded across the rows.

    `score(response_text) -> float` scores a full response (generated + [c] + continuation).
    Returns (utilities [len(candidates)], hidden [len(candidates), H] at each candidate's position
    from layer `hidden_layer`, or None)."""
    C = len(candidates)
    device = verifier.device
    rc = _expand_cache(cache, C * k, device)
    first = torch.tensor(candidates, dtype=torch.long, device=device).repeat_interleave(k)[:, None]
    logits, hidden = verifier.forward(first, rc, torch.ones((C * k, length + 1), dtype=torch.long, device=device),
                                      torch.full((C * k, 1), length, dtype=torch.long, device=device),
                                      hidden_layer=hidden_layer)
    conts = sample_continuations(verifier, rc, logits[:, -1], length + 1, budget - 1, temperature, generator) \
        if budget > 1 else [[] for _ in range(C * k)]
    tok = verifier.tokenizer
    utils = []
    for c in range(C):
        # a candidate that IS the end of the response has no continuation (and a deterministic utility)
        ended = verifier.eos_token_id is not None and candidates[c] == verifier.eos_token_id
        vals = [score(tok.decode(generated + [candidates[c]] + ([] if ended else conts[c * k + j]),
                                 skip_special_tokens=True))
                for j in range(k)]
        utils.append(sum(vals) / k)
    h = hidden[::k, -1] if hidden is not None else None
    return utils, h


def _identity(verifier, drafter, task, hidden_layer, k, alpha, margin, temperature, max_new_tokens,
              min_baseline, seed, n_prompts, min_prob, chat_template, system):
    return dict(min_prob=min_prob, format=FORMAT, chat_template=chat_template, system=system, verifier=verifier.name,
                drafter=drafter.name, task=task.name, weight_format=getattr(verifier, "weight_format", None),
                verifier_fingerprint=model_fingerprint(verifier), drafter_fingerprint=model_fingerprint(drafter),
                split=task.meta.get("split"), hidden_layer=hidden_layer, hidden_size=verifier.model.config.hidden_size,
                k=k, alpha=alpha, margin=margin, temperature=temperature, max_new_tokens=max_new_tokens,
                min_baseline=min_baseline, seed=seed, feature_names=list(SCALAR_FEATURES))


@torch.inference_mode()
def label_prompt(verifier, drafter, prompt: str, reference: str, utility, *, k: int, alpha: float, margin: float,
                 temperature: float, max_new_tokens: int, hidden_layer: int, min_baseline: float,
                 generator: torch.Generator, min_prob: float = 0.0, chat_template: str = "auto",
                 system: str | None = None) -> dict:
    """Label one prompt (encoded as `encode_prompts` does): baseline, then the greedy walk with roll-outs at
    each mismatch. The generator lives on the verifier's device."""
    from relaxspec.models.prompts import encode_prompts

    ids = encode_prompts(verifier.tokenizer, [prompt], chat_template=chat_template, system=system)[0]
    device = verifier.device
    score = lambda text: float(utility(text, reference))  # noqa: E731
    L = len(ids)
    x = torch.tensor([ids], device=device)
    vc, dc = verifier.new_cache(), drafter.new_cache()
    mask, pos = torch.ones_like(x), torch.arange(L, device=device)[None]
    v_logits = verifier.forward(x, vc, mask, pos)[0][:, -1]
    d_logits = drafter.forward(x, dc, mask, pos)[0][:, -1]

    # 1. baseline: k sampled completions from the prompt.
    bc = _expand_cache(vc, k, device)
    conts = sample_continuations(verifier, bc, v_logits.expand(k, -1), L, max_new_tokens, temperature, generator)
    baseline = sum(score(verifier.tokenizer.decode(c, skip_special_tokens=True)) for c in conts) / k
    record = dict(baseline=baseline, skipped=baseline < min_baseline, hidden=[], scalars=[], labels=[], steps=[],
                  u_draft=[], u_verifier=[], draft_token=[], verifier_token=[], trajectory=[], final_utility=None,
                  gated=0)
    if record["skipped"]:
        return record

    # 2. the greedy walk.
    generated: list[int] = []
    eos = verifier.eos_token_id
    while len(generated) < max_new_tokens:
        v, d = int(v_logits.argmax(-1)), int(d_logits.argmax(-1))
        token = v
        if v != d and float(torch.softmax(v_logits[0].float(), -1)[d]) < min_prob:
            record["gated"] += 1  # the pad rule never accepts it: no roll-outs, take the verifier's token
        elif v != d:
            length = L + len(generated)
            budget = max_new_tokens - len(generated)
            (u_d, u_v), h = rollout_utilities(verifier, vc, length, generated, [d, v], k, score, budget,
                                              temperature, generator, hidden_layer=hidden_layer)
            pivot = is_pivot(u_d, u_v, alpha, margin)
            hid, sc = candidate_features(h[0], v_logits[0], d_logits[0], torch.tensor(d, device=device))
            record["hidden"].append(hid.half().cpu())
            record["scalars"].append(sc.cpu())
            record["labels"].append(int(pivot))
            record["steps"].append(len(generated))
            record["u_draft"].append(u_d)
            record["u_verifier"].append(u_v)
            record["draft_token"].append(d)
            record["verifier_token"].append(v)
            token = v if pivot else d
        if token == eos:
            break
        generated.append(token)
        t = torch.tensor([[token]], device=device)
        n = L + len(generated)
        m, p = torch.ones((1, n), dtype=torch.long, device=device), torch.tensor([[n - 1]], device=device)
        v_logits = verifier.forward(t, vc, m, p)[0][:, -1]
        d_logits = drafter.forward(t, dc, m, p)[0][:, -1]
    record["trajectory"] = generated
    record["final_utility"] = score(verifier.tokenizer.decode(generated, skip_special_tokens=True))
    return record


def _stack_record(rec: dict, hidden_size: int) -> dict:
    n = len(rec["labels"])
    out = dict(rec)
    out["hidden"] = torch.stack(rec["hidden"]) if n else torch.zeros((0, hidden_size), dtype=torch.float16)
    out["scalars"] = torch.stack(rec["scalars"]) if n else torch.zeros((0, len(SCALAR_FEATURES)))
    for key in ("labels", "steps", "draft_token", "verifier_token"):
        out[key] = torch.tensor(rec[key], dtype=torch.long)
    for key in ("u_draft", "u_verifier"):
        out[key] = torch.tensor(rec[key], dtype=torch.float32)
    return out


def merge_shards(shard_dir: str | Path) -> dict:
    """All prompt shards of a run, concatenated: a dict with the identity (`meta`), per-candidate
    tensors (`hidden` [M,H] float16, `scalars` [M,6], `labels` [M], `prompt_index` [M], `steps`,
    `u_draft`, `u_verifier`, `draft_token`, `verifier_token`) and per-prompt stats (`prompts`)."""
    shard_dir = Path(shard_dir)
    meta = torch.load(shard_dir / "meta.pt", weights_only=True)
    shards = sorted(shard_dir.glob("prompt_*.pt"))
    recs = [torch.load(s, weights_only=True) for s in shards]
    cat = lambda key: torch.cat([r[key] for r in recs]) if recs else torch.zeros(0)  # noqa: E731
    data = dict(meta=meta)
    for key in ("hidden", "scalars", "labels", "steps", "u_draft", "u_verifier", "draft_token", "verifier_token"):
        data[key] = cat(key)
    data["prompt_index"] = torch.cat([torch.full((len(r["labels"]),), r["prompt_index"], dtype=torch.long)
                                      for r in recs]) if recs else torch.zeros(0, dtype=torch.long)
    data["prompts"] = [dict(index=r["prompt_index"], baseline=r["baseline"], skipped=r["skipped"],
                            candidates=len(r["labels"]), pivots=int(r["labels"].sum()),
                            final_utility=r["final_utility"], gated=r.get("gated", 0), seconds=r.get("seconds"))
                       for r in recs]
    return data


def label_stats(data: dict) -> dict:
    prompts = data["prompts"]
    used = [p for p in prompts if not p["skipped"]]
    n = len(data["labels"])
    finals = [p["final_utility"] for p in used if p["final_utility"] is not None]
    return dict(prompts=len(prompts), skipped=len(prompts) - len(used), candidates=n,
                gated=sum(p.get("gated", 0) for p in prompts),
                pivots=int(data["labels"].sum()) if n else 0,
                pivot_rate=float(data["labels"].float().mean()) if n else float("nan"),
                mean_baseline=sum(p["baseline"] for p in prompts) / max(1, len(prompts)),
                trajectory_utility=sum(finals) / max(1, len(finals)),
                seconds=sum(p["seconds"] or 0.0 for p in prompts))


def label_pivots(verifier, drafter, task, n_prompts: int | None = None, k: int = 8, alpha: float = 1.0,
                 margin: float | None = None, temperature: float = 0.7, max_new_tokens: int = 160,
                 hidden_layer: int = -1, out: str | Path = "pivots.pt", seed: int = 0, min_baseline: float = 0.5,
                 min_prob: float = 1e-4, time_budget_s: float | None = None, progress: bool = True,
                 chat_template: str = "auto", system: str | None = None) -> dict:
    """Label pivot candidates on `task` (a Task; use split "pivot") and save them to `out`. Prompts are
    encoded as `relaxspec.models.prompts.encode_prompts(chat_template=, system=)` does.

    verifier/drafter are CausalLMs (or built-in names / paths). margin defaults to 1/k. Resumable:
    shards go to `<out>.shards/`; a rerun with the same identity skips the prompts already done.
    `time_budget_s` stops (cleanly, after the prompt in flight) once exceeded; a run labels at least one prompt.
    Returns the merged dict."""
    from tqdm.auto import tqdm

    from relaxspec.models import check_same_vocab, load_model
    from relaxspec.models.hf import hidden_blocks

    if isinstance(verifier, (str, Path)):
        verifier = load_model(verifier)
    if isinstance(drafter, (str, Path)):
        drafter = load_model(drafter)
    check_same_vocab(verifier, drafter)
    hidden_blocks(hidden_layer, verifier.num_layers)  # a block the verifier lacks: a ValueError before any work
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    if margin is None:
        margin = 1.0 / k
    split = task.meta.get("split")
    if split not in (None, "pivot"):
        raise ValueError(f"pivot labelling must use the task's 'pivot' split, got split {split!r}")
    examples = task.examples if n_prompts is None else task.examples[:n_prompts]
    if n_prompts is not None and len(examples) < n_prompts:
        raise ValueError(f"task has only {len(task.examples)} examples, {n_prompts} asked")

    out = Path(out)
    shard_dir = out.with_name(out.name + ".shards")
    shard_dir.mkdir(parents=True, exist_ok=True)
    ident = _identity(verifier, drafter, task, hidden_layer, k, alpha, margin, temperature, max_new_tokens,
                      min_baseline, seed, len(examples), min_prob, chat_template, system)
    meta_path = shard_dir / "meta.pt"
    if meta_path.exists():
        old = torch.load(meta_path, weights_only=True)
        if old != ident:
            diff = {key: (old.get(key), ident.get(key)) for key in ident if old.get(key) != ident.get(key)}
            raise ValueError(f"{shard_dir} holds a run with different settings {diff}; "
                             "use another --out or delete it")
    else:
        torch.save(ident, meta_path)

    t0 = time.perf_counter()
    todo = [i for i in range(len(examples)) if not (shard_dir / f"prompt_{i:05d}.pt").exists()]
    # The bar counts this run's prompts only (resumed ones are done before it starts), so its rate and time
    # left are this run's; the postfix also gives the budget left of this part (`time_budget_s`).
    bar = tqdm(todo, desc="label pivots", total=len(examples), initial=len(examples) - len(todo),
               disable=not progress, unit="prompt")
    stopped = False
    for n_done, i in enumerate(bar):
        shard = shard_dir / f"prompt_{i:05d}.pt"
        # (after at least one prompt: every part makes progress, however short its budget)
        if time_budget_s is not None and n_done and time.perf_counter() - t0 > time_budget_s:
            stopped = True
            break
        ex = examples[i]
        gen = torch.Generator(verifier.device).manual_seed(seed * 1_000_003 + i)  # per prompt: resumable, order-free
        ts = time.perf_counter()
        rec = label_prompt(verifier, drafter, ex.prompt, ex.reference, task.utility, k=k, alpha=alpha, margin=margin,
                           temperature=temperature, max_new_tokens=max_new_tokens, hidden_layer=hidden_layer,
                           min_baseline=min_baseline, generator=gen, min_prob=min_prob,
                           chat_template=chat_template, system=system)
        rec = _stack_record(rec, verifier.model.config.hidden_size)
        rec["prompt_index"] = i
        rec["seconds"] = time.perf_counter() - ts
        tmp = shard.with_suffix(".tmp")
        torch.save(rec, tmp)
        tmp.replace(shard)  # atomic: a shard is either complete or absent
        post = dict(cands=len(rec["labels"]), piv=int(rec["labels"].sum()), base=f"{rec['baseline']:.2f}")
        if time_budget_s is not None:
            post["budget_left"] = f"{max(0.0, time_budget_s - (time.perf_counter() - t0)) / 60:.0f}min"
        bar.set_postfix(post)
    data = merge_shards(shard_dir)
    data["complete"] = not stopped
    tmp = out.with_name(out.name + ".tmp")
    torch.save(data, tmp)
    tmp.replace(out)
    return data

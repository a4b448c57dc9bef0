"""Training an MTP drafter head (`relaxspec.drafters.mtp`) for a verifier.

Training (`relaxspec drafter train --kind mtp`): self-distillation. The verifier answers the
training prompts with relaxspec's own engine (sampled, T=0.7), one forward over each prompt +
answer gives its features, and the head learns the verifier's next-token distributions (KL from
softmax(f W^T) to the head's q) on whole sequences, in `unroll` passes: pass 1 feeds the verifier's
features (as right after a verify step), each later pass the head's own outputs of the previous
pass (as deeper into a round; a cheap form of EAGLE-3's training-time test). Checkpointed every 50
steps, resumable, batches a function of (seed, step). The data set is made in parts (one file per batch of answers
under `out/train_data.parts/`, written whole or not at all): an interrupted run resumes after its last finished batch
and makes the same data (a batch's draws depend on its own prompts only).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from relaxspec.drafters.mtp import (BUILTIN_HEADS, HeadConfig, MTPHead, head_rows, is_mtp, read_head, save_head,
                                   trained_for, verifier_fingerprint, verifier_weights)
from relaxspec.models.hf import CausalLM, hidden_blocks

CHECKPOINT, DATA, PARTS = "checkpoint.pt", "train_data.pt", "train_data.parts"


def answer_tokens(data: dict) -> torch.Tensor:
    """All answer tokens of self-distillation `data`, concatenated."""
    return torch.cat([t[start:] for t, start in zip(data["tokens"], data["answer_start"])])


def frequent_tokens(data: dict, k: int, vocab_size: int) -> torch.Tensor:
    """The k token ids most frequent in the answers of self-distillation `data` (ascending ids). Ties (such
    as tokens never seen, when k exceeds the distinct ones) go to the lower id: in a BPE vocabulary an
    earlier merge, a token more common in the tokenizer's own training text."""
    counts = torch.bincount(answer_tokens(data), minlength=vocab_size).double()
    return (counts * vocab_size - torch.arange(vocab_size, device=counts.device)).topk(k).indices.sort().values


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 400
    batch_size: int = 16  # sequences per step
    unroll: int = 3  # passes per step, each fed the head's own output features of the previous one
    lr: float = 2e-3
    max_new_tokens: int = 160  # length of the verifier's generations
    temperature: float = 0.7  # sampling temperature of the verifier's generations
    seed: int = 0
    save_dtype: str = "float32"  # of the saved weights ("float16" halves the file)
    gen_batch: int = 32  # answers generated at once (larger on a GPU)


def self_distillation_data(verifier: CausalLM, prompts: list[str], cfg: TrainConfig,
                           hidden_layers: tuple[int, ...] = (-1,), parts: Path | None = None,
                           identity: dict | None = None, log=print) -> dict:
    """The verifier's own answers to `prompts` (through its chat template when it has one; sampled at
    cfg.temperature, greedy at 0), generated in batches of cfg.gen_batch with the hidden states of blocks
    `hidden_layers` (ending with the last, -1) of every token taken as it is fed (one pass: no second
    forward over prompt + answer). Per sequence: its token ids [S] (prompt + answer + EOS when it stopped),
    features [S, k H] (float16; the last token's, never fed nor needed, is zero; the last H columns are the
    final hidden state) and where its answer starts. `parts`: a directory keeping each finished batch (with
    `identity`, the settings the data depends on), from which a later call with the same identity resumes."""
    from tqdm import tqdm

    from relaxspec.models.prompts import encode_prompts
    from relaxspec.models.stream import Stream, left_pad

    data = {"tokens": [], "features": [], "answer_start": []}
    eos = verifier.eos_token_id
    encoded = encode_prompts(verifier.tokenizer, prompts, chat_template="auto")
    draws = torch.Generator(device=verifier.device)
    batch = cfg.gen_batch
    done = _finished_parts(parts, identity, log) if parts is not None else {}
    bar = tqdm(total=len(prompts), desc="verifier answers", unit="answer", dynamic_ncols=True,
               initial=sum(len(done[i]["tokens"]) for i in range(0, len(prompts), batch) if i in done))
    for i in range(0, len(prompts), batch):
        chunk = encoded[i:i + batch]
        if i in done and len(done[i]["tokens"]) == len(chunk):
            for key in data:
                data[key] += done[i][key]
            continue
        part = {key: [] for key in data}
        # A batch's draws depend on its own prompts only: the data of a list is the union of its batches'.
        draws.manual_seed(cfg.seed * 1_000_003 + int(hashlib.sha256(prompts[i].encode()).hexdigest()[:12], 16))
        ids, mask = left_pad(chunk, verifier.tokenizer, verifier.device)
        stream = Stream(verifier)
        stream.prefill(ids[:, :0], mask[:, :0])
        logits, hidden = stream.feed(ids, mask, hidden_layer=hidden_layers)
        features = [list(h[m.bool()]) for h, m in zip(hidden, mask)]
        answers = [[] for _ in chunk]
        live = list(range(len(chunk)))  # chunk index of each row still generating
        for step in range(cfg.max_new_tokens):
            last = logits[:, -1]
            token = (last.argmax(dim=-1) if cfg.temperature == 0 else
                     torch.multinomial(torch.softmax(last / cfg.temperature, dim=-1), 1, generator=draws)[:, 0])
            for r, t in zip(live, token.tolist()):
                answers[r].append(t)
            going = token != eos if eos is not None else torch.ones_like(token, dtype=torch.bool)
            if step == cfg.max_new_tokens - 1 or not bool(going.any()):
                break
            if not bool(going.all()):
                rows = going.nonzero()[:, 0]
                stream.select(rows)
                live, token = [live[r] for r in rows.tolist()], token[rows]
            logits, hidden = stream.feed(token[:, None], hidden_layer=hidden_layers)
            for r, h in zip(live, hidden[:, 0]):
                features[r].append(h)
        for prompt_ids, answer, feats in zip(chunk, answers, features):
            part["tokens"].append(torch.tensor(prompt_ids + answer, device="cpu"))
            part["features"].append(torch.cat([torch.stack(feats), torch.zeros_like(feats[0])[None]]).to(
                "cpu", torch.float16))
            part["answer_start"].append(len(prompt_ids))
        if parts is not None:
            _save_part(parts, i, part)
        for key in data:
            data[key] += part[key]
        bar.update(len(chunk))
    bar.close()
    return data


def _finished_parts(parts: Path, identity: dict | None, log) -> dict[int, dict]:
    """{first prompt's index: that batch's data} of the batches an earlier run finished with the same `identity`
    (`parts/identity.json`); a directory made with other settings is emptied first."""
    stamp = json.dumps(identity, sort_keys=True)
    if parts.is_dir() and (not (parts / "identity.json").is_file() or
                           (parts / "identity.json").read_text(encoding="utf-8") != stamp):
        shutil.rmtree(parts)
    parts.mkdir(parents=True, exist_ok=True)
    (parts / "identity.json").write_text(stamp, encoding="utf-8")
    done = {int(f.stem): torch.load(f, map_location="cpu") for f in sorted(parts.glob("*.pt"))}
    if done:
        log(f"resuming the data set: {sum(len(d['tokens']) for d in done.values())} answers made earlier "
            f"({len(done)} batches in {parts})")
    return done


def _save_part(parts: Path, start: int, part: dict) -> None:
    """One finished batch, as parts/START.pt (written to a temporary name, then renamed: whole or absent)."""
    tmp = parts / f"{start:08d}.tmp"
    torch.save(part, tmp)
    os.replace(tmp, parts / f"{start:08d}.pt")


def _lr(step: int, cfg: TrainConfig) -> float:
    warmup = max(1, cfg.steps // 20)
    return cfg.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / cfg.steps)))


def head_loss(head: MTPHead, data: dict, rows: list[int], embed, lm_head, unroll: int) -> torch.Tensor:
    """Mean KL(verifier || head) over the answer entries of sequences `rows` (over the vocabulary of
    `lm_head`'s rows: the verifier's whole LM head, or a truncated head's rows, where both
    distributions are renormalized), averaged over `unroll` passes: pass 1 feeds entry k the verifier's feature f_{k-1} (as after a verify step), pass m the
    head's own output g_{k-1} of pass m - 1 (as m - 1 draft steps into a round)."""
    S = max(len(data["tokens"][r]) for r in rows)
    B, H = len(rows), embed.shape[1]
    # Assembled where the data lives (the CPU), then moved to the weights' device in one copy each.
    tokens = torch.zeros((B, S), dtype=torch.long, device="cpu")
    features = torch.zeros((B, S, data["features"][rows[0]].shape[-1]), dtype=torch.float16, device="cpu")
    valid = torch.zeros((B, S), dtype=torch.long, device="cpu")
    scored = torch.zeros((B, S - 1), dtype=torch.bool, device="cpu")  # entries k = 1..S-1 whose target t_{k+1} exists
    for b, r in enumerate(rows):
        n = len(data["tokens"][r])
        tokens[b, :n], features[b, :n], valid[b, :n] = data["tokens"][r], data["features"][r], 1
        # Entry k drafts t_{k+1}; drafting starts at the entry of the last prompt token.
        scored[b, max(0, data["answer_start"][r] - 2): n - 2] = True
    tokens, valid, scored = (t.to(embed.device) for t in (tokens, valid, scored))
    features = features.to(embed.device).float()
    with torch.no_grad():  # [M, V]: the targets of the scored entries (of entries 1..S-1); only those reach the LM head
        log_p = torch.log_softmax(final_features(features, H)[:, 1:][scored] @ lm_head.t(), dim=-1)
    total = 0.0
    for out in unrolled_outputs(head, tokens, features, valid, embed, unroll):
        log_q = torch.log_softmax(out[scored] @ lm_head.t(), dim=-1)
        total = total + (log_p.exp() * (log_p - log_q)).sum(dim=-1).mean()
    return total / unroll


def unrolled_outputs(head: MTPHead, tokens, features, valid, embed, passes: int):
    """The head's output features [B, S-1, H] over whole sequences (tokens [B, S], the verifier's hidden
    states [B, S, k H] of the head's `feature_layers`, valid [B, S]), one per pass: pass 1 feeds entry
    k = (f_{k-1}, E[t_k]) the verifier's feature (as right after a verify step), pass m the head's own output
    g_{k-1} of pass m - 1 (as m - 1 draft steps into a round). Output k predicts t_{k+1}."""
    embeddings = F.embedding(tokens[:, 1:], embed)
    positions = torch.arange(tokens.shape[1] - 1, device=tokens.device)[None].expand(tokens.shape[0], -1)
    features = head.verifier_features(features)
    inputs = features[:, :-1]
    for _ in range(passes):
        out, _ = head(head.entries(inputs, embeddings), valid[:, 1:], positions)
        yield out
        inputs = torch.cat([features[:, :1], out[:, :-1]], dim=1)  # entry k now gets g_{k-1}


def final_features(features, hidden: int):
    """The verifier's last hidden state (after its final norm) [..., H] out of stored features [..., k H]."""
    return features[..., -hidden:]


def train_head(verifier: CausalLM, prompts: list[str], out: Path, head_cfg: HeadConfig | None = None,
               cfg: TrainConfig = TrainConfig(), stop_after: int | None = None, init_from: str | Path | None = None,
               log=print) -> Path:
    """Train an MTP head for `verifier` on its own answers to `prompts` and save it under `out`.
    Resumes from `out/checkpoint.pt` (and reuses `out/train_data.pt`) when present and made with
    the same settings; `stop_after` ends the run early after that many steps (checkpoint kept).
    `init_from` (a saved head's directory or registry name, of the same settings) starts from its weights and draft
    vocabulary instead of a seeded head: training continued, with its own learning-rate schedule."""
    from tqdm import tqdm

    out = Path(out)
    embed, lm_head = (w.detach().float() for w in verifier_weights(verifier))
    head_cfg = head_cfg or HeadConfig(hidden=embed.shape[1])
    if head_cfg.hidden != embed.shape[1]:
        raise ValueError(f"head hidden size {head_cfg.hidden} != the verifier's {embed.shape[1]}")
    hidden_blocks(head_cfg.feature_layers, verifier.num_layers)  # a block the verifier lacks: a ValueError, before any work
    identity = {"verifier": verifier_fingerprint(verifier), "prompts": hashlib.sha256("\n".join(prompts).encode())
                .hexdigest()[:16], "head": asdict(head_cfg),
                "train": {k: v for k, v in asdict(cfg).items() if k != "save_dtype"}}  # (how it is saved: not trained)
    init = _initial_head(init_from, verifier, head_cfg) if init_from is not None else None
    if init is not None:
        identity["init"] = init["sha256"]
    out.mkdir(parents=True, exist_ok=True)
    data_identity = {k: identity[k] for k in ("verifier", "prompts")} | {
        k: identity["train"][k] for k in ("max_new_tokens", "temperature", "seed", "gen_batch")} | {
        "feature_layers": list(head_cfg.feature_layers)}
    t0 = time.perf_counter()
    data_file = out / DATA
    data = torch.load(data_file, map_location="cpu") if data_file.exists() else None
    if data is None or data.get("identity") != data_identity:
        with torch.inference_mode():
            data = self_distillation_data(verifier, prompts, cfg, hidden_layers=head_cfg.feature_layers,
                                          parts=out / PARTS, identity=data_identity, log=log) | {
                "identity": data_identity}
        torch.save(data, data_file)
        shutil.rmtree(out / PARTS, ignore_errors=True)  # (the whole set is in data_file now)
    rows = [r for r in range(len(data["tokens"])) if len(data["tokens"][r]) - data["answer_start"][r] >= 1]
    log(f"self-distillation data: {len(prompts)} answers, {sum(map(len, data['tokens']))} tokens")

    torch.manual_seed(cfg.seed)
    with torch.device("cpu"):  # made on the CPU, then moved: a seed gives the same initial head on every device
        head = MTPHead(head_cfg)
    if init is not None:
        head.load_state_dict(init["state"])
        log(f"starting from the head in {init['path']} (trained {init['training'].get('steps')} steps, "
            f"KL {init['training'].get('final_kl')})")
    elif head_cfg.draft_vocab:
        if head_cfg.draft_vocab > embed.shape[0]:
            raise ValueError(f"draft vocabulary {head_cfg.draft_vocab} > the verifier's {embed.shape[0]} tokens")
        head.draft_vocab.copy_(frequent_tokens(data, head_cfg.draft_vocab, embed.shape[0]))
        log(f"draft vocabulary: the {head_cfg.draft_vocab} most frequent answer tokens cover "
            f"{torch.isin(answer_tokens(data), head.draft_vocab).float().mean():.2%} of the answers")
    head.to(embed.device)
    lm_head = head_rows(head, lm_head)  # the loss compares p and q over the scored rows (renormalized there)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    step, seconds = 0, 0.0
    checkpoint = out / CHECKPOINT
    if checkpoint.exists():
        saved = torch.load(checkpoint, map_location=embed.device)
        if saved["identity"] == identity:
            head.load_state_dict(saved["head"])
            opt.load_state_dict(saved["optimizer"])
            step, seconds = saved["step"], saved["seconds"]
            log(f"resuming from step {step} of {cfg.steps}")
        else:
            log(f"ignoring {checkpoint}: it was made with other settings")

    def save_checkpoint():
        torch.save({"identity": identity, "head": head.state_dict(), "optimizer": opt.state_dict(), "step": step,
                    "seconds": seconds + time.perf_counter() - t_start}, checkpoint)

    t_start = time.perf_counter()
    end = cfg.steps if stop_after is None else min(cfg.steps, step + stop_after)
    bar = tqdm(total=cfg.steps, initial=step, desc="train mtp head", unit="step", dynamic_ncols=True)
    loss_ema = None
    head.train()
    while step < end:
        gen = torch.Generator(device="cpu").manual_seed(cfg.seed * 1_000_003 + step)  # batch = f(seed, step): resumable
        batch = [rows[i] for i in torch.randint(len(rows), (cfg.batch_size,), generator=gen, device="cpu").tolist()]
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        loss = head_loss(head, data, batch, embed, lm_head, cfg.unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        bar.update()
        bar.set_postfix(kl=f"{loss_ema:.3f}")
        if step % 50 == 0 or step == end:
            save_checkpoint()
    bar.close()
    if step < cfg.steps:
        log(f"stopped at step {step} of {cfg.steps}: run again to resume")
        return out
    seconds += time.perf_counter() - t_start
    training = {"prompts": len(prompts), "tokens": sum(map(len, data["tokens"])), **asdict(cfg),
                "train_seconds": round(seconds, 1), "data_seconds": round(t_start - t0, 1),
                "final_kl": None if loss_ema is None else round(loss_ema, 4)}
    if init is not None:
        training["continued_from"] = {"sha256": init["sha256"], "training": init["training"]}
    save_head(head.eval(), verifier, out, training, dtype=cfg.save_dtype)
    checkpoint.unlink()
    log(f"mtp head: {sum(p.numel() for p in head.parameters()):,} params, {cfg.steps} steps in {seconds:.0f}s "
        f"(+{t_start - t0:.0f}s of data), KL {loss_ema}; saved to {out} (the data set stays in {data_file}, "
        f"{data_file.stat().st_size / 1e6:.0f} MB: another head for this verifier and these prompts trains on it "
        "without remaking it; delete it when done)")
    return out


def _initial_head(name: str | Path, verifier: CausalLM, head_cfg: HeadConfig) -> dict:
    """A saved head to continue training: {path, sha256 of its weights file, state dict, its training record};
    ValueError (one line) if it is none, or was trained for another verifier or with other head settings."""
    if not is_mtp(name):
        raise ValueError(f"--init-from {str(name)!r}: no saved MTP head there (a directory `relaxspec drafter train "
                         f"--kind mtp` wrote, or a built-in head: {', '.join(BUILTIN_HEADS)})")
    path, config, state = read_head(name)
    if not trained_for(verifier, config["verifier"]):
        raise ValueError(f"--init-from {str(name)!r}: that head was trained for verifier "
                         f"{config['verifier']['name']!r}, not {verifier.name!r}")
    saved = {k: config[k] for k in HeadConfig.__dataclass_fields__ if k in config}
    mine = json.loads(json.dumps({k: v for k, v in asdict(head_cfg).items() if k in saved}))  # (tuples as lists)
    differ = ", ".join(f"{k} {saved[k]} (asked {mine[k]})" for k in saved if mine[k] != saved[k])
    if differ:
        raise ValueError(f"--init-from {str(name)!r}: that head has other settings: {differ}")
    return {"path": path, "sha256": hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()[:16],
            "state": state, "training": config.get("training", {})}


def training_prompts(tasks: list[str], n: int, prompts_file: str | None = None) -> list[str]:
    """Prompts to distil on: a JSONL file's 'prompt's, or n per task (built-in synthetic tasks: their
    train split, disjoint from the held-out test problems; 'chat': `tasks.chat.training_prompts`,
    disjoint from the held-out chat prompts `chat.HELDOUT`; 'code': `tasks.code_pool.training_prompts`, code
    instructions made from the Python standard library, disjoint from HumanEval, MBPP, GSM8K, MATH-500 and chat.HELDOUT)."""
    if prompts_file is not None:
        lines = Path(prompts_file).read_text(encoding="utf-8").splitlines()
        try:
            prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{prompts_file}: expected one JSON object with a 'prompt' per line") from None
        if not prompts:
            raise ValueError(f"{prompts_file}: no prompts")
        return prompts
    from relaxspec.tasks import chat, code_pool, get_task, synthetic

    prompts = []
    for task in tasks:
        if task == "chat":  # template x subject chat prompts, disjoint from chat.HELDOUT
            prompts += chat.training_prompts(n)
        elif task == "code":  # stdlib-made code instructions, disjoint from the evaluation sets
            prompts += code_pool.training_prompts(n)
        elif task in synthetic.GENERATORS:
            prompts += [e.prompt for e in synthetic.examples(task, "train", n)]
        else:
            prompts += get_task(task, limit=n).prompts
    random.Random(0).shuffle(prompts)
    return prompts

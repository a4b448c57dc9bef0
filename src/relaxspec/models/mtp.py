"""An MTP / EAGLE-style drafter head: drafts from the verifier's own hidden state.

Draft step (EAGLE-1 shape, an MLP stack instead of a decoder layer):

    g = head(f, E[x])          f: the feature of the token before x; E: the verifier's embedding
    q = softmax(g W^T)         W: the verifier's own LM head (its full vocabulary)

`f` is the verifier's last hidden state (after its final norm, where W applies) of the token
before `last` in the accepted prefix; within a round the head runs on its own outputs g. The head
is a concat -> linear projection, then residual SwiGLU MLP blocks, then an RMS norm back into the
verifier's feature space. It has no attention and no cache: its whole state is one feature per
row, so rollback is exact by construction (the feature of the last accepted token comes straight
from the verify pass). The embedding and LM head are the verifier's, read at load time, so only
the head's own weights are stored.

Full LM head, not a truncated vocabulary: measured on the built-in verifier (vocab 714, hidden
128) the LM head matmul is a small share of a draft step, which is per-op overhead bound on a
CPU; truncation (FR-Spec) pays off for large vocabularies (SmolLM2's 49152 x 576 head).

Training (`relaxspec drafter train --kind mtp`): self-distillation. The verifier generates answers
to the training prompts with relaxspec's own engine, one forward over each sequence gives its
features F_j, and the head learns the verifier's next-token distributions: from F_j and the
embeddings of the following tokens it is unrolled `unroll` steps on its own outputs (training as
it drafts, EAGLE-3's "training-time test"), each step's loss the KL from the verifier's
distribution softmax(F_{j+k} W^T) to the head's. Checkpointed and resumable.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from relaxspec.models.drafters import Drafter, Proposal
from relaxspec.models.family import BUILTIN_DIR
from relaxspec.models.hf import CausalLM

KIND = "mtp"
BUILTIN_HEADS = ("drafter-mtp",)
CHECKPOINT, DATA = "checkpoint.pt", "train_data.pt"


@dataclass(frozen=True)
class HeadConfig:
    hidden: int  # the verifier's hidden size
    ffn: int = 256
    layers: int = 2
    eps: float = 1e-6


class _Block(torch.nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.gate_up = torch.nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False)
        self.down = torch.nn.Linear(cfg.ffn, cfg.hidden, bias=False)
        self.eps = cfg.eps

    def forward(self, x):
        gate, up = self.gate_up(F.rms_norm(x, x.shape[-1:], self.norm, self.eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class MTPHead(torch.nn.Module):
    def __init__(self, cfg: HeadConfig):
        super().__init__()
        self.cfg = cfg
        self.norm_feature = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.norm_embed = torch.nn.Parameter(torch.ones(cfg.hidden))
        self.fc = torch.nn.Linear(2 * cfg.hidden, cfg.hidden, bias=False)
        self.blocks = torch.nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.norm_out = torch.nn.Parameter(torch.ones(cfg.hidden))

    def forward(self, feature: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """The next feature [..., H] from the current one and the embedding of the token after it."""
        shape, eps = feature.shape[-1:], self.cfg.eps
        x = self.fc(torch.cat([F.rms_norm(feature, shape, self.norm_feature, eps),
                               F.rms_norm(embedding, shape, self.norm_embed, eps)], dim=-1))
        for block in self.blocks:
            x = block(x)
        return F.rms_norm(x, shape, self.norm_out, eps)


# ---------------------------------------------------------------- the verifier it belongs to


def verifier_weights(verifier: CausalLM) -> tuple[torch.Tensor, torch.Tensor]:
    """(input embedding [V, H], LM head [V, H]) of the verifier: what the head borrows."""
    return verifier.model.get_input_embeddings().weight, verifier.model.get_output_embeddings().weight


def verifier_fingerprint(verifier: CausalLM) -> str:
    """sha256 of the verifier's architecture (type, vocab, hidden size, layers) and of its embedding
    and LM head rounded to bfloat16 (the same whether it is loaded in float32, float16 or bfloat16)."""
    cfg = verifier.model.config
    digest = hashlib.sha256(json.dumps([type(verifier.model).__name__, verifier.vocab_size, cfg.hidden_size,
                                        verifier.num_layers]).encode())
    for weight in verifier_weights(verifier):
        digest.update(weight.detach().to("cpu", torch.bfloat16).view(torch.int16).numpy().tobytes())
    return digest.hexdigest()[:24]


# ---------------------------------------------------------------- drafting


class MTPDrafter(Drafter):
    kind = KIND
    needs_hidden = True

    def __init__(self, head: MTPHead, verifier: CausalLM, name: str = "mtp"):
        self.head, self.name = head.eval(), name
        embed, lm_head = verifier_weights(verifier)
        self.embed = embed.detach()
        self.lm_head_t = lm_head.detach().t().contiguous()  # x @ W^T with a row-major right operand
        self.head.to(device=self.embed.device, dtype=self.embed.dtype)

    def check(self, verifier, rule) -> None:
        if verifier_weights(verifier)[0].shape != self.embed.shape:
            raise ValueError(f"MTP head {self.name!r} was built for another verifier")
        super().check(verifier, rule)

    def prefill(self, ids, mask, hidden=None) -> None:
        # The feature of the token before `last`; a one-token prompt has none (zeros).
        B, H = ids.shape[0], self.embed.shape[1]
        if hidden is None or hidden.shape[1] == 0:
            self.feature = torch.zeros((B, H), dtype=self.embed.dtype, device=ids.device)
        else:
            self.feature = hidden[:, -1] * mask[:, -1:].to(hidden.dtype)

    @torch.inference_mode()
    def propose(self, last, n, extra, sample) -> Proposal:
        feature, token = self.feature, last
        tokens, logits_rows, probs = [], [], []
        for i in range(n + extra):
            feature = self.head(feature, F.embedding(token, self.embed))
            logits = torch.mm(feature, self.lm_head_t).float()
            logits_rows.append(logits)
            if i < n:
                token, p = sample(logits, i)
                tokens.append(token)
                probs.append(p)
        return Proposal(torch.stack(tokens, dim=1), torch.stack(logits_rows, dim=1),
                        None if probs[0] is None else torch.stack(probs, dim=1), forwards=n + extra)

    def rollback(self, accepted, hidden=None) -> None:
        # hidden [B, n+1, H]: the verifier's features of [last, x_1..x_n]; the new `last` follows x_accepted.
        index = accepted.to(hidden.device)[:, None, None].expand(-1, 1, hidden.shape[-1])
        self.feature = hidden.gather(1, index).squeeze(1).to(self.embed.dtype)

    def select(self, rows) -> None:
        self.feature = self.feature[rows.to(self.feature.device)]


# ---------------------------------------------------------------- files


def _directory(name: str | Path) -> Path:
    return BUILTIN_DIR / str(name) if str(name) in BUILTIN_HEADS else Path(name)


def is_mtp(name: str | Path) -> bool:
    """A built-in head name or a directory saved by `relaxspec drafter train --kind mtp`."""
    config = _directory(name) / "config.json"
    try:
        return json.loads(config.read_text()).get("relaxspec_kind") == KIND
    except (OSError, ValueError, AttributeError):
        return False


def save_head(head: MTPHead, verifier: CausalLM, out: Path, training: dict) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = {"relaxspec_kind": KIND, **asdict(head.cfg),
              "params": sum(p.numel() for p in head.parameters()),
              "verifier": {"name": verifier.name, "fingerprint": verifier_fingerprint(verifier),
                           "vocab_size": verifier.vocab_size},
              "lm_head": "the verifier's (full vocabulary)", "training": training}
    save_file({k: v.detach().float().contiguous() for k, v in head.state_dict().items()}, out / "model.safetensors")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")


def load_mtp_drafter(name: str | Path, verifier: CausalLM) -> MTPDrafter:
    """The head saved under `name`, for `verifier`: ValueError if it was trained for another one."""
    from safetensors.torch import load_file

    path = _directory(name)
    config = json.loads((path / "config.json").read_text())
    expected = config["verifier"]
    if verifier_fingerprint(verifier) != expected["fingerprint"]:
        raise ValueError(f"MTP drafter {str(name)!r} was trained for verifier {expected['name']!r} (fingerprint "
                         f"{expected['fingerprint']}); verifier {verifier.name!r} is a different model "
                         f"(fingerprint {verifier_fingerprint(verifier)}): train a head for it with "
                         f"`relaxspec drafter train --verifier {verifier.name} --kind mtp`")
    head = MTPHead(HeadConfig(**{k: config[k] for k in ("hidden", "ffn", "layers", "eps")}))
    head.load_state_dict(load_file(path / "model.safetensors"))
    return MTPDrafter(head, verifier, name=str(name))


# ---------------------------------------------------------------- training


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 1200
    batch_size: int = 128  # starting positions per step
    unroll: int = 4  # draft steps per position, each on the head's own previous output
    lr: float = 3e-3
    max_new_tokens: int = 160  # length of the verifier's generations
    temperature: float = 0.7  # sampling temperature of the verifier's generations
    seed: int = 0


def self_distillation_data(verifier: CausalLM, prompts: list[str], cfg: TrainConfig, batch: int = 64, log=None):
    """The verifier's own answers to `prompts` (engine, sampled at cfg.temperature), and one forward over
    each prompt + answer (+ EOS when it stopped): flat token ids [T], features [T, H] (float16),
    the global index of each position's sequence end [T], and where each answer starts [T] (bool)."""
    from tqdm import tqdm

    from relaxspec.engine import generate

    tokens, features, ends, starts = [], [], [], []
    eos = verifier.eos_token_id
    bar = tqdm(range(0, len(prompts), batch), desc="verifier answers", unit="batch", dynamic_ncols=True)
    for i in bar:
        chunk = prompts[i:i + batch]
        out = generate(verifier, None, chunk, method="ar", max_new_tokens=cfg.max_new_tokens,
                       temperature=cfg.temperature, seed=[cfg.seed * 1_000_003 + i + j for j in range(len(chunk))])
        for r in out.results:
            prompt_ids = verifier.tokenizer(r.prompt)["input_ids"]
            answer = r.token_ids + ([eos] if eos is not None and len(r.token_ids) < cfg.max_new_tokens else [])
            ids = torch.tensor([prompt_ids + answer])
            with torch.inference_mode():
                _, hidden = verifier.forward(ids, verifier.new_cache(), torch.ones_like(ids),
                                             torch.arange(ids.shape[1])[None], hidden_layer=-1)
            offset = sum(len(t) for t in tokens)
            tokens.append(ids[0])
            features.append(hidden[0].to(torch.float16))
            ends.append(torch.full((ids.shape[1],), offset + ids.shape[1] - 1))
            # The first draft of a round reads the feature of the token before the last prompt token.
            starts.append(torch.arange(ids.shape[1]) >= len(prompt_ids) - 2)
    return {"tokens": torch.cat(tokens), "features": torch.cat(features), "ends": torch.cat(ends),
            "starts": torch.cat(starts)}


def _lr(step: int, cfg: TrainConfig) -> float:
    warmup = max(1, cfg.steps // 20)
    return cfg.lr * min(1.0, (step + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, step / cfg.steps)))


def head_loss(head: MTPHead, data: dict, positions: torch.Tensor, embed, lm_head, unroll: int) -> torch.Tensor:
    """Mean over the unrolled steps of KL(verifier || head) at `positions` (global indices j: the
    head starts from F_j, and step k predicts the token after j + k from the embedding of token j + k)."""
    feature = data["features"][positions].float()
    total = 0.0
    for k in range(1, unroll + 1):
        index = positions + k
        valid = index < data["ends"][positions]  # token j + k + 1 exists: the verifier's target is real
        if not bool(valid.any()):
            break
        index = index.clamp(max=data["tokens"].shape[0] - 1)
        feature = head(feature, F.embedding(data["tokens"][index], embed))
        log_q = torch.log_softmax(feature @ lm_head.t(), dim=-1)
        log_p = torch.log_softmax(data["features"][index].float() @ lm_head.t(), dim=-1)
        kl = (log_p.exp() * (log_p - log_q)).sum(dim=-1)
        total = total + (kl * valid).sum() / valid.sum()
    return total / unroll


def train_head(verifier: CausalLM, prompts: list[str], out: Path, head_cfg: HeadConfig | None = None,
               cfg: TrainConfig = TrainConfig(), stop_after: int | None = None, log=print) -> Path:
    """Train an MTP head for `verifier` on its own answers to `prompts` and save it under `out`.
    Resumes from `out/checkpoint.pt` (and reuses `out/train_data.pt`) when present and made with
    the same settings; `stop_after` ends the run early after that many steps (checkpoint kept)."""
    from tqdm import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    embed, lm_head = (w.detach().float() for w in verifier_weights(verifier))
    head_cfg = head_cfg or HeadConfig(hidden=embed.shape[1])
    if head_cfg.hidden != embed.shape[1]:
        raise ValueError(f"head hidden size {head_cfg.hidden} != the verifier's {embed.shape[1]}")
    identity = {"verifier": verifier_fingerprint(verifier), "prompts": hashlib.sha256("\n".join(prompts).encode())
                .hexdigest()[:16], "head": asdict(head_cfg), "train": asdict(cfg)}
    data_identity = {k: identity[k] for k in ("verifier", "prompts")} | {
        k: identity["train"][k] for k in ("max_new_tokens", "temperature", "seed")}
    t0 = time.perf_counter()
    data_file = out / DATA
    data = torch.load(data_file) if data_file.exists() else None
    if data is None or data.get("identity") != data_identity:
        data = self_distillation_data(verifier, prompts, cfg) | {"identity": data_identity}
        torch.save(data, data_file)
    candidates = torch.nonzero(data["starts"] & (torch.arange(len(data["starts"])) + 1 < data["ends"])).squeeze(1)
    log(f"self-distillation data: {len(prompts)} answers, {len(data['tokens'])} tokens, "
        f"{len(candidates)} training positions")

    torch.manual_seed(cfg.seed)
    head = MTPHead(head_cfg)
    opt = torch.optim.AdamW(head.parameters(), lr=cfg.lr, weight_decay=0.01, betas=(0.9, 0.98))
    step, seconds = 0, 0.0
    checkpoint = out / CHECKPOINT
    if checkpoint.exists():
        saved = torch.load(checkpoint)
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
        gen = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)  # batch = f(seed, step): resumable
        positions = candidates[torch.randint(len(candidates), (cfg.batch_size,), generator=gen)]
        for group in opt.param_groups:
            group["lr"] = _lr(step, cfg)
        loss = head_loss(head, data, positions, embed, lm_head, cfg.unroll)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        bar.update()
        bar.set_postfix(kl=f"{loss_ema:.3f}")
        if step % 200 == 0 or step == end:
            save_checkpoint()
    bar.close()
    if step < cfg.steps:
        log(f"stopped at step {step} of {cfg.steps}: run again to resume")
        return out
    seconds += time.perf_counter() - t_start
    training = {"prompts": len(prompts), "tokens": len(data["tokens"]), **asdict(cfg),
                "train_seconds": round(seconds, 1), "data_seconds": round(t_start - t0, 1),
                "final_kl": None if loss_ema is None else round(loss_ema, 4)}
    save_head(head.eval(), verifier, out, training)
    checkpoint.unlink()
    data_file.unlink()
    log(f"mtp head: {sum(p.numel() for p in head.parameters()):,} params, {cfg.steps} steps in {seconds:.0f}s "
        f"(+{t_start - t0:.0f}s of data), KL {loss_ema}; saved to {out}")
    return out


def training_prompts(tasks: list[str], n: int, prompts_file: str | None = None) -> list[str]:
    """Prompts to distil on: a JSONL file's 'prompt's, or n per task (built-in synthetic tasks: their
    train split, disjoint from the held-out test problems)."""
    if prompts_file is not None:
        lines = Path(prompts_file).read_text(encoding="utf-8").splitlines()
        try:
            prompts = [json.loads(line)["prompt"] for line in lines if line.strip()]
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"{prompts_file}: expected one JSON object with a 'prompt' per line") from None
        if not prompts:
            raise ValueError(f"{prompts_file}: no prompts")
        return prompts
    from relaxspec.tasks import get_task, synthetic

    prompts = []
    for task in tasks:
        if task in synthetic.GENERATORS:
            prompts += [e.prompt for e in synthetic.examples(task, "train", n)]
        else:
            prompts += get_task(task, limit=n).prompts
    random.Random(0).shuffle(prompts)
    return prompts

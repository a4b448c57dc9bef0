"""Train the built-in model family from scratch on the synthetic tasks (fixed seed, CPU).

    relaxspec models train --out DIR [--scale 1.0] [--only NAME ...]

One byte-level BPE tokenizer (digits kept single) is trained on task text,
then each model is a Llama-style `transformers` model trained on
prompt + worked response with the loss on the response only. A model whose
spec names a teacher (drafter-strong) starts from some of the teacher's layers
and adds KL(teacher || model) to the loss; the teacher comes first in FAMILY.
Weights are saved as fp16 safetensors in Hugging Face format.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from relaxspec.models.family import BUILTIN_DIR, FAMILY, ModelSpec
from relaxspec.tasks import synthetic

EOS, PAD = "<|eos|>", "<|pad|>"
VOCAB_SIZE = 1024
BF16 = torch.ops.mkldnn._is_mkldnn_bf16_supported()
MAX_POSITIONS = 512


def train_tokenizer(out_dir: Path, seed: int = 0, n_texts: int = 20000):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    rng = random.Random(seed)
    stream = synthetic.train_stream(rng)
    texts = [ex.prompt + ex.response for ex in (next(stream) for _ in range(n_texts))]
    tok = Tokenizer(models.BPE())
    # Single digits keep arithmetic learnable; byte-level makes any text encodable and round-trip exact.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[PAD, EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD)
    fast.model_max_length = MAX_POSITIONS
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out_dir)
    return fast


def build_model(spec: ModelSpec, vocab_size: int, eos_id: int, pad_id: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=spec.hidden, intermediate_size=spec.ffn,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads, num_key_value_heads=spec.heads,
        max_position_embeddings=MAX_POSITIONS, tie_word_embeddings=True, eos_token_id=eos_id,
        pad_token_id=pad_id, bos_token_id=None, rope_theta=10000.0,
    )
    return LlamaForCausalLM(config)


def _batch(tokenizer, examples):
    """Right-padded ids with labels = -100 on prompt and padding (loss on the response only)."""
    prompts = tokenizer([e.prompt for e in examples])["input_ids"]
    responses = tokenizer([e.response + EOS for e in examples])["input_ids"]
    seqs = [p + r for p, r in zip(prompts, responses)]
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id)
    labels = torch.full((len(seqs), width), -100)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, len(p): len(s)] = torch.tensor(s[len(p):])
        mask[i, : len(s)] = 1
    return ids, labels, mask


def _length_bucketed_batches(stream, batch_size: int, rng: random.Random, pool: int = 8):
    """Batches of similar-length examples (less padding), in shuffled order."""
    while True:
        examples = sorted((next(stream) for _ in range(batch_size * pool)), key=lambda e: len(e.prompt + e.response))
        chunks = [examples[i: i + batch_size] for i in range(0, len(examples), batch_size)]
        rng.shuffle(chunks)
        yield from chunks


def _copy_from_teacher(model, teacher, layers: tuple[int, ...]) -> None:
    """Layer truncation: the teacher's embedding (tied LM head), final norm and decoder `layers` in order."""
    model.model.embed_tokens.load_state_dict(teacher.model.embed_tokens.state_dict())
    model.model.norm.load_state_dict(teacher.model.norm.state_dict())
    for mine, theirs in zip(model.model.layers, layers, strict=True):
        mine.load_state_dict(teacher.model.layers[theirs].state_dict())


def _distill_loss(logits, teacher_logits, labels):
    """KL(teacher || model) per response token (the positions whose next-token label counts)."""
    keep = labels[:, 1:] != -100
    log_q = torch.log_softmax(logits[:, :-1][keep].float(), dim=-1)
    log_p = torch.log_softmax(teacher_logits[:, :-1][keep].float(), dim=-1)
    return torch.nn.functional.kl_div(log_q, log_p, log_target=True, reduction="batchmean")


def load_teacher(spec: ModelSpec, family_dir: Path):
    """The family model `spec` distils from, trained earlier into the same family directory."""
    from transformers import AutoModelForCausalLM

    path = Path(family_dir) / spec.teacher
    if not (path / "model.safetensors").exists():
        raise ValueError(f"{spec.name} distils from {spec.teacher}, which is not in {family_dir}: train it in the "
                         f"same run (--only {spec.teacher} {spec.name}) or copy it there first")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)


def train_model(spec: ModelSpec, tokenizer, out_dir: Path, seed: int = 0, scale: float = 1.0, log=print,
                init_from: Path | None = None, teacher=None):
    """Train `spec` from scratch (from `teacher`'s layers when the spec distils), or (init_from) continue
    from saved weights with a fresh schedule."""
    if init_from is None:
        model = build_model(spec, len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id, seed)
        if teacher is not None:
            _copy_from_teacher(model, teacher, spec.teacher_layers)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(init_from, dtype=torch.float32)
        seed += 1  # a fresh data stream for the continuation
    steps = max(1, int(spec.steps * scale))
    warmup = max(1, steps // 20)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, weight_decay=0.01, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / steps))))
    batches = _length_bucketed_batches(synthetic.train_stream(random.Random(f"train:{spec.name}:{seed}")),
                                       spec.batch_size, random.Random(seed))
    model.train()
    start = time.perf_counter()
    bar = tqdm(range(steps), desc=f"train {spec.name}", unit="step", dynamic_ncols=True)
    loss_ema = None
    for _ in bar:
        ids, labels, mask = _batch(tokenizer, next(batches))
        # bf16 autocast roughly halves the step time on CPUs with avx512_bf16 (and is ~6x slower on an
        # AVX2-only CPU, where the run stays fp32); master weights stay fp32.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=BF16):
            out = model(input_ids=ids, attention_mask=mask, labels=labels)
            loss = out.loss
            if teacher is not None:
                with torch.no_grad():
                    teacher_logits = teacher(input_ids=ids, attention_mask=mask).logits
                loss = loss + _distill_loss(out.logits, teacher_logits, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        loss_ema = loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * loss.item()
        bar.set_postfix(loss=f"{loss_ema:.3f}")
    seconds = time.perf_counter() - start
    model.eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.to(torch.float16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    previous = json.loads((Path(init_from) / "relaxspec.json").read_text()) if init_from else None
    info = {"name": spec.name, "role": spec.role, "params": sum(p.numel() for p in model.parameters()),
            "steps": steps, "batch_size": spec.batch_size, "seed": seed, "train_seconds": round(seconds, 1),
            "final_loss": round(loss_ema, 4), "continued_from": previous,
            "distilled_from": None if teacher is None else {"teacher": spec.teacher, "layers": list(spec.teacher_layers)}}
    (out_dir / "relaxspec.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"{spec.name}: {info['params']:,} params, {steps} steps in {seconds:.0f}s, loss {loss_ema:.3f}")
    return info


def train_family(out: Path, seed: int = 0, scale: float = 1.0, only=None, log=print,
                 tokenizer_from: Path | None = None):
    if tokenizer_from is not None:  # reuse a trained tokenizer (e.g. to retrain only some models)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_from)
    else:
        tokenizer = train_tokenizer(out / "tokenizer", seed=seed)
    infos, start = {}, time.perf_counter()
    for name, spec in FAMILY.items():
        if only and name not in only:
            continue
        teacher = load_teacher(spec, out) if spec.teacher else None
        infos[name] = train_model(spec, tokenizer, out / name, seed=seed, scale=scale, log=log, teacher=teacher)
        for i, (steps, lr) in enumerate(spec.restarts):
            infos[name] = train_model(dataclasses.replace(spec, steps=steps, lr=lr), tokenizer, out / name, seed=seed + i,
                                      scale=scale, log=log, init_from=out / name, teacher=teacher)
    log(f"trained {', '.join(infos)} in {time.perf_counter() - start:.0f}s")
    return infos


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True, help=f"family directory (the shipped one: {BUILTIN_DIR})")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--continue-from", type=Path, help="continue one model (--only NAME) from these weights")
    ap.add_argument("--steps", type=int, help="steps for --continue-from")
    ap.add_argument("--lr", type=float)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--tokenizer-from", type=Path)
    ap.add_argument("--seed", type=int, default=0, help="--continue-from: restart i (from 0) of a spec's recipe runs with --seed i")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.continue_from:
        from transformers import AutoTokenizer

        spec = dataclasses.replace(FAMILY[a.only[0]], steps=a.steps, lr=a.lr or FAMILY[a.only[0]].lr)
        teacher = load_teacher(spec, a.continue_from.parent) if spec.teacher else None
        train_model(spec, AutoTokenizer.from_pretrained(a.continue_from), a.out / spec.name, seed=a.seed,
                    init_from=a.continue_from, teacher=teacher)
    else:
        train_family(a.out, scale=a.scale, only=a.only, tokenizer_from=a.tokenizer_from)

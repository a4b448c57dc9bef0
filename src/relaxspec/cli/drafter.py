"""`relaxspec drafter train`: train a drafter for a verifier (today: an MTP head, by self-distillation).

    relaxspec drafter train --verifier verifier --kind mtp --task arithmetic --task sorting --out DIR

The result is a directory (config.json with the kind, sizes and the verifier's fingerprint, plus
model.safetensors) that `--drafter DIR` accepts for that verifier only. Interrupted runs resume
from DIR/checkpoint.pt when started again with the same arguments.
"""

from __future__ import annotations

from pathlib import Path


def cmd_drafter(args) -> int:
    import torch

    from relaxspec.models import load_model
    from relaxspec.drafters.mtp import HeadConfig
    from relaxspec.training.mtp import TrainConfig, train_head, training_prompts
    from relaxspec.cli.options import check_positive, device_kwargs

    if args.kind != "mtp":
        raise ValueError(f"drafter kind {args.kind!r} cannot be trained; trainable kinds: mtp")
    if args.prompts is None and not args.task:
        raise ValueError("give the training prompts: --prompts FILE or --task NAME (repeatable)")
    check_positive(args, "steps", "batch_size", "unroll", "lr", "max_new_tokens", "n", "gen_batch")
    if args.stop_after is not None and args.stop_after < 0:
        raise ValueError(f"--stop-after must be >= 0 (0: make the data set only), got {args.stop_after}")
    torch.set_num_threads(args.threads)
    prompts = training_prompts(args.task or [], args.n, args.prompts)  # (before the verifier: a bad --n fails at once)
    verifier = load_model(args.verifier, **device_kwargs(args))
    head = HeadConfig(hidden=verifier.model.config.hidden_size, heads=args.heads, ffn=args.ffn, layers=args.layers,
                      draft_vocab=args.draft_vocab, feature_layers=args.feature_layers)
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, unroll=args.unroll, lr=args.lr,
                      max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed,
                      save_dtype=args.save_dtype, gen_batch=args.gen_batch)
    train_head(verifier, prompts, args.out, head, cfg, stop_after=args.stop_after, init_from=args.init_from)
    return 0


def register(subparsers) -> None:
    from relaxspec.models.family import DEFAULT_VERIFIER
    from relaxspec.drafters.mtp import SAVE_DTYPES, HeadConfig
    from relaxspec.training.mtp import TrainConfig
    from relaxspec.cli.options import add_device_args

    d = subparsers.add_parser("drafter", help="train drafters for a verifier (MTP head)")
    dsub = d.add_subparsers(dest="drafter_cmd", required=True)
    t = dsub.add_parser("train", help="self-distil an MTP head on the verifier's own answers (resumable)")
    t.add_argument("--verifier", default=DEFAULT_VERIFIER, help="built-in model name or HF model directory")
    t.add_argument("--kind", default="mtp", help="drafter kind to train (mtp)")
    src = t.add_mutually_exclusive_group()
    src.add_argument("--prompts", help="JSONL file with a 'prompt' per line")
    src.add_argument("--task", action="append", help="task whose prompts to use (repeatable; built-in synthetic "
                                                     "tasks use their train split; 'chat': chat prompts "
                                                     "disjoint from the held-out ones; 'code': code "
                                                     "instructions made from the Python standard library, "
                                                     "disjoint from HumanEval, MBPP, GSM8K and MATH-500)")
    t.add_argument("--n", type=int, default=400, help="prompts per --task")
    t.add_argument("--out", type=Path, required=True, help="output directory (also holds the checkpoint)")
    defaults = TrainConfig()
    t.add_argument("--steps", type=int, default=defaults.steps)
    t.add_argument("--batch-size", type=int, default=defaults.batch_size)
    t.add_argument("--unroll", type=int, default=defaults.unroll, help="draft steps trained per position")
    t.add_argument("--lr", type=float, default=defaults.lr)
    t.add_argument("--max-new-tokens", type=int, default=defaults.max_new_tokens)
    t.add_argument("--temperature", type=float, default=defaults.temperature,
                   help="sampling temperature of the verifier's answers")
    head = HeadConfig(hidden=0)
    t.add_argument("--heads", type=int, default=head.heads, help="attention heads of the head's decoder layer")
    t.add_argument("--ffn", type=int, default=head.ffn, help="MLP width of the head's decoder layer")
    t.add_argument("--layers", type=int, default=head.layers, help="decoder layers (EAGLE: 1)")
    t.add_argument("--feature-layers", type=int, nargs="+", default=list(head.feature_layers), metavar="L",
                   help="verifier blocks whose hidden states the head reads, ending with -1 (the last): -1 alone is "
                        "EAGLE-1; several are fused into one feature, as EAGLE-3 does (e.g. 1 3 -1)")
    t.add_argument("--draft-vocab", type=int, default=head.draft_vocab, metavar="K",
                   help="draft over the K tokens most frequent in the verifier's training answers only "
                        "(a truncated LM head: cheaper for a large vocabulary; q is 0 elsewhere); 0: full vocabulary")
    t.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default=defaults.save_dtype,
                   help="how the head's weights are saved: int4 stores its matrices as the int4 format runs them "
                        "(about a quarter of float16; a shipped head), the others as named. Not part of training: a "
                        "stopped run resumes under another --save-dtype")
    t.add_argument("--seed", type=int, default=defaults.seed)
    t.add_argument("--gen-batch", type=int, default=defaults.gen_batch,
                   help="verifier answers generated at once (raise it on a GPU)")
    add_device_args(t)
    t.add_argument("--threads", type=int, default=1)
    t.add_argument("--stop-after", type=int, help="stop after this many steps (resume later; 0: make the verifier's "
                                                   "answers, the data set, and stop before training)")
    t.add_argument("--init-from", metavar="HEAD", help="continue training a saved head (a directory or a registry "
                                                       "name, trained for this verifier with the same head settings) "
                                                       "instead of starting from a seeded one")
    d.set_defaults(func=cmd_drafter)

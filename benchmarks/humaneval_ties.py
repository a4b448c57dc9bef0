"""Which way each near-tie leans: at the first position where relaxspec's and llama.cpp's greedy HumanEval answers
part, the logit of our token minus the logit of llama.cpp's, under several weight formats of the same file and under
llama.cpp, with the same prefix.

    python benchmarks/humaneval_ties.py --results he-0.5b-auto.jsonl [--model qwen2.5-coder-0.5b]
        [--dtypes auto float32] [--gguf FILE] [--threads 2] [--skip-llama] [--problems HumanEval/46 ...]

--results: a JSONL of benchmarks/task_baselines.py (--task humaneval-instruct) holding both systems' answers. For each problem whose two
answers part, the prefix is the prompt's token ids (the task humaneval-instruct, our tokenizer's chat template)
and the tokens the two answers share; each computation feeds it as generation did: the prompt in one pass, then
each shared token in a decode step of its own. Printed per problem: z(ours) - z(llama.cpp's) for each --dtypes
(float32: the file's values dequantized, float32 arithmetic: the reference neither system's rounding touches) and
for llama.cpp; positive leans to our token. Then, per computation, how often it leans as float32 does.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness.llamacpp import last_logits, llama  # noqa: E402
from harness.options import positive  # noqa: E402
from task_baselines import LLAMA, OURS, TASK, divergence, read_done  # noqa: E402

from relaxspec.models import load_model  # noqa: E402
from relaxspec.models.prompts import encode_prompts  # noqa: E402
from relaxspec.tasks import get_task  # noqa: E402

REFERENCE = "float32"


def decoded_logits(model, prompt: list[int], shared: list[int]) -> torch.Tensor:
    """The logits after `prompt` (one pass) and each token of `shared` (a decode step each), as generation has them."""
    x = torch.tensor([prompt + shared], device=model.device)
    pos = torch.arange(x.shape[1], device=model.device)[None]
    cache = model.new_cache()
    logits, _ = model.forward(x[:, :len(prompt)], cache, None, pos[:, :len(prompt)])
    for j in range(len(prompt), x.shape[1]):
        logits, _ = model.forward(x[:, j:j + 1], cache, None, pos[:, j:j + 1])
    return logits[0, -1].float()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--results", type=Path, required=True, help="task_baselines.py's JSONL, both systems in it")
    p.add_argument("--model", default="qwen2.5-coder-0.5b")
    p.add_argument("--dtypes", nargs="+", default=["auto", REFERENCE])
    p.add_argument("--gguf", help="the GGUF llama.cpp runs (default: the registry's fetched file of --model)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--problems", nargs="+", help="only these task ids")
    args = p.parse_args(argv)
    positive(p, args, "threads")
    if not args.results.is_file():
        p.error(f"--results: no such file: {args.results}")
    torch.set_num_threads(args.threads)
    done = read_done(args.results)
    task = get_task(TASK)
    cases = []
    for i, ref in enumerate(task.references):
        ours, theirs = done.get((OURS, ref)), done.get((LLAMA, ref))
        if ours is None or theirs is None or (args.problems and ref not in args.problems):
            continue
        k = divergence(ours["token_ids"], theirs["token_ids"])
        if k is not None and k < min(len(ours["token_ids"]), len(theirs["token_ids"])):  # (not one ending first)
            cases.append((i, ref, k, ours, theirs))
    print(f"{len(cases)} problems whose answers part at a token ({args.results})")
    if not cases:
        return 0
    lean = {}  # computation -> [z(ours) - z(theirs) per case]
    tokenizer = ids = None
    with torch.inference_mode():
        for dtype in args.dtypes:
            model = load_model(args.model, dtype=dtype)
            tokenizer = model.tokenizer
            ids = encode_prompts(tokenizer, task.prompts, chat_template="auto")
            lean[dtype] = []
            for i, _, k, ours, theirs in cases:
                z = decoded_logits(model, list(ids[i]), ours["token_ids"][:k])
                lean[dtype].append(float(z[ours["token_ids"][k]] - z[theirs["token_ids"][k]]))
            del model
    if not args.skip_llama:
        gguf = args.gguf
        if gguf is None:
            from relaxspec.models import registry
            gguf = registry.cached_path(args.model) if registry.is_registered(args.model) else None
        if gguf is None:
            print("llama.cpp: skipped (no GGUF file: --gguf FILE)")
        else:
            llm = llama(str(gguf), args.threads, max(len(ids[i]) + k for i, _, k, _, _ in cases) + 8, logits_all=True)
            lean[LLAMA] = []
            for i, _, k, ours, theirs in cases:
                z = last_logits(llm, list(ids[i]), ours["token_ids"][:k]).float()
                lean[LLAMA].append(float(z[ours["token_ids"][k]] - z[theirs["token_ids"][k]]))
            llm.close()  # (now: at interpreter exit its finalizer fails noisily)
    names = list(lean)
    print("| problem | position | our token | llama.cpp's | passed ours / llama.cpp | "
          + " | ".join(f"{n}: z(ours) - z(theirs)" for n in names) + " |")
    print("|---|---|---|---|---|" + "---|" * len(names))
    for c, (_, ref, k, ours, theirs) in enumerate(cases):
        words = [repr(tokenizer.decode([t["token_ids"][k]])) for t in (ours, theirs)]
        print(f"| {ref} | {k} | {words[0]} | {words[1]} | {ours['passed']} / {theirs['passed']} | "
              + " | ".join(f"{lean[n][c]:+.3f}" for n in names) + " |")
    for n in names:
        toward = sum(v > 0 for v in lean[n])
        line = f"{n}: leans to our token at {toward} of {len(cases)}"
        if REFERENCE in lean and n != REFERENCE:
            same = sum((v > 0) == (r > 0) for v, r in zip(lean[n], lean[REFERENCE]))
            line += f", as {REFERENCE} does at {same} of {len(cases)}"
        print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())

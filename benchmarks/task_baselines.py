"""A task's greedy score (pass@1, accuracy) of one model: relaxspec's AR and llama.cpp on the same prompts, with the
published reference beside them.

    python benchmarks/task_baselines.py [--task humaneval-instruct] [--model qwen2.5-coder-1.5b] [--gguf FILE]
        [--dtype int4] [--limit N] [--batch-size 16] [--max-new-tokens 512] [--threads 2] [--out FILE.jsonl]
        [--skip-llama] [--no-progress]

Both systems get the same token ids: the task's prompt (humaneval-instruct, mbpp-instruct: EvalPlus's instruct
prompt; gsm8k: the question asking for a \\boxed{} answer; any task `relaxspec tasks list` names) through our
tokenizer's chat template (models.prompts.encode_prompts, as the engine does), greedy, up to --max-new-tokens,
stopping at the tokenizer's end-of-turn token. relaxspec runs `engine.generate(method="ar")` in batches of
--batch-size; llama.cpp (llama-cpp-python, the GGUF given by --gguf, or the model's own file when --model is one)
is fed the ids and decodes greedily (top-k 1), one problem at a time. Both answers are decoded by our tokenizer and
scored alike by the task (code in the sandbox, numbers by the task's extraction).

Resumable: each problem's result (system, problem id, token ids, answer, passed, seconds) is appended to --out
(default `<task>-<model>-baselines.jsonl`) as it finishes; a re-run reads it and runs only what is missing. The
table: the score of each system with its Wilson interval (continuity-corrected, 95%), ms/token, and the reference
(Qwen2.5-Coder technical report, instruct models, bf16, their own prompt: HumanEval 70.7 / 61.6 and MBPP 69.2 /
52.4 for 1.5B- / 0.5B-Instruct; compare the direction, not the decimal); then every problem
whose two answers differ in tokens: the first position where they diverge and the top-2 logit gap there on each
side (a gap under NEAR_TIE logits: a near-tie that quantization or summation order can flip; larger on either
side: the two models really disagree there), and whether each passed. llama.cpp is skipped (said once) when
llama_cpp is not installed or no GGUF file is known.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from harness.llamacpp import last_logits, llama
from harness.options import positive
from harness.output import header
from harness.output import first_difference as divergence  # (where two answers' tokens part, None where they do not)
from relaxspec.bench.stats import utility_interval
from relaxspec.models import load_model
from relaxspec.models.prompts import encode_prompts
from relaxspec.tasks import get_task

TASK = "humaneval-instruct"  # the default task
OURS, LLAMA = "relaxspec", "llama.cpp"
NEAR_TIE = 1.0  # logits
REFERENCES = {  # Qwen2.5-Coder report (arXiv 2409.12186), instruct models
    "humaneval-instruct": {"qwen2.5-coder-1.5b": 70.7, "qwen2.5-coder-0.5b": 61.6},
    "mbpp-instruct": {"qwen2.5-coder-1.5b": 69.2, "qwen2.5-coder-0.5b": 52.4},
}


def problem_ids(task) -> list[str]:
    """Each problem's id in the results: its reference where those are unique (HumanEval's and MBPP's task ids),
    else `<task>/<index>` (GSM8K's references are its gold numbers)."""
    refs = task.references
    return list(refs) if len(set(refs)) == len(refs) else [f"{task.name}/{i}" for i in range(len(refs))]


def read_done(path: Path) -> dict:
    """{(system, task_id): record} of the results already in the JSONL file (a torn last line is ignored)."""
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            done[(rec["system"], rec["task_id"])] = rec
    return done


def append(path: Path, rec: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")  # closed at once: an interrupt loses at most the problem in flight


def run_ours(model, task, ids, todo, args, out: Path, done: dict, progress: bool) -> None:
    names = problem_ids(task)
    from tqdm import tqdm

    from relaxspec.engine import generate
    bar = tqdm(total=len(todo), desc=OURS, unit="problem", disable=not progress, dynamic_ncols=True)
    for start in range(0, len(todo), args.batch_size):
        batch = todo[start:start + args.batch_size]
        t0 = time.perf_counter()
        result = generate(model, None, [task.prompts[i] for i in batch], method="ar", temperature=0.0,
                          max_new_tokens=args.max_new_tokens)
        seconds = (time.perf_counter() - t0) / len(batch)
        for i, r in zip(batch, result.results):
            rec = {"system": OURS, "task_id": names[i], "token_ids": list(r.token_ids),
                   "answer": r.text, "passed": task.score(r.text, task.references[i]) == 1.0, "seconds": seconds,
                   "batch": len(batch)}
            append(out, rec)
            done[(OURS, rec["task_id"])] = rec
        bar.update(len(batch))
    bar.close()


def run_llama(llm, tokenizer, task, ids, todo, args, out: Path, done: dict, progress: bool) -> None:
    from tqdm import tqdm
    eos, names = tokenizer.eos_token_id, problem_ids(task)
    bar = tqdm(total=len(todo), desc=LLAMA, unit="problem", disable=not progress, dynamic_ncols=True)
    for i in todo:
        t0 = time.perf_counter()
        tokens = []
        for tok in llm.generate(ids[i], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if tok == eos:
                break
            tokens.append(int(tok))
            if len(tokens) >= args.max_new_tokens:
                break
        answer = tokenizer.decode(tokens, skip_special_tokens=True)
        rec = {"system": LLAMA, "task_id": names[i], "token_ids": tokens, "answer": answer,
               "passed": task.score(answer, task.references[i]) == 1.0, "seconds": time.perf_counter() - t0,
               "batch": 1}
        append(out, rec)
        done[(LLAMA, rec["task_id"])] = rec
        bar.update(1)
    bar.close()


def gap(logits: torch.Tensor) -> float:
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def ours_gap(model, prefix: list[int]) -> float:
    x = torch.tensor([prefix], device=model.device)
    pos = torch.arange(len(prefix), device=model.device)[None]
    logits, _ = model.forward(x, model.new_cache(), None, pos)
    return gap(logits[0, -1])


def llama_gap(llm, prefix: list[int]) -> float:
    """The gap at the prefix's last position; `llm` keeps every position's logits (logits_all)."""
    return gap(last_logits(llm, prefix))


def pct(interval) -> str:
    return f"{100 * interval.mean:5.1f} [{100 * interval.low:.1f}, {100 * interval.high:.1f}]"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--task", default=TASK, help="a task spec (relaxspec tasks list; default %(default)s)")
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="a model name or path for load_model")
    p.add_argument("--gguf", help="the GGUF file llama.cpp runs (default: --model when it is one)")
    p.add_argument("--dtype", default=None, help="load_model dtype (e.g. int4; default: the loader's)")
    p.add_argument("--limit", type=int, default=None, help="the first problems (default: all of the task's)")
    p.add_argument("--batch-size", type=int, default=16, help="problems per generate call (relaxspec)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="results JSONL (default <task>-<model>-baselines.jsonl)")
    p.add_argument("--skip-llama", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    positive(p, args, "limit", "batch_size", "max_new_tokens", "threads")
    torch.set_num_threads(args.threads)
    from relaxspec.tasks import runs_code
    from relaxspec.tasks.sandbox import require_isolation
    try:
        if runs_code(args.task):
            require_isolation()
        task = get_task(args.task, limit=args.limit)
    except ValueError as e:
        p.error(str(e))
    if args.out is None:
        args.out = Path(f"{args.task.partition(':')[0]}-{Path(str(args.model)).name}-baselines.jsonl")
    names = problem_ids(task)
    gguf = args.gguf or (args.model if str(args.model).endswith(".gguf") else None)
    if gguf is None and not args.skip_llama:
        from relaxspec.models import registry
        if registry.is_registered(args.model):
            try:
                gguf = registry.cached_path(args.model)  # the model's own file, once `models fetch` put it there
            except ValueError:
                gguf = None  # not fetched: llama.cpp is skipped below
    model = load_model(args.model, dtype=args.dtype) if args.dtype else load_model(args.model)
    tok = model.tokenizer
    ids = encode_prompts(tok, task.prompts, chat_template="auto")
    done = read_done(args.out)
    progress = not args.no_progress
    todo = [i for i, ref in enumerate(names) if (OURS, ref) not in done]
    if len(todo) < len(names):
        print(f"{args.out}: {len(names) - len(todo)} of {len(names)} {OURS} results stored; running the rest")
    run_ours(model, task, ids, todo, args, args.out, done, progress)
    llm, systems = None, [OURS]
    if args.skip_llama:
        print("llama.cpp: skipped (--skip-llama)")
    elif gguf is None or not Path(gguf).is_file():
        print("llama.cpp: skipped (no GGUF file: --gguf FILE)")
    else:
        try:
            llm = llama(str(gguf), args.threads, max(len(x) for x in ids) + args.max_new_tokens + 8)
        except ImportError:
            print("llama.cpp: skipped (llama_cpp is not installed)")
    if llm is not None:
        systems.append(LLAMA)
        todo = [i for i, ref in enumerate(names) if (LLAMA, ref) not in done]
        run_llama(llm, tok, task, ids, todo, args, args.out, done, progress)

    refs = names
    print(f"\n{args.task} greedy {task.metric} score, {len(refs)} problems, model {args.model}"
          f"{f', GGUF {gguf}' if llm is not None else ''}; 95% Wilson intervals")
    print(*header("system", "score %", "ms/token"), sep="\n")
    for system in systems:
        recs = [done[(system, r)] for r in refs]
        tokens = sum(max(1, len(x["token_ids"])) for x in recs)
        ms = 1000 * sum(x["seconds"] for x in recs) / tokens
        print(f"| {system} | {pct(utility_interval([float(x['passed']) for x in recs]))} | {ms:.1f} |")
    ref = REFERENCES.get(args.task, {}).get(Path(str(args.model)).name.split("-instruct")[0].lower())
    print(f"| Qwen2.5-Coder report (bf16, own prompt) | {ref if ref is not None else 'n/a'} | - |")
    if llm is not None:
        differ, scorer = [], None
        for i, r in enumerate(refs):
            a, b = done[(OURS, r)], done[(LLAMA, r)]
            k = divergence(a["token_ids"], b["token_ids"])
            if k is not None:
                common = list(ids[i]) + a["token_ids"][:k]
                if scorer is None:  # a second instance keeping every position's logits, only when needed
                    scorer = llama(str(gguf), args.threads, llm.n_ctx(), logits_all=True)
                differ.append((r, k, ours_gap(model, common), llama_gap(scorer, common), a["passed"], b["passed"]))
        print(f"\n{len(differ)} of {len(refs)} problems differ in tokens "
              f"({sum(d[4] != d[5] for d in differ)} in pass / fail); gap: top-1 minus top-2 logit at the first "
              f"divergence (near-tie: both under {NEAR_TIE:g})")
        if differ:
            print(*header("problem", "first divergence", f"gap {OURS}", f"gap {LLAMA}", "kind",
                          f"passed {OURS} / {LLAMA}"), sep="\n")
            for r, k, g_ours, g_llama, p_ours, p_llama in differ:
                kind = "near-tie" if max(g_ours, g_llama) < NEAR_TIE else "format / disagreement"
                print(f"| {r} | {k} | {g_ours:.2f} | {g_llama:.2f} | {kind} | {p_ours} / {p_llama} |")
    print(f"\nresults: {args.out} (re-run to resume)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

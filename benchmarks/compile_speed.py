"""`--compile` vs eager: compile time, step latencies, and the engine's measured vs modelled speed-up.

    python benchmarks/compile_speed.py                       # built-in pair, CPU, batch 1, AR and strict
    python benchmarks/compile_speed.py --verifier smollm2 --drafters smollm2-drafter,ngram \\
        --methods ar,strict,typical,mentored --batch-sizes 1,32 --device cuda --dtype bfloat16   # the GPU table

For each mode (eager, compiled) it loads the verifier (and each drafter through `load_drafter`, which
compiles an LM drafter with its verifier), then prints:

1. warm-up: the first generate call of each (drafter, method, batch) in compiled mode, which compiles its
   graphs (cold unless --warm-cache: a fresh inductor cache directory per run);
2. step latencies: the verifier's 1-token step and (N+1)-token block and each LM drafter's step, eager vs
   compiled, interleaved rounds (models.measure_step_latencies: medians; thread CPU time on one CPU thread);
3. the speed table: per drafter, batch size, mode and method: tau (with bonus), c_rel, c_block (measured in
   that mode), block-aware modelled speed-up tau / (N c_rel + c_block), measured speed-up vs the same mode's
   AR (batch 1: prompts one at a time, every (mode, method) taking turns prompt by prompt, ratio of median
   per-token times; batch B: one call of B prompts per method, tokens per second), measured / modelled, and
   compiled vs eager at the same method. At T=0 it also checks that compiled tokens equal eager tokens.

On a loaded machine read the ratios (interleaved), not the absolute times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

from harness.options import add


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add(p, verifier="verifier", drafters=("drafter-weak", "comma-separated drafter names (load_drafter)"),
        methods=("ar,strict", "comma-separated; 'ar' is the reference"), draft_length=3, batch_sizes="1",
        prompts=(8, "prompts timed at batch 1 (and the warm-up uses another)"), max_new_tokens=64, temperature=0.0,
        task=("arithmetic", "prompt source: a task name, or 'chat' for chat prompts"))
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None)
    add(p, step_rounds=30, threads=1,
        warm_cache=(False, "use inductor's on-disk cache as set up (default: a fresh one, for cold compile times)"),
        require_equal=(False, "at T=0, exit 1 when compiled tokens differ from eager ones (float32: expected equal)"),
        modes="eager,compiled")
    return p.parse_args(argv)


def prompts_for(task: str, k: int) -> list[str]:
    if task == "chat":  # the held-out chat prompts (20), cycled when more are asked for
        from relaxspec.tasks.chat import HELDOUT
        return [HELDOUT[i % len(HELDOUT)] for i in range(k)]
    from relaxspec.tasks import get_task
    return list(get_task(task, limit=k).prompts)[:k]


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.warm_cache:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-")  # cold compile times
    import torch

    from relaxspec.bench.speedup import block_aware_speedup
    from relaxspec.drafters import load_drafter, measure_draft_latency
    from relaxspec.engine import generate
    from relaxspec.acceptance import get_rule
    from relaxspec.models import load_model, measure_step_latencies
    from relaxspec.models.hf import synchronize
    from relaxspec.names import AR

    torch.set_num_threads(args.threads)
    modes = args.modes.split(",")
    methods = args.methods.split(",")
    if AR not in methods:
        methods.insert(0, AR)
    drafter_names = args.drafters.split(",")
    batches = [int(b) for b in args.batch_sizes.split(",")]
    N = args.draft_length
    prompts = prompts_for(args.task, args.prompts + 1 + max(batches))
    warm, timed, batch_prompts = prompts[0], prompts[1:args.prompts + 1], prompts[1:]
    sampling = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                    top_p=0.95 if args.temperature else None)

    def device_info():
        return torch.cuda.get_device_name() if torch.cuda.is_available() and str(args.device or "").startswith(
            "cuda") else f"cpu, {torch.get_num_threads()} thread(s)"

    print(f"compile_speed: verifier {args.verifier}, drafters {drafter_names}, N={N}, T={args.temperature}, "
          f"max_new_tokens {args.max_new_tokens}, {device_info()}, torch {torch.__version__}")
    models, drafters = {}, {}
    for mode in modes:
        t = time.perf_counter()
        models[mode] = load_model(args.verifier, device=args.device, dtype=args.dtype, compile=mode == "compiled")
        for name in drafter_names:
            drafters[mode, name] = load_drafter(name, models[mode])
        print(f"  loaded {mode} in {time.perf_counter() - t:.1f} s", flush=True)
    device = models[modes[0]].device

    def run(mode, name, method, batch_prompts, seed=0):
        drafter = None if method == AR else drafters[mode, name]
        synchronize(device)
        t = time.perf_counter()
        out = generate(models[mode], drafter, batch_prompts, method=method, draft_length=N if method != AR else 1,
                       seed=seed, **sampling)
        synchronize(device)
        return time.perf_counter() - t, out

    usable = {}  # (name, method) -> True when the drafter can serve the rule
    for name in drafter_names:
        for method in methods:
            try:
                if method != AR:
                    drafters[modes[0], name].check(models[modes[0]], get_rule(method))
                usable[name, method] = True
            except ValueError as e:
                usable[name, method] = False
                print(f"  {name} / {method}: skipped ({e})")

    print("\n1. warm-up (first call per drafter, method and batch size; compiled mode compiles here)")
    for mode in modes:
        for batch in batches:
            for name in drafter_names:
                for method in methods:
                    if not usable[name, method] or (method == AR and name != drafter_names[0]):
                        continue
                    t1, _ = run(mode, name, method, [warm] * batch)
                    t2 = run(mode, name, method, [warm] * batch)[0] if mode == "compiled" else float("nan")
                    print(f"  {mode:9s} b{batch:<3d} {name:16s} {method:10s} first call {t1:7.2f} s, "
                          f"second {t2:6.2f} s", flush=True)

    print(f"\n2. step latencies (ms, medians of {args.step_rounds} interleaved rounds, context 128)")
    steps, labels = [], []
    for mode in modes:
        steps += [(models[mode], 1), (models[mode], N + 1)]
        labels += [(mode, "verifier 1 token"), (mode, f"verifier {N + 1} tokens")]
        for name in drafter_names:
            lm = getattr(drafters[mode, name], "lm", None)
            if lm is not None:
                steps.append((lm, 1))
                labels.append((mode, f"drafter {name} 1 token"))
    for mode in modes:
        if mode == "compiled":
            for lm, _ in steps:
                if lm.compiled:
                    lm.fast.plan(128 + N + 1, (N + 1,))
    times = measure_step_latencies(steps, context=128, rounds=args.step_rounds)
    med = {label: statistics.median(t[i] for t in times) * 1e3 for i, label in enumerate(labels)}
    for what in dict.fromkeys(w for _, w in labels):
        cells = "  ".join(f"{m} {med[m, what]:7.3f}" for m in modes if (m, what) in med)
        ratio = (f"  compiled/eager {med['compiled', what] / med['eager', what]:.2f}"
                 if ("compiled", what) in med and ("eager", what) in med else "")
        print(f"  {what:32s} {cells}{ratio}")
    constants = {}
    for mode in modes:
        i1, ib = labels.index((mode, "verifier 1 token")), labels.index((mode, f"verifier {N + 1} tokens"))
        c_block = statistics.median(t[ib] / t[i1] for t in times)
        for name in drafter_names:
            if (mode, f"drafter {name} 1 token") in labels:
                j = labels.index((mode, f"drafter {name} 1 token"))
                c_rel = statistics.median(t[j] / t[i1] for t in times)
            else:  # MTP head, prompt lookup: per drafted token through the protocol
                c_rel = measure_draft_latency(drafters[mode, name], models[mode]) / (med[mode, "verifier 1 token"] / 1e3)
            constants[mode, name] = (c_rel, c_block)
            print(f"  {mode:9s} {name:16s} c_rel {c_rel:.3f}  c_block {c_block:.3f}")

    print("\n3. speed table (measured: vs AR in the same mode; compiled/eager: the same method's speed)")
    header = (f"  {'drafter':16s} {'batch':>5s} {'mode':9s} {'method':10s} {'tau':>5s} {'c_rel':>6s} "
              f"{'c_block':>7s} {'model':>6s} {'meas':>6s} {'m/m':>5s} {'tok/s':>8s} {'vs eager':>8s}")
    print(header)
    mismatches = compared = 0
    for batch in batches:
        for name in drafter_names:
            runs = [(mode, m) for mode in modes for m in methods if usable[name, m]]
            per_token = {r: [] for r in runs}
            tokens = {r: [] for r in runs}
            taus = {r: [] for r in runs}
            if batch == 1:
                for i, prompt in enumerate(timed):  # every (mode, method) takes turns prompt by prompt
                    outs = {}
                    for r in runs:
                        s, out = run(r[0], name, r[1], [prompt], seed=i)
                        n = max(1, out.stats.generated_tokens)
                        per_token[r].append(s / n)
                        tokens[r].append(n)
                        taus[r].append(out.stats)
                        outs[r] = [x.token_ids for x in out.results]
                    if args.temperature == 0 and "eager" in modes and "compiled" in modes:
                        for m in methods:
                            if usable[name, m]:
                                compared += 1
                                mismatches += outs["eager", m] != outs["compiled", m]
                speed = {r: 1 / statistics.median(per_token[r]) for r in runs}
            else:
                speed = {}
                for r in runs:
                    s, out = run(r[0], name, r[1], batch_prompts[:batch])
                    speed[r] = out.stats.generated_tokens / s
                    taus[r].append(out.stats)
            for mode, m in runs:
                stats = taus[mode, m]
                rounds = sum(s.sequence_rounds for s in stats)
                tau = (rounds + sum(s.drafts_accepted for s in stats)) / rounds if m != AR else 1.0
                c_rel, c_block = constants[mode, name]
                extra = get_rule(m).extra_draft_passes if m != AR else 0
                model = block_aware_speedup(tau, N, c_rel, c_block, extra) if m != AR else 1.0
                meas = speed[mode, m] / speed[mode, AR]
                vs_eager = speed[mode, m] / speed["eager", m] if ("eager", m) in speed else float("nan")
                print(f"  {name:16s} {batch:5d} {mode:9s} {m:10s} {tau:5.2f} {c_rel:6.3f} {c_block:7.3f} "
                      f"{model:6.2f} {meas:6.2f} {meas / model:5.2f} {speed[mode, m]:8.1f} {vs_eager:8.2f}",
                      flush=True)
    if compared:
        print(f"\nT=0: compiled tokens == eager tokens on {compared - mismatches} of {compared} (prompt, method) runs")
    return 1 if mismatches and args.require_equal else 0


if __name__ == "__main__":
    sys.exit(main())

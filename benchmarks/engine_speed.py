"""Engine speed: strict speculative decoding vs autoregressive, measured and modelled, plus HF's peer.

    python benchmarks/engine_speed.py [--prompts 50] [--max-new-tokens 128] [--repeats 3] [--device cuda --dtype bfloat16]
    python benchmarks/engine_speed.py --batch 200 [--draft-lengths 3 5 10] [--temperatures 0.7]

With --batch B: throughput instead of latency, `x batch` = tokens/s of strict over AR on B prompts in one
call, with the caches' compaction of dead slots (relaxspec.models.stream.Stream) on, and off for
comparison (a row then attends over every slot the round's best row added); runs take turns, medians.

Every figure is a ratio measured in this run on the same prompts (batch 1, one prompt at a time, as
speculative decoding is used for latency). Modelled speed-up = tau / (1 + N * c_rel), with c_rel the
measured drafter/verifier step-latency ratio. "overhead" = measured / modelled (1.0 = the engine costs
nothing beyond the model calls the model counts). That model prices the verifier's (N+1)-token block
like a one-token step; "block-aware" = tau / (N * c_rel + c_block), with c_block the measured latency
of that block over a one-token step, shows how much of the gap is the block itself. The HF peer is
`verifier.generate(assistant_model=drafter)` with a constant N and no confidence cut, greedy only.
"""

from __future__ import annotations

import statistics
import time

import torch

from harness.options import add, parser
from relaxspec.engine import generate
from relaxspec.models import load_model, measure_step_latency
from relaxspec.cli.options import add_device_args, device_kwargs
from relaxspec.tasks.synthetic import synthetic_task


def timed_generate(verifier, drafter, prompt, method, n, temperature, max_new_tokens, seed):
    start = time.perf_counter()
    out = generate(verifier, drafter, [prompt], method=method, draft_length=n, max_new_tokens=max_new_tokens,
                   temperature=temperature, top_p=0.95 if temperature else None, seed=seed)
    return time.perf_counter() - start, out.stats


def timed_hf(verifier, drafter, prompt, n, max_new_tokens):
    tok = verifier.tokenizer
    enc = tok(prompt, return_tensors="pt").to(verifier.device)
    start = time.perf_counter()
    with torch.inference_mode():
        verifier.model.generate(**enc, assistant_model=drafter.model, do_sample=False,
                                max_new_tokens=max_new_tokens, num_assistant_tokens=n,
                                num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0,
                                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return time.perf_counter() - start


def time_row(verifier, drafter, prompts, n, temperature, max_new_tokens, with_hf):
    """Seconds of AR, strict (and HF) over the prompts, and strict's tau. The systems take turns prompt by
    prompt, so a change in the machine's speed during the row (these machines drift) hits all of them."""
    seconds = {"ar": 0.0, "strict": 0.0, "hf": 0.0}
    accepted = rounds = 0
    for i, prompt in enumerate(prompts):
        seconds["ar"] += timed_generate(verifier, None, prompt, "ar", 0, temperature, max_new_tokens, i)[0]
        elapsed, stats = timed_generate(verifier, drafter, prompt, "strict", n, temperature, max_new_tokens, i)
        seconds["strict"] += elapsed
        accepted, rounds = accepted + stats.drafts_accepted, rounds + stats.sequence_rounds
        if with_hf:
            seconds["hf"] += timed_hf(verifier, drafter, prompt, n, max_new_tokens)
    return seconds, (rounds + accepted) / rounds


def batch_rows(verifier, drafter, prompts, draft_lengths, temperatures, max_new_tokens, repeats):
    """x batch (strict tokens/s over AR tokens/s on all prompts in one call), compaction on and off."""
    from relaxspec.models.stream import Stream

    print(f"batch {len(prompts)}; max_new_tokens {max_new_tokens}; medians of {repeats} interleaved runs")
    print(f"{'temp':>5} {'N':>3} {'tau':>6} {'x batch':>8} {'no compaction':>14} {'AR tok/s':>9}")
    default_slack = Stream.slack

    def tokens_per_s(method, n, temperature, slack):
        Stream.slack = slack
        try:
            start = time.perf_counter()
            out = generate(verifier, drafter if method != "ar" else None, prompts, method=method, draft_length=n,
                           max_new_tokens=max_new_tokens, temperature=temperature,
                           top_p=0.95 if temperature else None, seed=0)
            return out.stats.generated_tokens / (time.perf_counter() - start), out.stats.mean_acceptance_length
        finally:
            Stream.slack = default_slack

    for temperature in temperatures:
        for n in draft_lengths:
            runs = {"ar": [], "on": [], "off": []}
            tau = 0.0
            for _ in range(repeats):
                runs["ar"].append(tokens_per_s("ar", 0, temperature, default_slack)[0])
                speed, tau = tokens_per_s("strict", n, temperature, default_slack)
                runs["on"].append(speed)
                runs["off"].append(tokens_per_s("strict", n, temperature, 10 ** 9)[0])
            ar = statistics.median(runs["ar"])
            print(f"{temperature:5.1f} {n:3d} {tau:6.2f} {statistics.median(runs['on']) / ar:7.2f}x "
                  f"{statistics.median(runs['off']) / ar:13.2f}x {ar:9.0f}", flush=True)


def main():
    ap = parser(__doc__)
    add(ap, verifier="verifier", drafter="drafter-weak", task="arithmetic", prompts=50, max_new_tokens=128)
    ap.add_argument("--draft-lengths", type=int, nargs="*", default=[3, 5, 8])
    add(ap, repeats=(3, "median over this many repeats of each row"),
        threads=(1, "tiny models run best on one thread"),
        batch=(0, "measure x batch on this many prompts in one call instead"))
    ap.add_argument("--temperatures", type=float, nargs="*", default=[0.0, 0.7])
    add_device_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    verifier, drafter = load_model(args.verifier, **device_kwargs(args)), load_model(args.drafter, **device_kwargs(args))
    verifier.restore_weights(), drafter.restore_weights()  # HF generate runs the transformers models themselves
    if args.batch:
        prompts = synthetic_task(args.task, "test", args.batch).prompts
        batch_rows(verifier, drafter, prompts, args.draft_lengths, args.temperatures, args.max_new_tokens, args.repeats)
        return
    prompts = synthetic_task(args.task, "test", args.prompts).prompts
    # Step latencies measured in turns, several times over, medians: the machine's speed drifts.
    calls = {"verifier": (verifier, 1), "drafter": (drafter, 1)}
    calls.update({n: (verifier, n + 1) for n in args.draft_lengths})
    samples = {key: [] for key in calls}
    for _ in range(5):
        for key, (lm, block) in calls.items():
            samples[key].append(measure_step_latency(lm, block=block))
    latency = {key: statistics.median(v) for key, v in samples.items()}
    step = latency["verifier"]
    c_rel = latency["drafter"] / step
    c_block = {n: latency[n] / step for n in args.draft_lengths}
    print(f"pair {args.verifier} / {args.drafter} on {verifier.device} in {verifier.dtype} ({verifier.backend}); "
          f"{len(prompts)} {args.task} prompts; {args.threads} thread(s); "
          f"verifier step {step * 1e3:.2f} ms; measured c_rel {c_rel:.3f}; c_block "
          + ", ".join(f"N={n}: {c:.2f}" for n, c in c_block.items()))
    print(f"{'temp':>5} {'N':>3} {'tau':>6} {'measured':>9} {'modelled':>9} {'overhead':>9} {'block-aware':>12} "
          f"{'HF peer':>8} {'ours/HF':>8}")
    for temperature in args.temperatures:
        for n in args.draft_lengths:
            ratios, hf_ratios, taus = [], [], []
            for _ in range(args.repeats):
                seconds, tau = time_row(verifier, drafter, prompts, n, temperature, args.max_new_tokens,
                                        with_hf=temperature == 0.0)
                ratios.append(seconds["ar"] / seconds["strict"])
                taus.append(tau)
                if temperature == 0.0:
                    hf_ratios.append(seconds["ar"] / seconds["hf"])
            measured, tau = statistics.median(ratios), statistics.median(taus)
            modelled = tau / (1 + n * c_rel)
            hf = f"{statistics.median(hf_ratios):8.2f}" if hf_ratios else f"{'-':>8}"
            vs_hf = f"{measured / statistics.median(hf_ratios):8.2f}" if hf_ratios else f"{'-':>8}"
            block_aware = tau / (n * c_rel + c_block[n])
            print(f"{temperature:5.1f} {n:3d} {tau:6.2f} {measured:8.2f}x {modelled:8.2f}x {measured / modelled:9.2f} "
                  f"{block_aware:11.2f}x {hf} {vs_hf}", flush=True)


if __name__ == "__main__":
    main()

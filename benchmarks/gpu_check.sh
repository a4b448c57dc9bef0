#!/usr/bin/env bash
# GPU check (never part of CI, which has no GPU): one device call of at most 8 minutes, at most 64 MiB carried.
#
#   here, once:       bash benchmarks/gpu_stage.sh split            # SmolLM2's GGUF in two halves under .dev/
#   device call 1:    carry [".dev/gguf-a"]  command: bash benchmarks/gpu_stage.sh receive      (seconds)
#   device call 2, at once (the machine keeps call 1's files only while warm, ~30 s):
#                     carry [".dev/gguf-b"]  command: bash benchmarks/gpu_check.sh 2>&1 | tee $OUT/gpu_check.log
#                     (timeout_s 540; PYTHONUNBUFFERED is set here)
#   without SmolLM2 (one call, nothing carried): SMOLLM2=0 bash benchmarks/gpu_check.sh
#   a dry run of every step here, on the CPU, with tiny sizes: DEVICE=cpu bash benchmarks/gpu_check.sh
#   some steps only: STEPS="tests correctness table table-big pair" (default: all but pair, which is a call of its own)
#
# Steps, each under its own time limit (100 + 100 + 160 + 100 s; the whole script stops by 470 s):
# 1. CUDA-only tests (tests/project/test_cuda.py: bf16 defaults, strict greedy == AR greedy in float32, CPU/CUDA
#    agreement, every rule sampling in bf16, PAD, SmolLM2 in bf16);
# 2. correctness on the device in float32: strict greedy == AR greedy and a Monte Carlo test of strict
#    sampling (tests/engine/test_engine.py), compiled == eager token for token, no recompile after warm-up, compiled
#    strict lossless by Monte Carlo (tests/models/test_compiled.py: CUDA graphs);
# 3. the speed table in bfloat16 at T=0.7, top-p 0.95 (benchmarks/compile_speed.py): AR, strict, typical and mentored with
#    smollm2-drafter and ngram on SmolLM2, batch 1 and 32, eager vs --compile: tau, c_rel, c_block, modelled
#    (block-aware) vs measured speed-up, compile (warm-up) times and step latencies.
# 4. the real pair (Qwen2.5-Coder-1.5B-Instruct, drafter its 0.5B; docs/real-pair.md), relaxspec AR and strict with
#    the 0.5B and ngram in bfloat16 (benchmarks/real_pair_peer.py --device cuda, 3 + 3 prompts, 64 tokens), only
#    where the device machine holds both GGUF files: REAL_PAIR_DIR=DIR with the two files in it (or
#    REAL_PAIR_VERIFIER / REAL_PAIR_DRAFTER, any model references). Under the current limits it does not: the files
#    are 1.61 GB (1.12 + 0.49), a call carries at most 64 MiB, the device machine reaches no package registry (no
#    `relaxspec models fetch` there), and it keeps what earlier calls carried only while it stays warm (~30 s between
#    calls): the pair would take 26 calls of 64 MiB chunk wheels in a row, each costing a start and a transfer of
#    a device loan's 15 minutes. It needs a larger carry limit, a registry or model hub reachable from
#    the device, or a disk that persists between calls. A call of its own (the steps above take the whole budget):
#    STEPS=pair REAL_PAIR_DIR=DIR bash benchmarks/gpu_check.sh; without the files it prints one line and passes.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEV=${DEVICE:-cuda}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
status=0
# Each step's limit is cut to what is left of BUDGET (seconds for the whole script, 470: under 8 minutes).
# wants NAME: whether STEPS (default: every step) names it.
wants() { [ -z "${STEPS:-}" ] || [[ " $STEPS " == *" $1 "* ]]; }
step() { local limit=$(( $1 * SCALE )) name=$2; shift 2
         local left=$(( ${BUDGET:-470} * SCALE - SECONDS )); [ "$left" -lt "$limit" ] && limit=$left
         [ "$limit" -ge 10 ] || { status=1; echo "--- SKIPPED (no time left): $name"; return; }
         echo; echo "=== $name (limit ${limit} s)"; local t=$SECONDS
         timeout "$limit" "$@"; local rc=$?; [ "$rc" -eq 0 ] || { status=1; echo "--- FAILED ($rc): $name"; }
         echo "--- $name: $(( SECONDS - t )) s"; }

if [ "$DEV" = cuda ]; then
    "$PY" -c "import torch, sys; ok = torch.cuda.is_available(); print('CUDA:', torch.cuda.get_device_name() if ok else 'none', '| torch', torch.__version__); sys.exit(0 if ok else 1)" \
        || { echo "gpu_check: no CUDA device" >&2; exit 1; }
    DTYPE=bfloat16; BIG=32; PROMPTS=6; NEW=64; ROUNDS=20; SCALE=1
else  # dry run: the same steps on the CPU, small, with longer limits (a CPU compiles and samples slowly)
    DTYPE=float32; BIG=4; PROMPTS=2; NEW=16; ROUNDS=3; SCALE=${SCALE:-4}
fi
# One inductor cache for the run: cold at first (compile times are honest), shared by the two table steps.
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-$(mktemp -d /tmp/inductor-XXXX)}

# SmolLM2 from the two carried halves (gpu_stage.sh), when it is not installed already.
SMOL=${SMOLLM2:-1}
if [ "$SMOL" = 1 ]; then
    staged=$(bash benchmarks/gpu_stage.sh ensure) && eval "$staged" \
        || { echo "gpu_check: SmolLM2 not available (carry .dev/gguf-a then .dev/gguf-b, see gpu_stage.sh); its parts are skipped"; SMOL=0; }
fi
if [ "$SMOL" = 1 ] && [ "$DEV" = cuda ]; then
    VERIFIER=smollm2; DRAFTERS=smollm2-drafter,ngram; TASK=chat
else  # the built-in pair (and, on the CPU, SmolLM2's compile would take minutes)
    VERIFIER=verifier; DRAFTERS=drafter-mtp,ngram; TASK=arithmetic
fi

if ! wants tests; then :
elif [ "$DEV" = cuda ]; then
    step 100 "CUDA-only tests (bf16 and float32)" "$PY" -m pytest -q -p no:cacheprovider -x tests/project/test_cuda.py
else
    step 60 "CUDA-only tests (all skip without CUDA: collection only)" "$PY" -m pytest -q -p no:cacheprovider tests/project/test_cuda.py
fi
wants correctness && step 100 "correctness on $DEV in float32: strict greedy == AR greedy, Monte Carlo strict; compiled == eager" \
    env RELAXSPEC_DEVICE="$DEV" RELAXSPEC_DTYPE=float32 "$PY" -m pytest -q -p no:cacheprovider \
    tests/models/test_compiled.py "tests/engine/test_engine.py::test_greedy_strict_equals_ar_batch_one_and_ragged" \
    "tests/engine/test_engine.py::test_sampled_strict_matches_ar_sampling"
# T=0.7, top-p 0.95 (the bench's sampling): at T=0 typical and mentored are strict. Batch 1 and batch $BIG in two
# steps, so that a time-out in the second keeps the first's table.
TABLE=("$PY" benchmarks/compile_speed.py --device "$DEV" --dtype "$DTYPE" --verifier "$VERIFIER" --drafters "$DRAFTERS"
       --methods ar,strict,typical,mentored --prompts "$PROMPTS" --max-new-tokens "$NEW" --temperature 0.7
       --task "$TASK" --step-rounds "$ROUNDS" --threads 1 --warm-cache)
wants table && step 160 "speed table on $DEV ($DTYPE), batch 1: $VERIFIER with $DRAFTERS, eager vs --compile" "${TABLE[@]}" --batch-sizes 1
wants table-big && step 100 "speed table on $DEV ($DTYPE), batch $BIG" "${TABLE[@]}" --batch-sizes "$BIG"
# The real pair, where this machine holds its files (see step 4 above).
PAIR_V=${REAL_PAIR_VERIFIER:-${REAL_PAIR_DIR:-/nonexistent}/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf}
PAIR_D=${REAL_PAIR_DRAFTER:-${REAL_PAIR_DIR:-/nonexistent}/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf}
pair_here() { [ -n "${REAL_PAIR_VERIFIER:-}" ] || { [ -f "$PAIR_V" ] && [ -f "$PAIR_D" ]; }; }
if [ -z "${STEPS:-}" ]; then  # (the steps above take the whole budget)
    echo; echo "=== the real pair: a call of its own, STEPS=pair with REAL_PAIR_DIR (see the header)"
elif ! wants pair; then :
elif pair_here; then
    [ "$DEV" = cuda ] && PAIR_ARGS=(--code-prompts 3 --chat-prompts 3 --max-new-tokens 64) \
        || PAIR_ARGS=(--code-prompts 1 --chat-prompts 1 --max-new-tokens 12)
    step 150 "the real pair on $DEV ($DTYPE): AR, strict with the drafter and ngram" "$PY" benchmarks/real_pair_peer.py \
        --device "$DEV" --verifier "$PAIR_V" --drafter "$PAIR_D" --formats "$DTYPE" --threads 1 \
        --draft-lengths 3 5 auto --rounds "$ROUNDS" --no-progress --no-llamacpp "${PAIR_ARGS[@]}"
else
    echo; echo "=== the real pair: not run (its 1.61 GB of GGUF files are not on this machine: set REAL_PAIR_DIR; a call" \
        "carries at most 64 MiB and the device reaches no registry, see the header)"
fi
echo
if [ "$status" -eq 0 ]; then echo "gpu_check: all steps passed ($SECONDS s)"; else echo "gpu_check: some step FAILED, see above ($SECONDS s)"; fi
exit "$status"

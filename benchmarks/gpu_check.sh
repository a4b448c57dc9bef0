#!/usr/bin/env bash
# GPU check (not part of CI, which has no GPU): on a CUDA machine without network access, run the tests that
# apply on CUDA, then the engine speed table on CUDA in bfloat16. Budget: under 10 minutes.
#
#     bash benchmarks/gpu_check.sh            # uses .venv/bin/python (the README's install), or $PYTHON
#
# 1. tests/test_cuda.py: CUDA-only checks (defaults bf16 + transformers on CUDA, strict greedy == AR greedy in
#    float32, CPU/CUDA agreement, the fast path on CUDA, every rule sampling in bf16, PAD, SmolLM2 in bf16);
# 2. the engine / CLI / GGUF tests with every default-loaded model on CUDA in float32 (RELAXSPEC_DEVICE,
#    RELAXSPEC_DTYPE: exact-equality tests need float32; bfloat16 rounds differently per block size);
# 3. benchmarks/engine_speed.py --device cuda --dtype bfloat16 on a short run, printing its table.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HF_HUB_OFFLINE=1
"$PY" -c "import torch, sys; ok = torch.cuda.is_available(); print('CUDA:', torch.cuda.get_device_name() if ok else 'none'); sys.exit(0 if ok else 1)" \
    || { echo "gpu_check: no CUDA device" >&2; exit 1; }
status=0
step() { echo; echo "=== $1"; shift; "$@" || status=1; }
step "CUDA-only tests" timeout 240 "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda.py
step "engine, CLI and GGUF tests on CUDA (float32)" env RELAXSPEC_DEVICE=cuda RELAXSPEC_DTYPE=float32 \
    timeout 180 "$PY" -m pytest -q -p no:cacheprovider tests/test_engine.py tests/test_cli.py tests/test_gguf.py
step "engine speed on CUDA, bfloat16" timeout 150 "$PY" benchmarks/engine_speed.py --device cuda --dtype bfloat16 \
    --prompts 10 --max-new-tokens 64 --repeats 1 --draft-lengths 3 5
echo
if [ "$status" -eq 0 ]; then echo "gpu_check: all steps passed"; else echo "gpu_check: some step FAILED (see above)"; fi
exit "$status"

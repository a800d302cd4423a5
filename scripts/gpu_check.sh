#!/usr/bin/env bash
# End-to-end GPU check of the OllieOptimize pass: build a small conv / conv-transpose model for
# CUDA (TVM default pipeline vs. the ollie build), run both on cuda:0, compare and time them.
#
#   scripts/gpu_check.sh            # on a machine with a CUDA GPU
#   scripts/gpu_check.sh --no-run   # dry run anywhere: build + export only
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
exec "$PYTHON" scripts/gpu_check.py "$@"

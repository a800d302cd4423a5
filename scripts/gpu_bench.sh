#!/usr/bin/env bash
# Benchmark on a CUDA GPU: TVM (default dlight pipeline, or MetaSchedule with --trials N),
# PyTorch eager, torch.compile and ONNX Runtime (CUDA provider) where installed.
# Without a GPU the TVM column is still built (compile time reported) and the rest are skipped.
#
#   scripts/gpu_bench.sh --quick                     # all models, small sizes
#   scripts/gpu_bench.sh --models infogan longformer --trials 64
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
exec "$PYTHON" -m tvm_ollie.bench --target cuda --out "${OUT:-bench_results_cuda}" "$@"

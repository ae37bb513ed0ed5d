#!/usr/bin/env bash
# The GPU suite on a GPU host with only the TVM runtime (the runtime-only path, kept until the
# in-process one, scripts/gpu_session.sh with tests/test_gpu_suite.py and bench/gpu_suite.py, has
# run on a GPU; docs/development.md):
#   here:  ../shared/gpu/make-bundle && python scripts/build_gpu_suite.py --arch sm_90a --pack
#   there: bash scripts/gpu_suite.sh            (carry .gpu and build/gpu.tar.xz)
cd "$(dirname "$0")/.."
# enter.sh filters pip's output through grep, which exits 1 when pip is quiet: source it before
# strict mode.
source .gpu/enter.sh
set -euo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-build/gpu-results}
if [ -f build/gpu.tar.xz ]; then tar -xJf build/gpu.tar.xz -C build; fi
# Kernel tuning, when a profiler was built (python -m relax_cutlass tune build ...; carry build/tune.tar.xz):
# the records go to $out/tuning.jsonl for the next build here (RELAX_CUTLASS_TUNING_DB / tuning_db=).
if [ -f build/tune.tar.xz ]; then
  tar -xJf build/tune.tar.xz -C build
  mkdir -p "$out"
  python3 -m relax_cutlass tune run build/tune "$out/tuning.jsonl"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv
if python3 -c "import pytest" 2>/dev/null; then
  python3 -m pytest -q -m gpu tests/test_gpu.py -p no:cacheprovider || echo "GPU pytest suite FAILED"
else
  echo "pytest not installed here: run_gpu_suite.py performs the same checks"
fi
python3 scripts/run_gpu_suite.py build/gpu "$out" "$@"

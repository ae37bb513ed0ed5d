#!/usr/bin/env bash
# Build here everything one GPU session needs, sized to what can be carried (64 MiB with .gpu/).
#
#   round 1: bash scripts/prepare_gpu_run.sh              -> build/gpu.tar.xz (+ build/tune.tar.xz)
#            on the GPU: OUT=$OUT bash scripts/gpu_suite.sh   (tunes first, then checks + benchmarks)
#   round 2: bash scripts/prepare_gpu_run.sh --tuning-db tuning.jsonl
#            -> the benchmark sections again, with tuned variants next to the heuristic's kernels
#
# SECTIONS (env) picks the suite sections; the default is every section except the tile sweep.
set -euo pipefail
cd "$(dirname "$0")/.."
py=.venv/bin/python
tuning_db=""
if [ "${1:-}" = "--tuning-db" ]; then tuning_db=$2; fi
sections=${SECTIONS:-"tests conv graphs frontends bench model conv_bench resnet bert"}
[ -d .gpu ] || PYTHON=$py ../shared/gpu/make-bundle
only=(); for s in $sections; do only+=(--only "$s"); done
if [ -z "$tuning_db" ]; then
  $py -m relax_cutlass tune build --model bert --model bench --model conv_bench --model resnet50 \
    --model bert_large --arch sm_90a --out build/tune
  tar -cf - -C build tune/profile.json tune/profiler.so | xz -6 -T0 > build/tune.tar.xz
  $py scripts/build_gpu_suite.py --arch sm_90a "${only[@]}" --pack
else
  rm -f build/tune.tar.xz  # already tuned: gpu_suite.sh must not tune again
  $py scripts/build_gpu_suite.py --arch sm_90a "${only[@]}" --tuning-db "$tuning_db" --pack
fi
du -ch .gpu build/gpu.tar.xz build/tune.tar.xz 2>/dev/null | tail -1

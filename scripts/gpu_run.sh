#!/usr/bin/env bash
# The GPU host's batch of work (tests, the zoo, benchmarks), with the whole TVM there (../shared/gpu/README.md):
#
#   here:   PYTHON=.venv/bin/python ../shared/gpu/make-full-bundle
#   call 1: bash .gpufull/compiler/install.sh                          carry [".gpufull/compiler"]
#   call 2: bash scripts/gpu_run.sh build                          carry [".gpufull/rest"]
#   call 3: bash scripts/gpu_run.sh check time                     carry [".gpufull/rest"]
# (add build/tuning-carry and build/kernel-carry to carry to reuse an earlier machine's tuning
# records and kernel objects: see below)
#
# Stages (in the order given; calls back to back on one machine, since build/ lives only there):
#   build   the zoo's build phase (every model imported, offloaded, built and exported, ZOO_JOBS at a
#           time, torch.compile's caches filled) beside the GPU tests' kernels compiled into the
#           object cache (bench/gpu_suite.py --phase prewarm) and the suite benchmarks' libraries
#           (bench/gpu_suite.py --phase build)
#   check   the README's first command (python3 -m relax_cutlass) and the GPU pytest files
#           (tests/test_gpu_suite.py builds and checks every correctness case in-process)
#   time    the zoo's time phase (one model at a time, nothing else running) and its table, then the
#           suite benchmarks (bench/gpu_suite.py --phase run: $OUT/gpu_results.json for bench/publish.py)
#   zoo     build then time, for ZOO_MODELS only (a quick re-run after a fix)
#   memcheck  one inference of each built ZOO_MODELS library under compute-sanitizer memcheck
#           (scripts/memcheck_zoo.py: $OUT/memcheck.json)
#   parallel  tensor parallelism over this host's GPUs: tests/test_gpu_parallel.py, then
#           bench/tensor_parallel.py (TP_ARGS; $OUT/tensor_parallel.json)
#   bench   the commands in BENCH (';'-separated), one after another, each logged to $out/bench-N.log
# Environment: ZOO_MODELS, ZOO_JOBS, ZOO_BUILDS (which TVM builds), ZOO_PROFILE (relax_cutlass's
# profile= for the zoo (ZOO_TORCH_COMPILE=0: no torch.compile columns): never (default), auto, which tunes on the GPU (use ZOO_JOBS=1), or auto:a+b to tune models a, b only), GPU_SUITE=0 (no suite prewarm,
# build or run), SUITE_SECTIONS (bench/gpu_suite.py --only sections; default its own), SUITE_TUNING_DB
# (tuned builds too; also GPU_SUITE_TUNING_DB for the tests), MAIN_JOB=0, GPU_TESTS (pytest arguments, shell-quoted), SLOW_TESTS=0 (not the -m slow compile tests),
# PROBE (arguments of scripts/precision_probe.py, run beside the build), SASS_TABLE=0 (no
# scripts/sass_table.py beside the build). Kernel objects are cached in build/kernel-cache
# (RELAX_CUTLASS_CACHE_DIR) across stages and calls on one machine.
# Logs and JSON go to $OUT (default build/run); a short table is printed last.
#
# A call ends after 10 minutes and kills what it started, so long stages can run detached:
#   bash scripts/gpu_run.sh --detach build check time   starts them detached (setsid: they outlive
#        the call; logs in build/run), then waits like --wait
#   bash scripts/gpu_run.sh --wait                      waits (up to GPU_WAIT_S, default 540 s)
#        for the detached run, then copies build/run to $OUT and prints its summary
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ ${1:-} == --detach || ${1:-} == --wait ]]; then
  mkdir -p build/run
  if [[ $1 == --detach ]]; then
    shift
    rm -f build/run/done
    OUT=build/run setsid nohup bash -c "bash scripts/gpu_run.sh $* > build/run/summary.log 2>&1; \
      touch build/run/done" > /dev/null 2>&1 < /dev/null &
    echo $! > build/run/pid
  elif [[ ! -f build/run/done ]] && ! kill -0 "$(cat build/run/pid 2>/dev/null || echo none)" 2>/dev/null; then
    # a machine that idled out comes back bare: nothing to wait for, so say so instead of waiting
    echo "no detached run on this machine (a fresh one?): start it again with --detach"
    exit 3
  fi
  deadline=$((SECONDS + ${GPU_WAIT_S:-540}))
  while [[ ! -f build/run/done && $SECONDS -lt $deadline ]]; do sleep 5; done
  # $OUT brings back at most 8 files: one archive of the logs and records, and the zoo's JSON
  if [[ -n ${OUT:-} && $OUT != build/run ]]; then
    tar czf "$OUT/run.tgz" build/run \
      $(ls build/zoo/*/record.json build/zoo/*/imported.relax.py build/zoo/*.build.log build/zoo/pdl_ab.json 2>/dev/null)
    cp build/run/zoo.json build/run/gpu_results.json build/run/tuning.jsonl "$OUT"/ 2>/dev/null
    # the kernel objects compiled so far, for the next machine (carry build/kernel-carry): kept
    # only under $OUT's 16 MiB a file, so without what is cheap to redo and never hit again (the
    # linked module and profiler objects, ld -r of the kernels; the sources, written on a miss)
    if [[ -d build/kernel-cache ]]; then
      tar czf "$OUT/kernel-cache.tgz" --exclude='*.tmp' --exclude='*.cu' --exclude='*.cc' \
        --exclude='relax_cutlass_module-*.o' --exclude='relax_cutlass_profiler-*.o' -C build kernel-cache 2>/dev/null
      [[ $(stat -c %s "$OUT/kernel-cache.tgz") -gt 16000000 ]] && rm -f "$OUT/kernel-cache.tgz"
    fi
  fi
  if [[ -f build/run/done ]]; then cat build/run/summary.log; else
    echo "still running after $SECONDS s; logs so far:"; tail -n 3 build/run/*.log; fi
  exit 0
fi
source .gpufull/rest/enter.sh || exit $?
# Pure-Python packages the host may lack (torch.onnx's dynamo exporter needs onnxscript and onnx_ir,
# which the zoo's "_onnx" entries use): carry build/pydeps (here: copy them out of .venv's
# site-packages); used only where the host cannot import onnxscript itself.
if [[ -d build/pydeps ]] && ! python3 -c "import onnxscript" 2>/dev/null; then
  export PYTHONPATH=$PYTHONPATH:$PWD/build/pydeps
fi
# The bundle ships CUTLASS's examples/41 only; the SM90 attention kernels include examples/88:
# carry build/cutlass-examples too (here: cp -r <the wheel's cutlass_library/source/examples/88_hopper_fmha>
# build/cutlass-examples/) and it is put beside 41 in the bundle's cutlass_library.
if [[ -d build/cutlass-examples ]]; then
  site_examples=$(python3 -c "import cutlass_library, os; print(os.path.join(os.path.dirname(cutlass_library.__file__), 'source', 'examples'))")
  cp -rn build/cutlass-examples/. "$site_examples"/
fi
out=${OUT:-build/run}
mkdir -p "$out" build
models=${ZOO_MODELS:-$(python3 -c "from relax_cutlass.testing.zoo import ZOO; print(','.join(e.name for e in ZOO))")}
jobs=${ZOO_JOBS:-4}
# ZOO_TORCH_COMPILE=0: the zoo without torch.compile's columns (a short device budget)
torch_compile=--torch-compile
[[ ${ZOO_TORCH_COMPILE:-1} == 0 ]] && torch_compile=""
summary=()
export RELAX_CUTLASS_CACHE_DIR=${RELAX_CUTLASS_CACHE_DIR:-$PWD/build/kernel-cache}
# Tuning records travel between machines: carry build/tuning-carry (a tuning.jsonl brought back from
# an earlier call's $OUT) and profile="auto" times only the problems it lacks; every stage's records
# are copied back to $out/tuning.jsonl at the end.
mkdir -p "$RELAX_CUTLASS_CACHE_DIR"
# Kernel objects travel too (nvcc was most of a 17-minute GPU test run): carry
# build/kernel-carry/kernel-cache.tgz, an earlier call's $OUT/kernel-cache.tgz; objects are keyed
# by their source, flags and toolchain, so only unchanged kernels are reused.
if [[ -f build/kernel-carry/kernel-cache.tgz && ! -f $RELAX_CUTLASS_CACHE_DIR/.carried ]]; then
  tar xzf build/kernel-carry/kernel-cache.tgz -C "$RELAX_CUTLASS_CACHE_DIR" --strip-components=1 \
    && touch "$RELAX_CUTLASS_CACHE_DIR/.carried"
fi
if [[ -f build/tuning-carry/tuning.jsonl && ! -f $RELAX_CUTLASS_CACHE_DIR/tuning.jsonl ]]; then
  cp build/tuning-carry/tuning.jsonl "$RELAX_CUTLASS_CACHE_DIR/tuning.jsonl"
fi
# The suite checks and times the heuristic's kernels, as CI's builds pick them: no profiling (with a
# GPU present, profile="auto" would tune every case, over 20 minutes; tests/conftest.py does the same).
suite=(env RELAX_CUTLASS_PROFILE=never python3 bench/gpu_suite.py)
suite_args=(--out build/gpu-bench)
for s in ${SUITE_SECTIONS:-}; do suite_args+=(--only "$s"); done
[[ -n ${SUITE_TUNING_DB:-} ]] && suite_args+=(--tuning-db "$SUITE_TUNING_DB")

run_build() {
  local t0=$SECONDS suite_pid=""
  if [[ ${GPU_SUITE:-1} == 1 ]]; then
    # the GPU tests' kernels first (check builds every case from them), then the benchmarks' libraries
    { "${suite[@]}" --phase prewarm --only tests --only conv --only graphs --only frontends --only attention \
        && "${suite[@]}" --phase build "${suite_args[@]}"; } > "$out/suite-build.log" 2>&1 &
    suite_pid=$!
  fi
  [[ -n ${PROBE:-} ]] && { python3 scripts/precision_probe.py $PROBE > "$out/probe.log" 2>&1 & }
  # every arch spelling's kernels built and their SASS read (no GPU needed; nvcc on this host's cores)
  [[ ${SASS_TABLE:-1} == 1 ]] && { python3 scripts/sass_table.py --json "$out/sass.json" > "$out/sass.log" 2>&1 & }
  python3 bench/zoo.py --phase build --models "$models" --jobs "$jobs" $torch_compile --out build/zoo \
    --profile "${ZOO_PROFILE:-never}" --builds "${ZOO_BUILDS:-relax_cutlass,relax_cutlass_graph,tvm_default,tvm_default_graph}" > "$out/zoo-build.log" 2>&1
  if [[ -n $suite_pid ]]; then wait $suite_pid && summary+=("suite build: ok") || summary+=("suite build: FAILED (suite-build.log)"); fi
  wait
  cat build/zoo/*.build.log > "$out/zoo-build-models.log" 2>/dev/null
  grep "^=== build" "$out/zoo-build.log"
  [[ -f $out/sass.log ]] && { tail -n 25 "$out/sass.log"; summary+=("sass table: $(tail -1 "$out/sass.log")"); }
  summary+=("build stage: $((SECONDS - t0)) s")
}

run_check() {
  local t0=$SECONDS
  if [[ ${MAIN_JOB:-1} == 1 ]]; then
    python3 -m relax_cutlass > "$out/main-job.log" 2>&1 && summary+=("main job: ok") || summary+=("main job: FAILED")
  fi
  tail -5 "$out/main-job.log"
  # GPU_TESTS is parsed as shell words, so quoted pytest arguments (-k "a or b") stay whole
  local tests=(tests/test_gpu_suite.py tests/test_gpu.py tests/test_gpu_host.py tests/test_gpu_depthwise.py
    tests/test_gpu_grouped.py tests/test_gpu_conv_sm90.py tests/test_gpu_pdl.py tests/test_gpu_attention_op.py
    tests/test_gpu_attention_sm90.py tests/test_gpu_softcap.py tests/test_gpu_norm.py tests/test_gpu_gated_mlp.py
    tests/test_gpu_channel_affine.py)
  [[ -n ${GPU_TESTS:-} ]] && eval "tests=($GPU_TESTS)"
  python3 -m pytest -q -m gpu "${tests[@]}" -p no:cacheprovider --durations=15 > "$out/gpu-pytest.log" 2>&1
  summary+=("gpu pytest: $(tail -1 "$out/gpu-pytest.log")")
  grep -E "FAILED|Error" "$out/gpu-pytest.log" | head -20
  # the Hopper and Blackwell compile tests CI deselects (pytest -m slow: nvcc only, on this host's cores)
  if [[ ${SLOW_TESTS:-1} == 1 ]]; then
    local workers=()
    python3 -c "import xdist" 2>/dev/null && workers=(-n 8)
    python3 -m pytest -q -m slow "${workers[@]}" -p no:cacheprovider > "$out/slow-pytest.log" 2>&1
    summary+=("slow pytest: $(tail -1 "$out/slow-pytest.log")")
    grep -E "FAILED|Error" "$out/slow-pytest.log" | head -10
  fi
  summary+=("check stage: $((SECONDS - t0)) s")
}

run_time() {
  local t0=$SECONDS
  python3 bench/zoo.py --phase time --models "$models" $torch_compile --out build/zoo > "$out/zoo-time.log" 2>&1
  cp build/zoo/zoo.json "$out/zoo.json" 2>/dev/null
  if [[ ${GPU_SUITE:-1} == 1 ]]; then
    "${suite[@]}" --phase run "${suite_args[@]}" > "$out/suite-bench.log" 2>&1 \
      && summary+=("suite benchmarks: ok") || summary+=("suite benchmarks: FAILED (suite-bench.log)")
    cp build/gpu-bench/gpu_results.json "$out/" 2>/dev/null
    sed -n '/^correctness:/,$p' "$out/suite-bench.log"
  fi
  summary+=("time stage: $((SECONDS - t0)) s")
}

run_memcheck() {
  # one inference of each ZOO_MODELS library (built by the build stage) under compute-sanitizer
  local t0=$SECONDS names
  IFS=',' read -ra names <<< "$models"
  python3 scripts/memcheck_zoo.py build/zoo "${names[@]}" --json "$out/memcheck.json" > "$out/memcheck.log" 2>&1
  summary+=("memcheck: $(tail -1 "$out/memcheck.log") ($((SECONDS - t0)) s)")
}

run_parallel() {
  # tensor parallelism over this host's GPUs (a multi-GPU kind): the GPU tests in a pytest of their
  # own (a failing disco worker ends its process), then bench/tensor_parallel.py (TP_ARGS: its options)
  local t0=$SECONDS
  export NCCL_NVLS_ENABLE=0
  python3 -m pytest -q -m gpu tests/test_gpu_parallel.py -p no:cacheprovider > "$out/parallel-pytest.log" 2>&1
  summary+=("parallel pytest: $(tail -1 "$out/parallel-pytest.log")")
  python3 bench/tensor_parallel.py ${TP_ARGS:-} --out "$out/tensor_parallel.json" > "$out/tensor-parallel.log" 2>&1 \
    && summary+=("tensor parallel bench: ok") || summary+=("tensor parallel bench: FAILED (tensor-parallel.log)")
  sed -n '/^| shape/,$p' "$out/tensor-parallel.log"
  summary+=("parallel stage: $((SECONDS - t0)) s")
}

run_bench() {
  # BENCH: commands separated by ';', run one after another (nothing else on the GPU while timing)
  local t0=$SECONDS i=0 cmd
  IFS=';' read -ra cmds <<< "${BENCH:-}"
  for cmd in "${cmds[@]}"; do
    i=$((i + 1))
    bash -c "$cmd" > "$out/bench-$i.log" 2>&1
    summary+=("bench $i ($cmd): exit $?")
    tail -n 40 "$out/bench-$i.log"
  done
  summary+=("bench stage: $((SECONDS - t0)) s")
}

for stage in "$@"; do
  case $stage in
    build) run_build ;;
    check) run_check ;;
    time) run_time ;;
    zoo) run_build; run_time ;;
    bench) run_bench ;;
    memcheck) run_memcheck ;;
    parallel) run_parallel ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  # after every stage, so that a call cut off later still brings the tuning back
  cp "$RELAX_CUTLASS_CACHE_DIR/tuning.jsonl" "$out/tuning.jsonl" 2>/dev/null
done
cp "$RELAX_CUTLASS_CACHE_DIR/tuning.jsonl" "$out/tuning.jsonl" 2>/dev/null
printf '%s\n' "${summary[@]}"
if [ -f build/zoo/zoo.json ]; then sed -n '/^| model/,$p' "$out/zoo-time.log"; fi

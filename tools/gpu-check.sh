#!/usr/bin/env bash
# Build for one GPU arch, run the CPU + GPU test suites, compute-sanitizer, and the benchmarks.
# Usage: tools/gpu-check.sh [steps...]   steps: build upstream test sanitize bench python pyhost hf ddp all (default: all)
#        and, named only: limits conv-upstream conv-golden conv-bench decode-lean roofline collectives
#        serving-ts blocks-profile kprof ab bars baseline
# Env: OUT (log dir, default ./gpu-check-out), ARCH (default 9.0), JOBS (default nproc), CMAKE_ARGS (more options
#      for the build step's configure, e.g. -DSELSCAN_TORCH_OPS=ON),
#      GOLDEN (golden vectors dir, default tests/data/golden), BENCH_FILTER (default all).
#      DDP_GPUS (ranks for the ddp step, default 2, or 1 when only one GPU is visible).
#      PACK=1: at the end, every file in $OUT but summary.txt, env.txt and the Markdown tables into $OUT/logs.tar.gz.
#      UPSTREAM_SRC: a checkout of state-spaces/mamba (inside the tree when the tree is copied to the GPU machine,
#      e.g. an ignored .upstream/): step `upstream` builds its selective_scan_cuda into $BUILD/upstream
#      (bench/build_upstream.py), and pyhost / hf time it beside selscan.
#      SANITIZERS, SANITIZE_FILTER (default '-GpuLimits*'), SANITIZE_TIMEOUT (seconds per tool and pass).
#      SANITIZE_SET=serving: step `sanitize` runs the four tools over the serving, block-state, destination-slot and
#      decode tests alone, default kernel choice only (the small test shapes take the warp-scan serving variant; step
#      serving-ts runs the thread-states serving instances forced), in about seven minutes on an H200. memcheck (150 s) and initcheck (100 s): GpuVarlen*, GpuBlockStates* and every decode
#      test (*GpuStateUpdate*: the 232-entry Matrix/ too, on the default plan), without LongSequencesConditionReport
#      (float64 work on the host) and the tests forcing every decode kernel over the matrix or over Mamba-2's pool
#      shape (past the cap under memcheck; SmallGridsEveryKernel forces every kernel on small shapes): 253 tests,
#      about 100 s each on an H200 (run 67). synccheck (120 s): the same but the decode matrix, the tests forcing every decode kernel over it or
#      over Mamba-2's pool shape, and the general kernel's two large shapes (the smaller named decode tests take the
#      same barriers and kernels). SANITIZERS picks tools (default all four).
#      racecheck, the slowest tool (60 s): one test per kernel (serving forward and backward, block-state forward,
#      the decode step in place and with destinations, one and several tokens). A tool that reaches its cap reports
#      rc=124 with the tests it finished: raise the caps with SANITIZE_TIMEOUT (seconds, every tool).
# Run it on a clean export of a commit (`git archive HEAD | tar -x -C dir`) when others edit the tree.
# Step `limits` is not part of all (name it): the size-limit, non-finite and multi-GPU tests, DISABLED_ ones
# included (GpuLimits*:GpuMulti*; up to ~58 GiB of device memory, a few minutes; GpuMulti skips on one GPU).
# causal-conv1d beside selscan's conv1d, steps not part of all either:
#   conv-upstream  CONV_UPSTREAM_SRC (a causal-conv1d checkout or `git archive` export, inside the tree when the
#                  tree is copied to the GPU machine, e.g. an ignored .upstream-conv/): its causal_conv1d_cuda built
#                  into $BUILD/conv-upstream (bench/build_causal_conv1d.py; ptxas lines in conv-upstream-build.log);
#                  or CONV_UPSTREAM_BUILD, an earlier build's folder, reused (CONV_UPSTREAM_PARTS: see below)
#   conv-golden    tests/data/conv1d_golden/make_goldens.py with that build: $OUT/conv1d_golden.tar.gz (unpack it
#                  with `tar -xzf conv1d_golden.tar.gz -C tests/data`), exit 2 when a case was left out
#   conv-bench     selscan_bench's conv1d/ rows (conv-bench.json) and bench/upstream_conv1d.py's (conv-upstream.json)
#                  at CONV_BENCH_FILTER (default ^conv1d/), side by side in conv-table.md (bench/conv1d_table.py)
# Step `roofline`, not part of all either: the forward's roofline levels (bench/roofline; docs/performance.md,
#   "Roofline micro-benchmark") at ROOFLINE_ARGS (default: the issue's 8x1536x2048:16), roofline.txt and
#   roofline.json; with ncu first a profile of one launch per level (roofline-ncu.csv), whose instruction counts
#   the table then shows.
# Step `collectives`, not part of all either: CUB's warp collectives against the kernels' hand-written scans, sums and
#   row loads/stores (bench/collectives; docs/performance.md, "CUB collectives against the hand-written ones") at
#   COLLECTIVES_ARGS (default none: 4096 iterations, 11 repeats), collectives.txt and collectives.json (exit 1 when a
#   variant fails its float64 check); with ncu first a profile of one launch per variant (collectives-ncu.csv), whose
#   instruction counts the table then shows; and the static SASS counts of every variant's loop (collectives-sass.txt).
# Step `serving-ts`, not part of all either: the thread-states forward's serving instances (packed/pool and block
#   mode), which serving calls of real size take by default and the small test shapes only with SELSCAN_FWD_KERNEL=ts:
#   GpuVarlen* and GpuBlockStates* with it forced, memcheck and racecheck over them forced (SANITIZE_TIMEOUT caps
#   each, default 150 s), then gpu_varlen/fwd with the default choice and with SELSCAN_FWD_KERNEL=warp (the warp-scan
#   serving variant), alternated twice, medians side by side in serving-ts.md.
# Step `ab`, not part of all either: this tree's selscan_bench rows beside other trees' (AB_TREE, one or more exports
#   inside this tree, separated by spaces; AB_PATCH, patch files applied to copies of this tree), alternated
#   AB_ROUNDS times over AB_FILTER, in ab.md (the JSON files and build logs in ab-logs.tar.gz); with AB_CLI, the
#   `selscan` commands with those arguments (';' between commands) from every tree's build, alternated likewise, in
#   ab-cli.txt.
# Step `bars`, not part of all either: the default kernel choice against each kernel forced on BARS_SHAPES (the
#   grids either side of the choice's thresholds), `selscan bench` alternated BARS_ROUNDS times, in bars.md.
# Step `baseline`, not part of all either: issue #20's table with upstream timed in the same run (selscan_bench's issue
#   rows and bench/upstream_kernels.py in turn, BASELINE_ROUNDS times, default 2; needs the `upstream` step's build),
#   in baseline.md (bench/report.py --upstream-json).
# Step `kprof`, not part of all either: ncu's source counters of one launch each of the thread-states forward and
#   backward on one benchmark row (KPROF_ROW, default bf16/8x1536x2048:16), and bench/sass_regions.py's
#   instructions per state update by opcode and loop region (kprof-<mode>.txt; docs/performance.md).
# Step `blocks-profile`, not part of all either: ncu on the first forward launch of gpu_varlen's pool and blocks256
#   rows (skewed32; the thread-states kernel by default, the warp-scan one with SELSCAN_FWD_KERNEL=warp): launch,
#   speed-of-light, instruction, occupancy and warp-state sections in blocks-profile-<row>.txt, for the block-state
#   overhead (docs/serving.md).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/gpu-check-out}
ARCH=${ARCH:-9.0}
JOBS=${JOBS:-$(nproc)}
BUILD=${BUILD:-build/gpu-check}
GOLDEN=${GOLDEN:-$PWD/tests/data/golden}
steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1; }
named() { for s in "${steps[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }  # steps outside all
mkdir -p "$OUT"
summary=()
note() { summary+=("$1"); echo "== $1"; }

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet 2>/dev/null || echo ' (+local changes)')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
  nvcc --version | tail -1
} | tee "$OUT/env.txt"

if want build; then
  t0=$(date +%s)
  # shellcheck disable=SC2086  # CMAKE_ARGS is a list of options
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSELSCAN_WITH_CUDA=ON \
      -DSELSCAN_CUDA_ARCH_LIST="$ARCH" -DSELSCAN_GOLDEN_DIR="$GOLDEN" -DSELSCAN_BUILD_TESTS=ON ${CMAKE_ARGS:-} \
      >"$OUT/configure.log" 2>&1 && cmake --build "$BUILD" -j"$JOBS" >"$OUT/build.log" 2>&1; then
    note "build OK ($(( $(date +%s) - t0 )) s, arch $ARCH)"
  else
    note "build FAILED"; tail -40 "$OUT/build.log" "$OUT/configure.log"; printf '%s\n' "${summary[@]}"; exit 1
  fi
fi

if want upstream; then
  if [ -n "${UPSTREAM_SRC:-}" ]; then
    t0=$(date +%s)
    python3 bench/build_upstream.py "$UPSTREAM_SRC" --out "$BUILD/upstream" --arch "$ARCH" --jobs "$JOBS" \
      >"$OUT/upstream-build.log" 2>&1
    note "upstream selective_scan_cuda build rc=$? ($(( $(date +%s) - t0 )) s, upstream-build.log)"
  else
    note "upstream: UPSTREAM_SRC not set (the side-by-side rows need selective_scan_cuda on PYTHONPATH)"
  fi
fi
# An upstream build from this or an earlier run is what pyhost and hf compare against.
if [ -d "$BUILD/upstream" ]; then
  PYTHONPATH="$(cd "$BUILD/upstream" && pwd)${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONPATH
fi

if want test; then
  ctest --test-dir "$BUILD" -L gpu --output-on-failure -j4 >"$OUT/ctest-gpu.log" 2>&1
  note "ctest -L gpu: $(grep -E 'tests passed|tests failed' "$OUT/ctest-gpu.log" | tail -1)"
  ctest --test-dir "$BUILD" -LE gpu --output-on-failure -j"$JOBS" >"$OUT/ctest-cpu.log" 2>&1
  note "ctest (non-gpu): $(grep -E 'tests passed|tests failed' "$OUT/ctest-cpu.log" | tail -1)"
  grep -E '^\s*[0-9]+/[0-9]+ Test.*(Failed|\*\*\*)' "$OUT"/ctest-*.log | head -20
fi

if want sanitize; then
  # Every tool over everything but the size and non-finite tests (the GpuLimits* ones take minutes under these
  # tools), then the forward and backward tests again with the thread-states kernels forced (the small test shapes
  # otherwise run the warp-scan kernels). SANITIZE_TIMEOUT caps each tool's run (seconds).
  gpu_tests=$(find "$BUILD" -name 'selscan_tests_gpu' -type f -perm -u+x | head -1)
  if [ -n "$gpu_tests" ] && [ "${SANITIZE_SET:-}" = serving ]; then
    # memcheck and initcheck: every serving and decode test but the two that force each decode kernel over many large
    # cases: the 232-entry matrix (past any cap under memcheck, run 62) and Mamba-2's pool shape (12 cases at 7.9 M
    # states, 125 s under memcheck alone, run 66); every kernel still runs under them forced over the small shapes
    # (SmallGridsEveryKernel), the matrix with the default plan. A value-parameterised test's full name starts with its instantiation's ("Matrix/"): the
    # patterns name it with a leading '*'.
    all='GpuVarlen*:GpuBlockStates*:*GpuStateUpdate*-GpuVarlen.LongSequencesConditionReport'
    all+=':*/GpuStateUpdate.EveryKernelForcedMatchesTheOracle/*:GpuStateUpdateShapes.Mamba2LeanKernelWithAPool'
    # synccheck: the named tests without the two large shapes of the general kernel (45 s of the cap under this
    # tool; the smaller named tests take the same barriers), the lean kernel's pool shape kept
    named='GpuVarlen*:GpuBlockStates*:GpuStateUpdate*-GpuVarlen.LongSequencesConditionReport'
    named+=':GpuStateUpdateShapes.Mamba2HeadsShape:GpuStateUpdateDst.Mamba2HeadsShapeAtWidth'
    # and the tests that force every decode kernel over many cases (the matrix, Mamba-2's pool shape): one small-grid
    # test per form stays (Mamba-1 and Mamba-2 at Bt 1 and 2, every kernel forced)
    named+=':*/GpuStateUpdate.EveryKernelForcedMatchesTheOracle/*:GpuStateUpdateShapes.Mamba2LeanKernelWithAPool'
    one_each='GpuVarlen.PoolSlotsAndPadding:GpuBlockStates.BadEntriesGiveNaNAndTouchNoSlot'
    one_each+=':GpuStateUpdateDst.MatchesTheCpuPath:GpuStateUpdateShapes.Mamba2HeadsShape'
    one_each+=':*GpuStateUpdate.MatchesTheOracle/mamba1_xfp32_statefp32'
    for spec in memcheck:150 initcheck:100 synccheck:120 racecheck:60; do
      tool=${spec%%:*}
      [[ " ${SANITIZERS:-memcheck initcheck synccheck racecheck} " == *" $tool "* ]] || continue
      case $tool in
        synccheck) f=$named ;;
        racecheck) f=$one_each ;;
        *) f=$all ;;
      esac
      log="$OUT/sanitizer-$tool-serving.log"
      timeout "${SANITIZE_TIMEOUT:-${spec#*:}}" compute-sanitizer --tool "$tool" --error-exitcode 9 "$gpu_tests" \
        --gtest_filter="$f" >"$log" 2>&1
      rc=$?
      note "compute-sanitizer $tool (serving set): rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1), $(grep -c '^\[       OK' "$log") tests OK, $(grep -cE '^\[  FAILED  \] .* \([0-9]+ ms\)$' "$log") failed"
    done
  elif [ -n "$gpu_tests" ]; then
    filter=${SANITIZE_FILTER:-'-GpuLimits*'}
    for tool in ${SANITIZERS:-memcheck racecheck synccheck initcheck}; do
      for kernel in auto ts; do
        f=$filter
        [ "$kernel" = ts ] && f='*GpuFwd*:GpuStreams*:BwdGpu*:*BwdGolden*'
        log="$OUT/sanitizer-$tool-$kernel.log"
        SELSCAN_FWD_KERNEL=$kernel SELSCAN_BWD_KERNEL=$kernel timeout "${SANITIZE_TIMEOUT:-600}" compute-sanitizer --tool "$tool" \
          --error-exitcode 9 "$gpu_tests" --gtest_filter="$f" >"$log" 2>&1
        rc=$?
        note "compute-sanitizer $tool (kernels $kernel, $f): rc=$rc, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" | tail -1), $(grep -c '^\[       OK' "$log") tests OK"
      done
    done
  else
    note "sanitize: no selscan_tests_gpu binary"
  fi
fi

if want bench; then
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  if [ -n "$bench" ]; then
    "$bench" --benchmark_filter="${BENCH_FILTER:-.}" --benchmark_format=json --benchmark_out="$OUT/bench.json" \
      --benchmark_out_format=json >"$OUT/bench.txt" 2>&1
    note "bench rc=$? (bench.json)"
  else
    note "bench: no selscan_bench binary"
  fi
fi

if want python; then
  lib=$(find "$BUILD" -maxdepth 2 -name 'libselscan.so' | head -1)
  # pytest-xdist, where importable, spreads the suite over 4 workers (about half the time on an H200)
  pypath=$PWD/python${PYTHONPATH:+:$PYTHONPATH}
  xdist=(); PYTHONPATH=$pypath python3 -c 'import xdist' 2>/dev/null && xdist=(-n 4)
  SELSCAN_LIBRARY=$PWD/$lib SELSCAN_GOLDEN_DIR=$GOLDEN PYTHONPATH=$pypath python3 -m pytest -q "${xdist[@]}" python/tests \
    >"$OUT/pytest.log" 2>&1
  note "pytest: $(tail -1 "$OUT/pytest.log")"
fi

if want pyhost; then
  # bench/python_host.py: host cost per call, latency and back-to-back loops through selscan.torch (and upstream's
  # selective_scan_cuda when it is importable from PYTHONPATH), then the decode step's host cost.
  lib=$(find "$BUILD" -maxdepth 2 -name 'libselscan.so' | head -1)
  SELSCAN_LIBRARY=$PWD/$lib PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} python3 bench/python_host.py \
    --json "$OUT/python_host.json" >"$OUT/python_host.txt" 2>&1
  note "python_host rc=$? (python_host.txt)"
  SELSCAN_LIBRARY=$PWD/$lib PYTHONPATH=$PWD/python python3 bench/bench_decode_host.py >"$OUT/decode_host.txt" 2>&1
  note "bench_decode_host rc=$? (decode_host.txt)"
fi

if want hf; then
  # examples/transformers_mamba.py --bench (bench/transformers_model.py): MambaForCausalLM at the mamba-130m shape,
  # upstream's fast path (UPSTREAM_SRC's mamba_ssm with the `upstream` and `conv-upstream` steps' builds, when all
  # three are there), selscan's enable(), and the model's own path (needs transformers).
  lib=$(find "$BUILD" -maxdepth 2 -name 'libselscan.so' | head -1)
  up=()
  if [ -n "${UPSTREAM_SRC:-}" ] && [ -d "$BUILD/upstream" ] && [ -d "$BUILD/conv-upstream" ]; then
    up=(--upstream-path "$(cd "$UPSTREAM_SRC" && pwd):$(cd "$BUILD/upstream" && pwd):$(cd "$BUILD/conv-upstream" && pwd)")
  fi
  SELSCAN_LIBRARY=$PWD/$lib PYTHONPATH=$PWD/python${PYTHONPATH:+:$PYTHONPATH} python3 examples/transformers_mamba.py \
    --bench "${up[@]}" >"$OUT/hf.txt" 2>&1
  note "transformers bench rc=$? (hf.txt)"
fi

if want ddp; then
  # examples/ddp_mamba.py: one DDP step over NCCL vs the same step on one GPU (needs torch and transformers).
  lib=$(find "$BUILD" -maxdepth 2 -name 'libselscan.so' | head -1)
  ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  nproc=${DDP_GPUS:-$(( ngpu >= 2 ? 2 : 1 ))}
  SELSCAN_LIBRARY=$PWD/$lib PYTHONPATH=$PWD/python python3 -m torch.distributed.run --standalone \
    --nproc_per_node="$nproc" examples/ddp_mamba.py >"$OUT/ddp.log" 2>&1
  note "ddp ($nproc GPU): rc=$?, $(grep -E '^(PASS|FAIL)$' "$OUT/ddp.log" | tail -1)"
fi

# causal-conv1d's build (upstream of selscan's conv1d), its golden vectors and its benchmark rows. CONV_UPSTREAM_BUILD:
# a folder holding an earlier build's causal_conv1d_cuda*.so and causal_conv1d/ package (what step conv-upstream
# leaves in $BUILD/conv-upstream) used instead of building again (4-7 minutes); CONV_UPSTREAM_PARTS=1 makes step
# conv-upstream also write the .so to $OUT in two parts (conv-upstream.so.part.00/01, each under 16 MiB, for a
# machine that copies back only small files: `cat` them together) and the package as conv-upstream-pkg.tgz.
case $BUILD in /*) conv_pp=$BUILD/conv-upstream ;; *) conv_pp=$PWD/$BUILD/conv-upstream ;; esac
if [ -n "${CONV_UPSTREAM_BUILD:-}" ]; then conv_pp=$(cd "$CONV_UPSTREAM_BUILD" && pwd); fi
if named conv-upstream; then
  if [ -n "${CONV_UPSTREAM_BUILD:-}" ]; then
    note "conv-upstream: using the build in $conv_pp (CONV_UPSTREAM_BUILD)"
  elif [ -n "${CONV_UPSTREAM_SRC:-}" ]; then
    t0=$(date +%s)
    python3 bench/build_causal_conv1d.py "$CONV_UPSTREAM_SRC" --out "$conv_pp" --arch "$ARCH" --jobs "$JOBS" \
      --verbose >"$OUT/conv-upstream-build.log" 2>&1
    note "conv-upstream: causal_conv1d_cuda build rc=$? ($(( $(date +%s) - t0 )) s, conv-upstream-build.log)"
    so=$(ls "$conv_pp"/causal_conv1d_cuda*.so 2>/dev/null | head -1)
    if [ "${CONV_UPSTREAM_PARTS:-0}" = 1 ] && [ -n "$so" ]; then
      split -n 2 -d "$so" "$OUT/conv-upstream.so.part." && tar -czf "$OUT/conv-upstream-pkg.tgz" -C "$conv_pp" causal_conv1d
      note "conv-upstream: $(basename "$so") in two parts and the package in \$OUT (cat the parts into that name)"
    fi
  else
    note "conv-upstream: CONV_UPSTREAM_SRC not set (a causal-conv1d checkout; steps conv-golden and conv-bench need it)"
  fi
fi
if named conv-golden; then
  PYTHONPATH="$conv_pp${PYTHONPATH:+:$PYTHONPATH}" python3 tests/data/conv1d_golden/make_goldens.py --out "$OUT" \
    >"$OUT/conv-golden.log" 2>&1
  note "conv-golden: make_goldens rc=$? ($(tail -1 "$OUT/conv-golden.log"))"
fi
if named conv-bench; then
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  if [ -n "$bench" ]; then
    "$bench" --benchmark_filter="${CONV_BENCH_FILTER:-^conv1d/}" --benchmark_out="$OUT/conv-bench.json" \
      --benchmark_out_format=json >"$OUT/conv-bench.log" 2>&1
    note "conv-bench: selscan rows rc=$? (conv-bench.json)"
  else
    note "conv-bench: no selscan_bench binary"
  fi
  PYTHONPATH="$conv_pp${PYTHONPATH:+:$PYTHONPATH}" python3 bench/upstream_conv1d.py \
    --filter "${CONV_BENCH_FILTER:-^conv1d/}" --json "$OUT/conv-upstream.json" >>"$OUT/conv-bench.log" 2>&1
  note "conv-bench: upstream rows rc=$? (conv-upstream.json)"
  if [ -f "$OUT/conv-bench.json" ] && [ -f "$OUT/conv-upstream.json" ]; then
    python3 bench/conv1d_table.py "$OUT/conv-bench.json" "$OUT/conv-upstream.json" --out "$OUT/conv-table.md" \
      >>"$OUT/conv-bench.log" 2>&1
    note "conv-bench: table rc=$? (conv-table.md)"
  fi
fi

# The decode step's lean kernel with fp32 state (8 states, 32 bytes a lane), which the default plan does not pick
# until it has been measured: the decode GPU tests with it forced, then the decode benchmark rows with the default
# plan and with it forced (decode-default.json / decode-lean.json), in one run.
if named decode-lean; then
  gpu_tests=$(find "$BUILD" -name 'selscan_tests_gpu' -type f -perm -u+x | head -1)
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  if [ -n "$gpu_tests" ]; then
    SELSCAN_DECODE_KERNEL=lean "$gpu_tests" --gtest_filter='*StateUpdate*' >"$OUT/decode-lean-tests.log" 2>&1
    note "decode-lean: GPU decode tests with the lean kernel forced rc=$?, $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/decode-lean-tests.log" | tr -s ' ' | tr '\n' ' ')"
  fi
  if [ -n "$bench" ]; then
    for k in default lean; do
      SELSCAN_DECODE_KERNEL=$k "$bench" --benchmark_filter='^decode/cuda/' --benchmark_out="$OUT/decode-$k.json" \
        --benchmark_out_format=json >"$OUT/decode-$k.log" 2>&1
      note "decode-lean: bench rows, SELSCAN_DECODE_KERNEL=$k rc=$? (decode-$k.json)"
    done
  fi
fi

# profiled_table NAME BINARY FILTER METRICS FALLBACK ARGS...: an ncu profile of `BINARY --profile ARGS` (kernels
# matching FILTER; METRICS, or FALLBACK where that ncu lacks one of them) into $OUT/NAME-ncu.csv, then the table,
# `BINARY ARGS --ncu-csv <that csv> --json $OUT/NAME.json`, into $OUT/NAME.txt (without instruction counts when
# there is no ncu or its profile failed).
profiled_table() {
  local name=$1 bin=$2 filter=$3 metrics=$4 fallback=$5 ncu_bin m rc csv="$OUT/$1-ncu.csv" ncu_arg=()
  shift 5
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  if [ -n "$ncu_bin" ]; then
    : >"$OUT/$name-ncu.log"
    for m in "$metrics" "$fallback"; do
      [ -n "$m" ] || continue
      "$ncu_bin" --csv --print-units base --clock-control none --metrics "$m" -k "$filter" \
        --log-file "$csv" "$bin" --profile "$@" >>"$OUT/$name-ncu.log" 2>&1
      rc=$?
      [ $rc -eq 0 ] && grep -q '"Metric Name"' "$csv" 2>/dev/null && break
    done
    note "$name: ncu profile rc=$rc ($name-ncu.csv, $name-ncu.log)"
    grep -q '"Metric Name"' "$csv" 2>/dev/null && ncu_arg=(--ncu-csv "$csv")
  else
    note "$name: no ncu (PATH, /usr/local/cuda/bin): the table has no instruction counts"
  fi
  "$bin" "$@" "${ncu_arg[@]}" --json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1
  note "$name rc=$? ($name.txt, $name.json)"
}

if named roofline; then
  roofline=$(find "$BUILD" -name 'selscan_roofline' -type f -perm -u+x | head -1)
  if [ -z "$roofline" ]; then
    note "roofline: no selscan_roofline binary"
  else
    # shellcheck disable=SC2206  # ROOFLINE_ARGS is a list of options
    rargs=(${ROOFLINE_ARGS:-})
    # The fallback: an ncu that lacks one of the optional metrics gets the two the instruction count needs.
    profiled_table roofline "$roofline" 'regex:roofline_|fwd_ts_kernel|fwd_warp_kernel' \
      'smsp__inst_executed.sum,smsp__inst_executed_pipe_xu.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_elapsed.avg,dram__bytes.sum,gpu__time_duration.sum' \
      'smsp__inst_executed.sum,sm__cycles_elapsed.avg' "${rargs[@]}"
  fi
fi

if named collectives; then
  [ -f "$BUILD/build.ninja" ] && cmake --build "$BUILD" --target selscan_collectives >"$OUT/collectives-build.log" 2>&1
  coll=$(find "$BUILD" -name 'selscan_collectives' -type f -perm -u+x | head -1)
  if [ -z "$coll" ]; then
    note "collectives: no selscan_collectives binary (run the build step first)"
  else
    # shellcheck disable=SC2206  # COLLECTIVES_ARGS is a list of options
    cargs=(${COLLECTIVES_ARGS:-})
    profiled_table collectives "$coll" 'regex:coll_kernel|rows_kernel' smsp__inst_executed.sum '' "${cargs[@]}"
    cuobjdump_bin=$(command -v cuobjdump || ls /usr/local/cuda/bin/cuobjdump 2>/dev/null || true)
    if [ -n "$cuobjdump_bin" ]; then
      "$cuobjdump_bin" -sass "$coll" | python3 bench/collectives/sass_loops.py >"$OUT/collectives-sass.txt" 2>&1
      note "collectives: static SASS counts rc=$? (collectives-sass.txt)"
    fi
  fi
fi

if named serving-ts; then
  gpu_tests=$(find "$BUILD" -name 'selscan_tests_gpu' -type f -perm -u+x | head -1)
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  if [ -z "$gpu_tests" ] || [ -z "$bench" ]; then
    note "serving-ts: no selscan_tests_gpu or selscan_bench binary (run the build step first)"
  else
    SELSCAN_FWD_KERNEL=ts "$gpu_tests" --gtest_filter='GpuVarlen*:GpuBlockStates*' >"$OUT/serving-ts-tests.log" 2>&1
    note "serving-ts: GpuVarlen*:GpuBlockStates* forced rc=$?, $(grep -E '^\[  (PASSED  |FAILED  )\] [0-9]' "$OUT/serving-ts-tests.log" | tr -s ' ' | tr '\n' ' ')"
    for tool in memcheck racecheck; do
      filter='GpuVarlen*:GpuBlockStates*-GpuVarlen.LongSequencesConditionReport'
      [ $tool = racecheck ] && filter='GpuVarlen.PackedMatchesOracle:GpuVarlen.PoolSlotsAndPadding:GpuBlockStates.MatchesOracleAndCpu'
      SELSCAN_FWD_KERNEL=ts timeout "${SANITIZE_TIMEOUT:-150}" compute-sanitizer --tool $tool --error-exitcode 9 \
        "$gpu_tests" --gtest_filter="$filter" >"$OUT/serving-ts-$tool.log" 2>&1
      note "serving-ts: $tool forced rc=$? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/serving-ts-$tool.log" | tail -1)"
    done
    for round in 1 2; do
      for kernel in default warp; do
        force=(); [ $kernel = warp ] && force=(SELSCAN_FWD_KERNEL=warp)
        env "${force[@]}" "$bench" --benchmark_filter='gpu_varlen/fwd' \
          --benchmark_repetitions=3 --benchmark_report_aggregates_only=true --benchmark_out_format=json \
          --benchmark_out="$OUT/serving-ts-$kernel-$round.json" >/dev/null 2>&1
      done
    done
    python3 - "$OUT"/serving-ts-*-*.json >"$OUT/serving-ts.md" <<'PY'
import os, sys
sys.path.insert(0, "bench")
import report  # bench/report.py: the medians of a selscan_bench JSON file, in ms
best = {}
for path in sys.argv[1:]:
    kernel = os.path.basename(path).split("-")[2]
    for key, v in report.load(path, kernel)["results"].items():
        row = "/".join(k for k in key[:4] if k)
        best[row, kernel] = min(best.get((row, kernel), float("inf")), v["ms"])
print("| row (ms, median of 3, better of 2 rounds) | default | SELSCAN_FWD_KERNEL=warp |\n|---|---:|---:|")
for row in sorted({r for r, _ in best}):
    print("| %s | %.3f | %.3f |" % (row, best.get((row, "default"), float("nan")), best.get((row, "warp"), float("nan"))))
PY
    note "serving-ts: gpu_varlen/fwd default vs warp-scan rc=$? (serving-ts.md)"
  fi
fi

if named blocks-profile; then
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  if [ -z "$bench" ] || [ -z "$ncu_bin" ]; then
    note "blocks-profile: no selscan_bench binary or no ncu"
  else
    for row in pool blocks256; do
      "$ncu_bin" --kernel-name 'regex:fwd_(ts|warp)_kernel' --launch-count 1 --section LaunchStats --section SpeedOfLight \
        --section InstructionStats --section WarpStateStats --section MemoryWorkloadAnalysis --section Occupancy \
        "$bench" --benchmark_filter="gpu_varlen/fwd_infer/$row/skewed32" --benchmark_min_time=0.001s \
        >"$OUT/blocks-profile-$row.txt" 2>&1
      note "blocks-profile: $row rc=$? (blocks-profile-$row.txt)"
    done
  fi
fi

if named kprof; then
  # Where the thread-states kernels' instructions go on one benchmark row: ncu's source counters of one launch of
  # each, exported as SASS with execution counts (kprof-<mode>.csv.gz), the details page (kprof-<mode>-details.txt),
  # and bench/sass_regions.py's table of instructions per state update by opcode and by loop region
  # (kprof-<mode>.txt). KPROF_ROW: the row's itype/shape (default bf16/8x1536x2048:16, issue #20's row 1);
  # KPROF_MODES: mode:kernel pairs (default the inference forward and the backward).
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  krow=${KPROF_ROW:-bf16/8x1536x2048:16}
  ncu_bin=$(command -v ncu || ls /usr/local/cuda/bin/ncu 2>/dev/null || true)
  if [ -z "$bench" ] || [ -z "$ncu_bin" ]; then
    note "kprof: needs selscan_bench and ncu"
  else
    for spec in ${KPROF_MODES:-fwd_infer:fwd_ts_kernel bwd:bwd_ts_kernel}; do
      mode=${spec%%:*}; kern=${spec#*:}
      "$ncu_bin" --clock-control none --section SourceCounters --section InstructionStats --section WarpStateStats \
        --section SpeedOfLight --section Occupancy --section LaunchStats -k "regex:$kern" -c 1 -f \
        -o "$OUT/kprof-$mode" "$bench" --benchmark_filter="^gpu/$mode/$krow/" >"$OUT/kprof-$mode-run.log" 2>&1
      rc=$?
      "$ncu_bin" --import "$OUT/kprof-$mode.ncu-rep" --page source --csv --print-source sass >"$OUT/kprof-$mode.csv" 2>&1
      "$ncu_bin" --import "$OUT/kprof-$mode.ncu-rep" --page details >"$OUT/kprof-$mode-details.txt" 2>&1
      python3 bench/sass_regions.py "$OUT/kprof-$mode.csv" --shape "${krow#*/}" >"$OUT/kprof-$mode.txt" 2>&1
      note "kprof $mode ($kern, $krow): ncu rc=$rc, $(sed -n 2p "$OUT/kprof-$mode.txt")"
      gzip -f "$OUT/kprof-$mode.csv"
      rm -f "$OUT/kprof-$mode.ncu-rep"
    done
  fi
fi

if named ab; then
  # This tree's benchmark rows beside other trees': AB_TREE, one or more exports of other commits inside this tree,
  # separated by spaces (e.g. `git archive cand | tar -x -C .cand`, ignored folders), each one's selscan_bench built for
  # $ARCH into $BUILD-ab-<folder name> (kept, so a later call with the same folder rebuilds nothing), or, where the
  # tree has its own build from its gpu-check.sh build step (<tree>/$BUILD, tests and apps in it), that one brought up
  # to date; the binaries alternated AB_ROUNDS times (default 2: one pass over the default rows takes about 90 s on an
  # H200, so a build and 3 rounds overrun a 10-minute call) over AB_FILTER (default the issue #20 table's rows,
  # ^gpu/(fwd|fwd_infer|bwd)/), 3 repetitions each; the better median of the rounds per row and tree, and each other
  # tree's ratio to this one, in ab.md. A kernel change is kept when its rows win here and its tests pass on its own
  # commit.
  # AB_PATCH: patch files (e.g. validation/candidates/*.patch), each applied to a copy of this tree's files in
  # build/ab-src/<patch name> and measured like an AB_TREE folder; the copy is made again only when the patch or this
  # tree's files changed, so its build is reused on a machine that keeps build/. No folder needs carrying.
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  # shellcheck disable=SC2206  # AB_TREE is a list of folders
  trees=(${AB_TREE:-})
  bins=("$bench")
  clis=("$BUILD/selscan")  # the command-line program beside each selscan_bench, for AB_CLI
  ok=1
  files() { git ls-files -z --cached --others --exclude-standard; }  # this tree's files, ignored ones left out
  [ -n "${AB_PATCH:-}" ] && tree_sum=$(files | xargs -0 sha1sum 2>/dev/null | sha1sum)  # once for every patch
  for pf in ${AB_PATCH:-}; do
    src=build/ab-src/$(basename "$pf" .patch)
    stamp="$(sha1sum <"$pf") $tree_sum"
    if [ "$(cat "$src/.ab-stamp" 2>/dev/null)" != "$stamp" ]; then
      rm -rf "$src" && mkdir -p "$src" &&
        files | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$src"
      # outside any repository, so that git apply patches the copy's files as plain files
      if (cd "$src" && GIT_CEILING_DIRECTORIES=$(dirname "$PWD") git apply -p1 "$OLDPWD/$pf") >"$OUT/ab-patch.log" 2>&1
      then echo "$stamp" >"$src/.ab-stamp"
      else note "ab: $pf does not apply to this tree (ab-patch.log)"; ok=0
      fi
    fi
    trees+=("$src")
  done
  if [ ${#trees[@]} -eq 0 ] || [ -z "$bench" ]; then
    note "ab: needs AB_TREE or AB_PATCH and this tree's build"; ok=0
  fi
  for i in "${!trees[@]}"; do
    [ $ok = 1 ] || break
    tree=${trees[$i]}
    if [ ! -d "$tree" ]; then
      note "ab: $tree is not a directory"; ok=0; break
    fi
    t0=$(date +%s)
    own=0  # the tree's own build keeps the configuration its build step gave it
    if [[ $BUILD != /* ]] && [ -f "$tree/$BUILD/CMakeCache.txt" ]; then
      bdir=$tree/$BUILD; own=1
    else
      bdir=$BUILD-ab-$(basename "$tree" | tr -c 'A-Za-z0-9_\n-' _)
    fi
    if { [ $own = 1 ] || cmake -S "$tree" -B "$bdir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSELSCAN_WITH_CUDA=ON \
           -DSELSCAN_CUDA_ARCH_LIST="$ARCH" -DSELSCAN_BUILD_TESTS=OFF >"$OUT/ab-configure.log" 2>&1; } &&
       cmake --build "$bdir" -j"$JOBS" --target selscan_bench selscan_app >"$OUT/ab-build.log" 2>&1; then
      note "ab: $tree built in $bdir ($(( $(date +%s) - t0 )) s)"
      bins+=("$(find "$bdir" -name 'selscan_bench' -type f -perm -u+x | head -1)")
      clis+=("$bdir/selscan")
    else
      note "ab: the build of $tree failed (ab-build.log)"; ok=0
    fi
  done
  if [ $ok = 1 ]; then
    for round in $(seq 1 "${AB_ROUNDS:-2}"); do
      for i in "${!bins[@]}"; do
        "${bins[$i]}" --benchmark_filter="${AB_FILTER:-^gpu/(fwd|fwd_infer|bwd)/}" --benchmark_repetitions=3 \
          --benchmark_report_aggregates_only=true --benchmark_out_format=json \
          --benchmark_out="$OUT/ab-$i-$round.json" >/dev/null 2>&1
      done
    done
    python3 - "${trees[*]}" "$OUT"/ab-[0-9]*-*.json >"$OUT/ab.md" <<'PY'
import os, sys
sys.path.insert(0, "bench")
import report  # bench/report.py: the medians of a selscan_bench JSON file, in ms
names = ["this tree"] + sys.argv[1].split()
best = {}
for path in sys.argv[2:]:
    side = int(os.path.basename(path).split("-")[1])
    for key, v in report.load(path, str(side))["results"].items():
        row = "/".join(k for k in key[:4] if k)
        best[row, side] = min(best.get((row, side), float("inf")), v["ms"])
print("| row (ms, median of 3, better of the rounds) | " + " | ".join(names) +
      "".join(" | %s / this" % n for n in names[1:]) + " |")
print("|---" + "|---:" * (2 * len(names) - 1) + "|")
for row in sorted({r for r, _ in best}):
    ms = [best.get((row, i), float("nan")) for i in range(len(names))]
    print("| %s | " % row + " | ".join("%.4f" % m for m in ms) + "".join(" | %.3f" % (m / ms[0]) for m in ms[1:]) + " |")
PY
    note "ab: rc=$? (ab.md)"
    # Its JSON files and build logs in one archive beside ab.md: a call cut short in AB_CLI (whose float64 checks of
    # large shapes take minutes) then still returns them within the device tool's 8 files (run 139 lost ab.md so).
    (cd "$OUT" && ls ab-[0-9]*-*.json ab-patch.log ab-configure.log ab-build.log 2>/dev/null |
       tar -czf ab-logs.tar.gz -T - --remove-files)
    # AB_CLI: arguments of `selscan` (e.g. "bench --device cuda --dtype fp16 --shape 8x1536x2048:16 --iters 50", for
    # rows selscan_bench does not have), run from every tree's build, alternated the same way, into ab-cli.txt.
    # Several commands separated by ';' run one after the other (e.g. a `run`, whose float64 check fails a tree
    # that computes wrong, before a `bench`); every failing one is named in the summary.
    if [ -n "${AB_CLI:-}" ]; then
      names=("this tree" "${trees[@]}")
      IFS=';' read -ra cli_cmds <<<"$AB_CLI"
      cli_fail=()
      : >"$OUT/ab-cli.txt"
      for round in $(seq 1 "${AB_ROUNDS:-2}"); do
        for i in "${!clis[@]}"; do
          for cmd in "${cli_cmds[@]}"; do
            read -ra words <<<"$cmd"
            echo "== round $round: ${names[$i]}: selscan ${words[*]}"
            "${clis[$i]}" "${words[@]}" 2>&1 || cli_fail+=("${names[$i]}: selscan ${words[*]} (round $round)")
          done >>"$OUT/ab-cli.txt"
        done
      done
      note "ab: AB_CLI (ab-cli.txt): ${#cli_fail[@]} failed${cli_fail:+: ${cli_fail[*]}}"
    fi
  fi
fi

if [[ " ${steps[*]} " == *" limits "* ]]; then
  gpu_tests=$(find "$BUILD" -name 'selscan_tests_gpu' -type f -perm -u+x | head -1)
  if [ -n "$gpu_tests" ]; then
    "$gpu_tests" --gtest_filter='GpuLimits*:GpuMulti*' --gtest_also_run_disabled_tests >"$OUT/limits.log" 2>&1
    rc=$?
    note "limits (GpuLimits*:GpuMulti*, disabled included): rc=$rc, $(grep -E '^\[  (PASSED  |FAILED  |SKIPPED )\] [0-9]' "$OUT/limits.log" | tr -s ' ' | tr '\n' ' ')"
    grep -E '^\[  (FAILED  |SKIPPED )\] [A-Z]' "$OUT/limits.log" | head -20
  else
    note "limits: no selscan_tests_gpu binary"
  fi
fi

if named bars; then
  # The kernel choice's bars measured again on this build: the shapes of BARS_SHAPES (default: bf16, N 16, grids on
  # both sides of the forward's warps-per-SM bar and of the backward's warp count, and row 3) through `selscan bench
  # --json` with the default choice (auto) and with each kernel forced (SELSCAN_FWD_KERNEL and SELSCAN_BWD_KERNEL =
  # ts, warp), alternated BARS_ROUNDS times (default 2); bars.md has the better median of the rounds per shape and
  # choice, forward and backward, and which kernel the default's time matches. A bar set on an older kernel should
  # move where a forced kernel beats the default on the default's side of it (src/cuda/select.cpp's thresholds).
  cli="$BUILD/selscan"
  if [ ! -x "$cli" ]; then
    note "bars: no selscan program in $BUILD (run the build step first)"
  else
    shape_args=()
    for shape in ${BARS_SHAPES:-1x2048x2048:16 1x4224x512:16 1x5120x512:16 1x8448x512:16 2x5120x512:16 1x8192x512:16 1x2048x65536:16}; do
      shape_args+=(--shape "$shape")
    done
    bars_rc=0
    for round in $(seq 1 "${BARS_ROUNDS:-2}"); do
      for kernel in auto ts warp; do
        SELSCAN_FWD_KERNEL=$kernel SELSCAN_BWD_KERNEL=$kernel "$cli" bench --device cuda --dtype bf16 "${shape_args[@]}" \
          --iters "${BARS_ITERS:-50}" --json >"$OUT/bars-$kernel-$round.json" 2>>"$OUT/bars.log" || bars_rc=1
      done
    done
    python3 - "$OUT"/bars-*-*.json >"$OUT/bars.md" <<'PY' || bars_rc=1
import json, os, sys
best = {}  # (shape, kernel, direction) -> ms, the better of the rounds
for path in sys.argv[1:]:
    kernel = os.path.basename(path).split("-")[1]
    for r in json.load(open(path))["rows"]:
        for d in ("fwd", "bwd"):
            key = (r["shape"], kernel, d)
            best[key] = min(best.get(key, float("inf")), r[d + "_ms"])
print("| shape (bf16) | fwd auto | fwd ts | fwd warp | bwd auto | bwd ts | bwd warp |")
print("|---|---:|---:|---:|---:|---:|---:|")
for shape in dict.fromkeys(k[0] for k in best):
    cells = []
    for d in ("fwd", "bwd"):
        ms = {k: best.get((shape, k, d)) for k in ("auto", "ts", "warp")}
        for k in ("auto", "ts", "warp"):
            cell = "-" if ms[k] is None else "%.4f" % ms[k]
            if k == "auto" and ms[k] is not None:  # which forced kernel the default's time matches (within 1%)
                same = [n for n in ("ts", "warp") if ms[n] is not None and abs(ms[n] - ms[k]) <= 0.01 * ms[k]]
                cell += " (%s)" % "/".join(same) if same else ""
            cells.append(cell)
    print("| %s | %s |" % (shape, " | ".join(cells)))
PY
    note "bars: rc=$bars_rc (bars.md; bars-<kernel>-<round>.json, bars.log)"
  fi
fi

# Step `baseline` (named only): issue #20's table with upstream measured in the same run. selscan_bench's issue rows
# (^gpu/(fwd|bwd)/) and bench/upstream_kernels.py (upstream's selective_scan_cuda timed the same way: needs the
# `upstream` step's build, this run's or an earlier one's) take turns BASELINE_ROUNDS times (default 2), then
# bench/report.py puts the better round of each beside the other in baseline.md (issue #20's targets, and by how
# much a missed row must fall).
if named baseline; then
  bench=$(find "$BUILD" -name 'selscan_bench' -type f -perm -u+x | head -1)
  if [ -z "$bench" ]; then
    note "baseline: no selscan_bench binary (run the build step first)"
  elif ! python3 -c 'import torch, selective_scan_cuda' 2>/dev/null; then  # torch first: it loads the libraries the extension links
    note "baseline: selective_scan_cuda is not importable (run the upstream step with UPSTREAM_SRC first)"
  else
    t0=$(date +%s); ours=(); theirs=(); brc=0
    for r in $(seq 1 "${BASELINE_ROUNDS:-2}"); do
      "$bench" --benchmark_filter='^gpu/(fwd|bwd)/' --benchmark_format=console \
        --benchmark_out="$OUT/baseline-selscan-$r.json" --benchmark_out_format=json >>"$OUT/baseline.log" 2>&1 || brc=1
      python3 bench/upstream_kernels.py --json "$OUT/baseline-upstream-$r.json" >>"$OUT/baseline.log" 2>&1 || brc=1
      ours+=("$OUT/baseline-selscan-$r.json"); theirs+=("$OUT/baseline-upstream-$r.json")
    done
    python3 bench/report.py "selscan=$(IFS=,; echo "${ours[*]}")" --upstream-json "$(IFS=,; echo "${theirs[*]}")" \
      --output "$OUT/baseline.md" >>"$OUT/baseline.log" 2>&1 || brc=1
    note "baseline: rc=$brc ($(( $(date +%s) - t0 )) s; baseline.md, baseline-*.json, baseline.log)"
  fi
fi

printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
# PACK=1: the logs and JSON files in one archive beside summary.txt, env.txt and the Markdown tables, for copying
# results off a machine that returns few files.
if [ "${PACK:-0}" = 1 ]; then
  (cd "$OUT" && find . -maxdepth 1 -type f ! -name summary.txt ! -name env.txt ! -name '*.md' ! -name logs.tar.gz \
     -printf '%f\n' | tar -czf logs.tar.gz -T - --remove-files)
fi

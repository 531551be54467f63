#!/usr/bin/env bash
# One call on a GPU machine: build the extension with CUDA (sm_90, every
# core), run the CUDA tests (those marked large on request), run the CUDA
# benchmarks, and print the speed goals' short table last
# (benchmarks/goals.py). Logs go to $OUT (or /tmp/gpu_check).
#
#   bash benchmarks/gpu_check.sh            # build, tests, benchmarks
#   OPS=nonzero,where bash benchmarks/gpu_check.sh
#   STEPS=memcheck bash benchmarks/gpu_check.sh
#   STEPS=profile bash benchmarks/gpu_check.sh
#   STEPS="large profile" bash benchmarks/gpu_check.sh
#
# STEPS (default "tests bench") says what follows the build:
#   tests     the tests marked cuda but not large, 8 at a time, each test
#             file on one worker (its module's fixtures made once), for at
#             most TEST_LIMIT seconds (240), then SIGINT so that pytest
#             still prints its summary (the CPU cases run in CI);
#   large     the CUDA tests marked large (tensors past 2**31 and 2**32
#             elements, up to about 20 GB each), one at a time, for at most
#             LARGE_LIMIT seconds (90; their CPU cases run in CI);
#   memcheck  the CUDA tests of random, long and many-row inputs and of
#             scatter's word-wide atomics under compute-sanitizer's memcheck,
#             for at most MEMCHECK_LIMIT seconds (150), PyTorch's caching
#             allocator off so that each tensor is an allocation of its own
#             and an access past it is seen (in a cached block it is not);
#   profile   where the time goes, kernel by kernel, in the 1e8 `where`,
#             `select` and `boolean_mask` cases and the 1e6/1e7 float32
#             element scatters (benchmarks/profile_kernels.py; PROFILE_MATCH,
#             substrings of the cases separated by ';', picks others, from
#             the modules PROFILE_OPS names, where,boolean_mask,scatter_nd:
#             each module makes all its cases' inputs), for at most
#             PROFILE_LIMIT seconds (150);
#   bench     the report (benchmarks/report.py: the copy bandwidth, then the
#             CUDA benchmarks in run.py's order, the compiled chains last,
#             unless OPS says otherwise) for what is left of TOTAL_LIMIT
#             (540), so that a hang still leaves the rows measured before
#             it (rows.json is rewritten after each, and the report written
#             when cut short), then the goals table; RESULTS.md and
#             plots/cuda/ are copied to $OUT.
# A run split over several calls (one call may run 10 minutes) is put into
# one report afterwards: each call's $OUT/rows.json carries its run record,
# and `python benchmarks/report.py --device cuda --from-json a.json b.json`
# writes the GPU section from them.
# A wheel folder .whl/ (e.g. expecttest, absent on some GPU images) is
# installed first if present, its console scripts put on PATH.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/gpu_check}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}" MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}"
SECONDS=0

if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site PATH="/tmp/site/bin:$PATH"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"

if ! TORCH_MASKED_CUDA=1 python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
  grep -E "error" "$OUT/build.log" | head -40
  tail -20 "$OUT/build.log"
  exit 1
fi
echo "built in ${SECONDS}s"
STEPS="${STEPS:-tests bench}"

if [[ " $STEPS " == *" tests "* ]]; then
  # Inductor's compile threads: two for each of the 8 workers, not one per core each.
  TORCHINDUCTOR_COMPILE_THREADS=2 timeout -s INT -k 20 "${TEST_LIMIT:-240}" python3 -m pytest tests -q -n 8 \
    --dist loadfile -p no:cacheprovider -m "cuda and not large" > "$OUT/tests.log" 2>&1
  tests_rc=$?
  grep -E "FAILED|ERROR|Error|passed|failed" "$OUT/tests.log" | tail -25
  echo "tests rc=${tests_rc} after ${SECONDS}s"
fi

if [[ " $STEPS " == *" large "* ]]; then
  timeout -k 10 "${LARGE_LIMIT:-90}" python3 -m pytest tests -q -p no:cacheprovider -m "large and cuda" \
    > "$OUT/large_tests.log" 2>&1
  large_rc=$?
  grep -E "FAILED|ERROR|Error|passed|failed" "$OUT/large_tests.log" | tail -12
  echo "large tests rc=${large_rc} after ${SECONDS}s"
fi

if [[ " $STEPS " == *" memcheck "* ]]; then
  sanitizer=$(command -v compute-sanitizer || echo "$CUDA_HOME/bin/compute-sanitizer")
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout -k 10 "${MEMCHECK_LIMIT:-150}" "$sanitizer" --tool memcheck \
    --error-exitcode 9 --print-limit 20 python3 -m pytest tests -q -x -p no:cacheprovider -m cuda \
    -k "random or long or several or more_than or word_atomics" > "$OUT/memcheck.log" 2>&1
  memcheck_rc=$?
  grep -E "^========= [A-Z]|passed|failed" "$OUT/memcheck.log" | head -30
  echo "memcheck rc=${memcheck_rc} (0: clean; 9: errors found; 124: cut short) after ${SECONDS}s"
fi

if [[ " $STEPS " == *" profile "* ]]; then
  default_match="x [100000,1000];x,y [100000,1000];1-D 1e+08 d=0.99;rows 1e+08 d=0.99;columns 1e+08 d=0.99"
  default_match+=";element U=1e+06 N=1e+06 float32;element U=1e+07 N=1e+07 float32"
  IFS=';' read -ra matches <<< "${PROFILE_MATCH:-$default_match}"
  match_args=()
  for m in "${matches[@]}"; do match_args+=(--match "$m"); done
  timeout -k 10 "${PROFILE_LIMIT:-150}" python3 benchmarks/profile_kernels.py \
    --ops "${PROFILE_OPS:-where,boolean_mask,scatter_nd}" "${match_args[@]}" \
    2>&1 | tee "$OUT/profile.txt"
  echo "profile done after ${SECONDS}s"
fi

if [[ " $STEPS " != *" bench "* ]]; then
  exit 0
fi

# JAX is the benchmarks' GPU peer where it can share the GPU with torch in
# one process and take its tensors as the benchmarks hand them over;
# otherwise the rows go without it.
if ! (cd benchmarks && timeout 120 python3 -c "import torch, jax_peer
run = jax_peer.side('cuda', lambda a: a + 1, torch.ones(4, device='cuda'))
assert run is not None, 'JAX has no GPU here'
run()") \
    > "$OUT/jax_check.log" 2>&1; then
  export BENCH_JAX=0
  echo "benchmarks without JAX: $(tail -1 "$OUT/jax_check.log")"
fi

# The compiled chains last: their compiles could take all the time left,
# and a run cut short keeps the rows measured before.
bench_ops=${OPS:-$(cd benchmarks && python3 -c "from run import OPS; print(','.join(sorted(OPS, key=lambda op: op == 'compiled')))")}
# After the import above (torch's), which takes seconds too.
bench_limit=$(( ${TOTAL_LIMIT:-540} - SECONDS ))
timeout -k 20 "$(( bench_limit > 30 ? bench_limit : 30 ))" \
  python3 benchmarks/report.py --device cuda --ops "$bench_ops" --json "$OUT/rows.json" > "$OUT/bench.log" 2> "$OUT/bench.err"
bench_rc=$?
grep -E "^report:" "$OUT/bench.err"
tail -3 "$OUT/bench.err"
echo "bench rc=${bench_rc}; total ${SECONDS}s"
cat "$OUT/bench.log"
cp benchmarks/RESULTS.md "$OUT/RESULTS.md"
mkdir -p "$OUT/plots" && cp -r benchmarks/plots/cuda "$OUT/plots/" 2> /dev/null
if [ -f "$OUT/rows.json" ]; then
  python3 benchmarks/goals.py "$OUT/rows.json" | tee "$OUT/goals.txt"
fi

#!/usr/bin/env bash
# The sanitized test suite (scripts/test.sh --sanitize runs it; not part of the default tests):
#  1. the `sanitize` preset (Debug, AddressSanitizer + UndefinedBehaviorSanitizer, any finding
#     fatal) and every test but those labelled `torch` (the PyTorch parity tests: they need
#     python3-torch, and the engine code they drive is run by the other model tests too);
#  2. the `tsan` preset (ThreadSanitizer): the communicator tests, ctest label `comm`
#     (tests/comm: Mesh and MpiCommunicator, under mpirun at 1 to 4 ranks, and in one process),
#     then the asynchronous CPU streams: Stream and Event (tests/core/device_test.cc), and the
#     executor on asynchronous streams (executor_test's *.async_streams and asynchronous
#     cases, and the runtime tests that pipeline over two ranks under mpirun), where a missing
#     event is a race between the streams' threads.
# Installs what is missing first. Usage:
#   scripts/test-sanitize.sh [asan|tsan] [ctest arguments...]
# With asan or tsan only that part runs; the remaining arguments go to its ctest.
# Ends with one line per part, "<part>: N passed, N failed", and fails if any test failed.
set -euo pipefail
cd "$(dirname "$0")/.."

parts=(asan tsan)
if [[ "${1:-}" == asan || "${1:-}" == tsan ]]; then
  parts=("$1")
  shift
fi

scripts/install-deps.sh --test  # strace too, for the fault-injection tests

# Sanitizer runtimes (libasan, libubsan, libtsan) come with g++. GCC 12's sanitizers cannot
# map their shadow memory when the kernel randomises mmap with more than 28 bits (the default
# of some newer kernels); then the tests run with address randomisation off for their
# process tree.
launch=()
rnd_bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo 28)
if ((rnd_bits > 28)); then
  echo "vm.mmap_rnd_bits = $rnd_bits: running the tests under setarch -R (no ASLR)"
  launch=(setarch "$(uname -m)" -R)
fi

# Reports go to the test's output (ctest prints it for failed tests) with full stacks.
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# Stack use after return: Tensors are non-owning views, so one of a dead stack frame is a
# real risk. MPI-launched tests append detect_leaks=0 (tests/CMakeLists.txt).
export ASAN_OPTIONS="detect_stack_use_after_return=1:check_initialization_order=1:strict_init_order=1"
export TSAN_OPTIONS="second_deadlock_stack=1:history_size=4"
# OpenMPI is not instrumented; with Debian 12's OpenMPI 4.1 over shared memory it raises no
# report. One that appears elsewhere goes to tests/sanitizers/tsan.supp, naming OpenMPI's own
# functions: never `race:libmpi.so` or the like, which would also hide oases touching a buffer
# while MPI still writes it (MPI's memcpy is then one side of the race).
if [[ -f tests/sanitizers/tsan.supp ]]; then
  TSAN_OPTIONS+=":suppressions=$PWD/tests/sanitizers/tsan.supp"
fi

declare -A summary
status=0
seconds_since() { echo $((SECONDS - $1)); }

run_ctest() {  # run_ctest <part> <ctest args...>: ctest with output kept for the summary
  local part=$1 log="build/$1.ctest.log" rc=0
  shift
  "${launch[@]}" ctest "$@" 2>&1 | tee "$log" || rc=$?
  local line
  line=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -1 || true)
  if [[ -n "$line" ]]; then
    local failed total
    failed=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/' <<<"$line")
    total=$(sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\2/' <<<"$line")
    summary[$part]="$((total - failed)) passed, $failed failed"
  else
    summary[$part]="no ctest summary (exit status $rc)"
  fi
  ((rc == 0)) || status=1
}

for part in "${parts[@]}"; do
  start=$SECONDS
  if [[ $part == asan ]]; then
    echo "== AddressSanitizer + UndefinedBehaviorSanitizer: build (preset sanitize)"
    cmake --preset sanitize >/dev/null
    cmake --build --preset sanitize
    built=$SECONDS
    echo "== AddressSanitizer + UndefinedBehaviorSanitizer: every test but label torch"
    run_ctest asan --preset sanitize --parallel 2 --no-tests=error --label-exclude torch \
      --timeout 1800 "$@"
  else
    echo "== ThreadSanitizer: build the communicator and stream tests (preset tsan)"
    cmake --preset tsan >/dev/null
    # The executables of tests/comm (each *_test.cc and *_mpitest.cc is one) and of the
    # streams' tests, not the suite.
    targets=()
    for source in tests/comm/*_test.cc tests/comm/*_mpitest.cc; do
      targets+=("$(basename "$source" .cc)")
    done
    targets+=(device_test executor_test pipeline_mpitest pipeline_lowering_mpitest)
    cmake --build --preset tsan --target "${targets[@]}"
    built=$SECONDS
    echo "== ThreadSanitizer: communicator tests (label comm)"
    run_ctest tsan --preset tsan --parallel 2 --no-tests=error --label-regex "^comm$" \
      --timeout 1800 "$@"
    echo "== ThreadSanitizer: asynchronous CPU streams, and the executor on them"
    streams='^(BothModes/Streams\.|Stream\.|Executor\..*\.async_streams$'
    streams+='|BothStreamModes/ExecutorModes\..*/asynchronous$|runtime\.pipeline(_lowering)?_mpitest\.np2$)'
    # libgomp is not instrumented: the threads of a kernel's parallel region would be reported
    # racing at its barriers. One OpenMP thread per process leaves the streams' own threads.
    OMP_NUM_THREADS=1 run_ctest tsan_streams --preset tsan --parallel 2 --no-tests=error \
      --tests-regex "$streams" --timeout 1800 "$@"
    summary[tsan]="comm: ${summary[tsan]}; streams: ${summary[tsan_streams]}"
  fi
  summary[$part]+=" (build $((built - start)) s, tests $(seconds_since "$built") s)"
done

echo
for part in "${parts[@]}"; do
  name=$([[ $part == asan ]] && echo "ASan+UBSan" || echo "TSan")
  echo "$name: ${summary[$part]}"
done
exit $status

# Sourced by the planner benchmarks. Two ranks over TCP on the loopback of a private network
# namespace whose bandwidth is capped with tc (tbf), so that the ranks' traffic crosses a link
# of known speed and nothing else shares it.
#   capped_loopback_start NAME RATE_MBIT   creates the namespace and caps it; sets `mpi_capped`
#                                          to the mpirun command line (2 ranks, 1 thread each)
#   capped_loopback_stop NAME              removes it (safe to call twice; call it on EXIT)
capped_loopback_start() {
  local ns=$1 rate=$2
  ip netns add "$ns"
  ip netns exec "$ns" ip link set lo up
  # A bucket of 2 ms at the rate (at least 128 KiB), so that bursts cannot beat the cap.
  local burst=$((rate * 1000 * 1000 / 8 / 500))
  ((burst < 131072)) && burst=131072
  ip netns exec "$ns" tc qdisc replace dev lo root tbf rate "${rate}mbit" burst "$burst" latency 100ms
  mpi_capped=(ip netns exec "$ns" mpirun --allow-run-as-root --oversubscribe -np 2
              -x OMP_NUM_THREADS=1 --mca btl self,tcp --mca btl_tcp_if_include lo
              --mca oob_tcp_if_include lo)
}

capped_loopback_stop() {
  ip netns del "$1" 2>/dev/null || true
}

# The lines every benchmark log starts with: the command as given, date and commit, machine
# and how busy it was (other work slows compute and the TCP stack unevenly).
bench_header() {
  echo "# command: $1"
  echo "# date: $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git describe --always --dirty)"
  echo "# machine: $(lscpu | sed -n 's/^Model name: *//p' | head -n1), nproc $(nproc); load $(cut -d' ' -f1-3 /proc/loadavg)"
}

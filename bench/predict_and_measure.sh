# Sourced by the benchmarks that compare `oases simulate`'s prediction from a profile with a
# measured run of the same layout (bench/run_moe_predict_bench.sh,
# bench/run_layout_predict_bench.sh), after bench/capped_loopback.sh.
#   predict_bench_start COMMAND RATE
#     builds oases (sets `oases`), prints the header for COMMAND, makes the folder `work` with
#     the fortunes text as byte tokens in $work/data, and a loopback namespace capped at RATE
#     Mbit/s whose two-rank launcher is `mpi`; both are removed on exit. Needs root.
#   predict_and_measure ENTRY [PROFILE]
#     ENTRY "name|ranks|settings": profiles the layout on its ranks (into PROFILE, default
#     $work/profile_<name>.json, unless that exists), predicts it (oases simulate) and trains it;
#     needs `oases` (the binary), `config` (the --config arguments), `mpi` (the two-rank
#     launcher) and `work` (the folder for the files).
#   predicted_vs_measured ENTRY...
#     the table: predicted and measured step (median of the steps after the first), their
#     ratio, the MoE all-to-alls' and the context-parallel transfers' wire and exposed time, the
#     exposed communication, and the predicted and measured activation peak; then each
#     prediction.
predict_bench_start() {
  [[ $(id -u) -eq 0 ]] || { echo "needs root (ip netns, tc)" >&2; exit 2; }
  cmake --preset release >/dev/null
  cmake --build --preset release --target oases >/dev/null
  oases=$PWD/build/release/oases
  bench_header "$1"
  work=$(mktemp -d)
  predict_bench_ns=oases-predict-$$
  trap 'capped_loopback_stop "$predict_bench_ns"; rm -rf "$work"' EXIT
  "$oases" prepare-data --input /usr/share/games/fortunes/fortunes --output "$work/data" \
    --tokenizer byte >/dev/null
  capped_loopback_start "$predict_bench_ns" "$2"
  mpi=("${mpi_capped[@]}")
}

predict_and_measure() {
  local name ranks settings
  IFS='|' read -r name ranks settings <<<"$1"
  local profile=${2:-$work/profile_$name.json}
  local -a extra launch set_args=()
  read -r -a extra <<<"$settings"
  launch=("$oases")
  [[ $ranks == 2 ]] && launch=("${mpi[@]}" "$oases")
  ((${#extra[@]})) && set_args=(--set "${extra[@]}")
  if [[ ! -f $profile ]]; then
    "${launch[@]}" profile "${config[@]}" "${set_args[@]}" --output "$profile" \
      --steps 3 >"$work/profile_$name.log" 2>&1 ||
      { echo "profile $name failed:"; tail -5 "$work/profile_$name.log"; exit 1; }
  fi
  "$oases" simulate "${config[@]}" "${set_args[@]}" --profile "$profile" >"$work/sim_$name.txt" 2>&1 ||
    { echo "simulate $name failed:"; cat "$work/sim_$name.txt"; exit 1; }
  "${launch[@]}" train --quiet "${config[@]}" --set "${extra[@]}" \
    log.metrics="\"$work/$name.jsonl\"" >"$work/train_$name.log" 2>&1 ||
    { echo "train $name failed:"; tail -5 "$work/train_$name.log"; exit 1; }
}

predicted_vs_measured() {
  /usr/bin/python3 - "$work" "$@" <<'PY'
import json, re, statistics, sys
work = sys.argv[1]
print("| layout | predicted step s | measured step s | predicted / measured | a2a wire s | exposed a2a s | cp wire s | exposed cp s | exposed comm s | predicted activations MiB | measured activations MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for entry in sys.argv[2:]:
    name = entry.split("|")[0]
    text = open(f"{work}/sim_{name}.txt").read()
    predicted = float(re.search(r"predicted step ([0-9.]+) s", text).group(1))
    activations = float(re.search(r"activations ([0-9.]+)\n", text).group(1))
    lines = [r for r in map(json.loads, open(f"{work}/{name}.jsonl")) if r["step"] > 0][1:]
    median = lambda key: statistics.median(r.get(key, 0.0) for r in lines)
    measured = median("step_time_s")
    peak = max(r["peak_activation_bytes"] for r in lines) / 2**20
    print(f"| {name} | {predicted:.4f} | {measured:.4f} | {predicted / measured:.2f} | "
          f"{median('a2a_s'):.4f} | {median('exposed_a2a_s'):.4f} | {median('cp_s'):.4f} | "
          f"{median('exposed_cp_s'):.4f} | {median('exposed_comm_s'):.4f} | "
          f"{activations:.1f} | {peak:.1f} |")
for entry in sys.argv[2:]:
    name = entry.split("|")[0]
    print(f"\n{name}:\n" + open(f"{work}/sim_{name}.txt").read().strip())
PY
}

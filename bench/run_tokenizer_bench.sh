#!/usr/bin/env bash
# Tokenizer throughput of `oases prepare-data` on one core: the English text the demo uses
# (Debian's fortunes and licence texts, about 2.8 MB, each file one document) tokenized by the
# byte, gpt2 and sentencepiece tokenizers, the same text as JSON lines (one document per
# fortune), and the text eight times over as one file. Each figure is the best of `rounds`
# wall-clock runs with OMP_NUM_THREADS=1, taken side by side in one run of this script.
# Usage: bash bench/run_tokenizer_bench.sh [rounds=3]   (after a release build)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
oases=build/release/oases
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

texts=()
for f in /usr/share/common-licenses/* /usr/share/games/fortunes/*; do
  [[ -f "$f" && ! -L "$f" && "$f" != *.dat ]] && texts+=("$f")
done
cat "${texts[@]}" > "$work/all.txt"
for i in 1 2 3 4 5 6 7 8; do cat "$work/all.txt"; done > "$work/all8.txt"
# One JSON object per fortune (fortunes are separated by lines holding only "%").
/usr/bin/python3 - "$work/all.txt" "$work/all.jsonl" <<'PY'
import json, sys
text = open(sys.argv[1], encoding="utf-8", errors="replace").read()
with open(sys.argv[2], "w", encoding="utf-8") as out:
    for doc in text.split("\n%\n"):
        if doc.strip():
            out.write(json.dumps({"text": doc}) + "\n")
PY
OMP_NUM_THREADS=1 "$oases" train-tokenizer --input "$work/all.txt" --model-prefix "$work/sp" \
  --vocab-size 4096 --type bpe >/dev/null

best_seconds() {  # best of $rounds runs of "$@", in seconds
  local best=
  for ((r = 0; r < rounds; ++r)); do
    local start end
    start=$(date +%s.%N)
    OMP_NUM_THREADS=1 "$@" >/dev/null 2>&1
    end=$(date +%s.%N)
    best=$(echo "$start $end ${best:-1e9}" | awk '{t = $2 - $1; print (t < $3) ? t : $3}')
  done
  echo "$best"
}

echo "| input | tokenizer | MB | tokens | best s | MB/min | tokens/s |"
echo "|---|---|---|---|---|---|---|"
run() {  # input-file label tokenizer [extra args]
  local input=$1 label=$2 tokenizer=$3; shift 3
  local summary seconds bytes tokens
  summary=$(OMP_NUM_THREADS=1 "$oases" prepare-data --no-progress --input "$input" \
    --output "$work/out" --val-fraction 0 --tokenizer "$tokenizer" "$@")
  tokens=$(echo "$summary" | sed -n 's/^prepared \([0-9]*\) tokens.*/\1/p')
  bytes=$(stat -c %s "$input")
  seconds=$(best_seconds "$oases" prepare-data --no-progress --input "$input" \
    --output "$work/out" --val-fraction 0 --tokenizer "$tokenizer" "$@")
  echo "$label $tokenizer $bytes $tokens $seconds" | awk '{printf "| %s | %s | %.1f | %d | %.2f | %.0f | %.2fM |\n",
    $1, $2, $3 / 1e6, $4, $5, $3 / 1e6 / $5 * 60, $4 / $5 / 1e6}'
}
run "$work/all.txt" "demo-text" byte
run "$work/all.txt" "demo-text" gpt2
run "$work/all.txt" "demo-text" sentencepiece --tokenizer-model "$work/sp.model"
run "$work/all.jsonl" "demo-text-jsonl" gpt2
run "$work/all8.txt" "demo-text-x8" gpt2
run "$work/all8.txt" "demo-text-x8" sentencepiece --tokenizer-model "$work/sp.model"

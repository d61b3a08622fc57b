#!/usr/bin/env bash
# Runs the README's quick start exactly as a user pastes it: the fenced ```sh block that follows
# the line `<!-- quick start -->` in README.md, executed line by line by bash in a fresh folder
# that holds only what a checkout has after building (build/ and configs/ of this repository,
# linked). Fails on the first command that fails, and when a file the quick start promises is
# missing afterwards. Usage: readme_quickstart_test.sh REPOSITORY_ROOT BUILD_DIR WORK_DIR
set -euo pipefail
repo=$1 build=$2 work=$3

block=$(awk '/^<!-- quick start -->$/ {armed = 1; next}
             armed && /^```sh$/ {inside = 1; next}
             inside && /^```$/ {exit}
             inside {print}' "$repo/README.md")
if [[ -z "$block" ]]; then
  echo "FAIL: README.md has no \`\`\`sh block after a '<!-- quick start -->' line"
  exit 1
fi

rm -rf "$work"
mkdir -p "$work/build"
ln -s "$build" "$work/build/release"
# The link points back into the build tree: removed at the end so nothing walking that tree
# goes round in circles; what the commands wrote stays for inspection.
trap 'rm -f "$work/build/release"' EXIT
ln -s "$repo/configs" "$work/configs"
cd "$work"
echo "---- README quick start, run in $work ----"
echo "$block"
echo "----"
# As pasted into an interactive bash: every line runs; a failing one fails the test.
if ! bash -euo pipefail -c "$block"; then
  echo "FAIL: a README quick-start command failed (see above)"
  exit 1
fi

# What the quick start says it leaves behind: named by the README in lines of the form
# `<!-- quick start leaves: PATH ... -->`.
status=0
for path in $(sed -n 's/^<!-- quick start leaves: \(.*\) -->$/\1/p' "$repo/README.md"); do
  if [[ -e "$path" ]]; then
    echo "ok: $path exists"
  else
    echo "FAIL: the quick start should have written $path"
    status=1
  fi
done
exit $status

#!/usr/bin/env bash
# Make the working tree that travels with each device `run` small, so that a staged part of 60 MiB fits
# beside it (64 MiB together): the raw reports (docs/benchmarks/) and the test checkpoints (tests/fixtures/),
# 33 of its 34 MB, are taken out of the index and excluded while staging; nothing on disk changes.
#   bash benchmarks/light_tree.sh on     # before the staging calls (the GPU side needs neither folder)
#   bash benchmarks/light_tree.sh off    # after them, before any commit: the index and exclude as they were
# While it is on, `git status` shows the two folders as deleted: do not commit then.
set -euo pipefail
cd "$(dirname "$0")/.."
FOLDERS=(docs/benchmarks tests/fixtures)
EXCLUDE=$(git rev-parse --git-path info/exclude)
MARK="# benchmarks/light_tree.sh"
case ${1:?on or off} in
  on)
    grep -qF "$MARK" "$EXCLUDE" 2>/dev/null && { echo "already on"; exit 0; }
    git rm -r --cached -q "${FOLDERS[@]}"
    # Exclude lines take no trailing comments: each pattern follows its mark on a line of its own.
    for folder in "${FOLDERS[@]}"; do printf '%s\n/%s/\n' "$MARK" "$folder"; done >>"$EXCLUDE"
    size=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 du -cb 2>/dev/null | tail -n 1 | cut -f1)
    echo "on: the travelling tree is $((size / 1024)) KiB; run 'bash benchmarks/light_tree.sh off' before committing"
    ;;
  off)
    git reset -q -- "${FOLDERS[@]}"
    # Drop each mark and the pattern line after it.
    sed -i "\|^$MARK\$|,+1d" "$EXCLUDE"
    echo "off: $(git status --short -- "${FOLDERS[@]}" | wc -l) change(s) left in ${FOLDERS[*]}"
    ;;
  *) echo "usage: light_tree.sh on|off" >&2; exit 2 ;;
esac

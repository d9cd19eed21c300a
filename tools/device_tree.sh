#!/usr/bin/env bash
# The device tool copies the tracked working tree (at most 64 MiB); the committed traces are
# close to that. Before a device call, `shrink` untracks and ignores trace folders the call does
# not need (they stay on disk); `restore` tracks them again. While shrunk, a pre-commit hook
# refuses every commit (it would delete those traces), so restore first.
# Usage (repository root): bash tools/device_tree.sh shrink [DIR...] | restore | status
#   DIR defaults to every recording of the validation matrix (traces/matrix, traces/matrix-*),
#   which no device call reads: the tree is ~15 MiB without them (~200 MiB with).
set -eu
cd "$(git rev-parse --show-toplevel)"
STATE=.git/device-tree-shrunk
HOOK=$(git rev-parse --git-path hooks)/pre-commit
size() { git ls-files -z | xargs -0 stat -c %s | awk '{s+=$1} END {printf "%.1f MiB tracked\n", s/1048576}'; }
case "${1:-status}" in
shrink)
    shift
    [ -e "$STATE" ] && { echo "already shrunk ($(tr '\n' ' ' < "$STATE")): restore first" >&2; exit 2; }
    git diff --cached --quiet || { echo "the index has staged changes: commit or unstage first" >&2; exit 2; }
    [ -e "$HOOK" ] && { echo "$HOOK exists: not replacing it" >&2; exit 2; }
    dirs=("$@"); [ ${#dirs[@]} -gt 0 ] || dirs=(traces/matrix/ traces/matrix-*/)
    for d in "${dirs[@]}"; do
        d=${d%/}; git ls-files --error-unmatch "$d" > /dev/null 2>&1 || { echo "$d: not tracked" >&2; continue; }
        git rm -r -q --cached "$d"; echo "/$d/" >> .git/info/exclude; echo "$d" >> "$STATE"
    done
    mkdir -p "$(dirname "$HOOK")"
    # Hooks are shared by every worktree of the repository: only the shrunk one refuses.
    printf '#!/bin/sh\n[ -e "$(git rev-parse --git-dir)/device-tree-shrunk" ] || exit 0\necho "tools/device_tree.sh: the tree is shrunk for a device call; run restore first" >&2\nexit 1\n' > "$HOOK"
    chmod +x "$HOOK"; size ;;
restore)
    [ -e "$STATE" ] || { echo "not shrunk"; exit 0; }
    while read -r d; do sed -i "\#^/$d/\$#d" .git/info/exclude; git add "$d"; done < "$STATE"
    rm -f "$STATE" "$HOOK"; size ;;
status)
    if [ -e "$STATE" ]; then echo "shrunk: $(tr '\n' ' ' < "$STATE")"; else echo "not shrunk"; fi; size ;;
*) echo "usage: bash tools/device_tree.sh shrink [DIR...] | restore | status" >&2; exit 2 ;;
esac

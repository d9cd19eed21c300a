#!/usr/bin/env bash
# One device call on the H200: record the what-if validation matrix (benchmarks/matrix.py) from
# the workload files `python -m benchmarks.matrix prepare .matrix` wrote (carry .matrix), and
# optionally a device profile. Usage (repository root, on the device):
#   bash tools/h200_matrix.sh [CELL ...]        # no cells: every cell; PROFILE=1: the profile too
#   REPEAT=3 bash tools/h200_matrix.sh CELL     # CELL, CELL-r2, CELL-r3: the run-to-run spread
#   MATRIX_DIR=/tmp/m2 TAG=spread- ...          # a second run in the same call, its own files
# Traces come back as three .tgz files under $OUT (each file back is at most 16 MiB).
set -u
OUT=${OUT:-out/h200}
MATRIX_DIR=${MATRIX_DIR:-/tmp/matrix}
TAG=${TAG:-}
mkdir -p "$OUT" "$MATRIX_DIR"
source tools/h200_env.sh
ONLY=(); [ $# -gt 0 ] && ONLY=(--only "$@")
python3 -m benchmarks.matrix record "$MODEL" .matrix "$MATRIX_DIR" "${ONLY[@]}" \
    --repeat "${REPEAT:-1}" 2>&1 \
    | grep -v fix_mistral_regex | tee "$OUT/${TAG}matrix.log"
if [ "${PROFILE:-0}" = 1 ]; then
    python3 -m replay.cli.main profile --model "$MODEL" --out "$OUT/h200-qwen3-0.6b.profile" \
        2>&1 | tail -8 | tee "$OUT/profile.log"
fi
cd "$MATRIX_DIR" || exit 1
for group in reference "chat conversation" "bursty mooncake azure-code"; do
    name=$(echo "$group" | cut -d' ' -f1)
    dirs=$(for g in $group; do ls -d "$g"-* 2>/dev/null; done)
    [ -n "$dirs" ] && tar czf "$OUT/${TAG}matrix-$name.tgz" $dirs
done
ls -la "$OUT"

#!/usr/bin/env bash
# Two engines' recordings of the same matrix cells on one GPU host, interleaved (new, old, new),
# each trace's few-row decode host and device time printed (tools/decode_host_stats.py), its
# request metrics (tools/ab_ttft.py), and its host stalls by step class (benchmarks.gc_pauses --traces: stalls_by_class): whether
# a difference between two matrices is the engine's or the host's (docs/gpu-notes.md session 30).
# Usage:
#   bash tools/engine_ab.sh prepare OLD_REV       # here: .oldengine (OLD_REV), .newengine (HEAD)
#   then on the device (carry .whl .matrix .oldengine .newengine; repository root):
#   source tools/h200_env.sh; bash tools/engine_ab.sh run [CELL ...]   # default below
set -u
case "${1:-}" in
prepare)
    [ -n "${2:-}" ] || { echo "usage: bash tools/engine_ab.sh prepare OLD_REV" >&2; exit 2; }
    exclude=$(git rev-parse --git-common-dir)/info/exclude
    for pair in ".oldengine $2" ".newengine HEAD"; do
        set -- $pair
        rm -rf "$1" && mkdir "$1" || exit 1
        git archive "$2" engine tracing replay benchmarks tools | tar x -C "$1" || exit 1
        cp tools/decode_host_stats.py "$1/tools/"
        grep -qx "/$1/" "$exclude" || echo "/$1/" >> "$exclude"
    done
    du -sh .oldengine .newengine ;;
run)
    shift
    [ -n "${MODEL:-}" ] || { echo "source tools/h200_env.sh first" >&2; exit 2; }
    cells=("$@"); [ ${#cells[@]} -gt 0 ] || cells=(reference-mns128 chat-default)
    root=$PWD
    for tag in new1:.newengine old:.oldengine new2:.newengine; do
        name=${tag%%:*} dir=$root/${tag#*:}
        ( cd "$dir" && export PYTHONPATH=/tmp/site:$dir \
            && python3 -m benchmarks.matrix record "$MODEL" "$root/.matrix" "/tmp/ab-$name" \
                --only "${cells[@]}" 2>&1 | tr '\r' '\n' | grep -E "requests" \
            ; python3 tools/decode_host_stats.py /tmp/ab-"$name"/* \
            ; cd "$root" && PYTHONPATH=/tmp/site:$root python3 tools/ab_ttft.py /tmp/ab-"$name"/* \
            ; python3 -m benchmarks.gc_pauses --traces /tmp/ab-"$name"/* )
        # The recordings come back under $OUT (the device tool's), for the what-if tables: as
        # one archive, since the tool returns files at most 16 folders deep and few of them.
        [ -n "${OUT:-}" ] && tar czf "$OUT/ab-$name.tgz" -C /tmp "ab-$name"
    done ;;
*) echo "usage: bash tools/engine_ab.sh prepare OLD_REV | run [CELL ...]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# One device call on the H200: GPU tests against transformers, the engine benchmark (with
# transformers' generate_batch as the peer), a decode profile and the two committed traces.
# Usage (repository root, on the device): bash tools/h200_session.sh STAGES
#   STAGES (VARIANTS=chunked,chunked-2048 LONG_PREFILL=32768 for bench): comma-separated, any of ktests,tests,kernels,dattn,gemm,skinny,constrained,policies,bench,hf,profile,onerow,mixed,plong,lprefill,serve,gc. Results go under
#   $OUT. bench runs tracing off/on (SKIP_OFF=1: on only) and, with COMPARE=1, tracing on
#   without overlapped steps. mixed: the mixed-step graph and long-prefill GPU tests and the
#   chunked fp32 runner tests; plong: the long-prefill tiling sweep (benchmarks/prefill_long.py);
#   dattn: decode attention per batch size (benchmarks/decode_attention.py, DATTN_BATCHES,
#   DATTN_LAYOUTS=token,head: the head-major cache too; DATTN_ORDERS=row,longest: rows longest first);
#   profile: benchmarks/profile_engine.py, PROFILE_ARGS passed on (e.g. '--set max_num_seqs=96').
#   onerow: one sequence at a time (the reference's first request), 3 runs with each of
#   ONEROW_SETS (space-separated k=v overrides, "-" for none: the A/B of a one-row change), then
#   the one-row profile.
#   lprefill: one LONG_PREFILL-token (default 32768) prefill step through each long-prompt kernel
#   route (benchmarks.engine.long_prefill) without the reference runs.
set -u
STAGES=${1:-tests,constrained}
OUT=${OUT:-out/h200}
mkdir -p "$OUT" /tmp/traces
source tools/h200_env.sh
has() { [[ ",$STAGES," == *",$1,"* ]]; }
if has ktests; then  # the Triton kernels, compiled
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -rs -x \
        tests/engine/model/test_triton_kernels.py tests/engine/model/test_triton_fused.py \
        tests/engine/model/test_triton_fused_kv_store.py tests/engine/model/test_triton_skinny_gemm.py \
        tests/engine/model/test_triton_decode_prologue.py \
        tests/engine/model/test_attention_triton_backend.py \
        tests/engine/model/test_triton_sampler.py tests/benchmarks/test_sampler_variants.py \
        tests/engine/runner/test_prefill_graphs_model.py \
        tests/engine/model/test_prefill_attention_tma.py \
        > "$OUT/ktests.log" 2>&1
    tail -5 "$OUT/ktests.log"
fi
if has tests; then  # the runner against transformers
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -rs -s \
        tests/engine/runner/test_gpu_runner.py > "$OUT/pytest.log" 2>&1
    grep -E "^bf16|passed|failed|^FAILED|Error" "$OUT/pytest.log" | head -30
fi
if has kernels; then
    python3 -m benchmarks.kernels --only sampler --out /tmp/kernels > "$OUT/kernels.log" 2>&1
    tail -20 "$OUT/kernels.log"
    [ -d /tmp/kernels ] && tar czf "$OUT/kernels.tgz" -C /tmp kernels
fi
if has dattn; then  # decode attention per batch size: splits x tilings in a graph
    timeout "${DATTN_TIMEOUT:-300}" python3 -m benchmarks.decode_attention --out "$OUT" \
        --batches "${DATTN_BATCHES:-16,32,64,96,128,160,192,224,256}" \
        --layouts "${DATTN_LAYOUTS:-token}" --orders "${DATTN_ORDERS:-row}" > "$OUT/dattn.log" 2>&1
    tail -24 "$OUT/dattn.log"
fi
if has gemm; then
    python3 -m benchmarks.gemm --out /tmp/gemm > "$OUT/gemm.log" 2>&1
    tail -30 "$OUT/gemm.log"
fi
if has skinny; then  # decode-sized GEMMs + consumers: cuBLAS against split-K tilings
    timeout "${SKINNY_TIMEOUT:-330}" python3 -m benchmarks.skinny_gemm --out "$OUT" \
        --batches "${SKINNY_BATCHES:-1,16,64,128,256}" > "$OUT/skinny.log" 2>&1
    grep -v "^ " "$OUT/skinny.log" | tail -30
fi
if has mixed; then  # mixed-step graphs, long prefills against SDPA, chunked greedy identity
    timeout "${TEST_TIMEOUT:-400}" python3 -m pytest -q -p no:cacheprovider -rs -x \
        tests/engine/runner/test_prefill_graphs_model.py \
        tests/engine/model/test_prefill_attention_gpu.py \
        tests/engine/runner/test_gpu_runner.py -k "chunked" > "$OUT/mixed.log" 2>&1
    tail -8 "$OUT/mixed.log"
fi
if has plong; then
    timeout "${PLONG_TIMEOUT:-150}" python3 -m benchmarks.kernels --only prefill-long \
        --out /tmp/plong > "$OUT/plong.log" 2>&1
    tail -40 "$OUT/plong.log"
fi
if has lprefill; then
    python3 -c "import json, sys; from pathlib import Path; from benchmarks.engine import long_prefill
print(json.dumps(long_prefill(Path(sys.argv[1]), int(sys.argv[2]))))" "$MODEL" "${LONG_PREFILL:-32768}" \
        2>&1 | grep -v fix_mistral_regex | tee "$OUT/lprefill.log"
fi
if has constrained; then
    # --warm-up 1: recorded warm, like the reference (bench records after a warm-up run).
    python3 -m replay.cli.main run --model "$MODEL" --workload bench --out /tmp/traces/h200-constrained \
        --warm-up 1 --set max_num_seqs=64 --set num_kvcache_blocks=300 2>&1 | tail -6 | tee "$OUT/constrained.log"
fi
if has policies; then
    # Issue 17: the reference workload with a seeded third of it high priority
    # (benchmarks/policies.py) under `priority`, in the constrained pool (the setting
    # docs/policies.md checks) and in the reference's; each recorded warm, as constrained is.
    python3 -m benchmarks.policies workload /tmp/priority.jsonl | tee "$OUT/policies.log"
    for cell in constrained reference; do
        POOL=; [ $cell = constrained ] && POOL="--set max_num_seqs=64 --set num_kvcache_blocks=300"
        python3 -m replay.cli.main run --model "$MODEL" --workload /tmp/priority.jsonl \
            --out /tmp/traces/h200-$cell-priority --warm-up 1 --set policy=priority $POOL 2>&1 \
            | tail -6 | tee -a "$OUT/policies.log"
    done
fi
if has bench || has hf; then
    HF_FLAG=--no-transformers; has hf && HF_FLAG=
    SEQ_FLAG=; [ "${COMPARE:-0}" = 1 ] && SEQ_FLAG=--compare-sequential
    [ "${SKIP_OFF:-0}" = 1 ] && SEQ_FLAG="$SEQ_FLAG --skip-off"
    python3 -m benchmarks.engine --model-dir "$MODEL" --repeat "${REPEAT:-2}" $HF_FLAG $SEQ_FLAG \
        --variants "${VARIANTS:-}" --long-prefill "${LONG_PREFILL:-0}" \
        --json "$OUT/bench.json" --trace-out /tmp/traces/h200-reference 2>&1 \
        | grep -v fix_mistral_regex | tee "$OUT/bench.log"
fi
if has onerow; then  # one-sequence TPOT: an A/B, 3 runs each, then where a one-row step goes
    for sets in ${ONEROW_SETS:--}; do
        args=(); [ "$sets" != - ] && for kv in ${sets//,/ }; do args+=(--set "$kv"); done
        python3 -m benchmarks.engine --model-dir "$MODEL" --num-seqs 1 --set max_num_seqs=1 \
            "${args[@]}" --repeat 3 --no-transformers --skip-off 2>&1 | tr '\r' '\n' \
            | grep -E "^repeat" | sed "s|^|$sets: |" | tee -a "$OUT/onerow.log"
    done
    python3 -m benchmarks.profile_engine --model "$MODEL" --out "$OUT/onerow-profile" \
        --num-seqs 1 --steps 30 > "$OUT/onerow-profile.log" 2>&1
    tail -32 "$OUT/onerow-profile.log"
fi
if has profile; then
    python3 -m benchmarks.profile_engine --model "$MODEL" --out "$OUT/profile" ${PROFILE_ARGS:-} \
        > "$OUT/profile.log" 2>&1
    tail -40 "$OUT/profile.log"
fi
if has gc; then  # the collector's pauses per engine, unfrozen and frozen (benchmarks/gc_pauses.py)
    # GC_ARGS: e.g. "--workload .matrix/chat.jsonl" (carry .matrix), whose runs meet full passes
    timeout "${GC_TIMEOUT:-300}" python3 -m benchmarks.gc_pauses --model "$MODEL" \
        --engines "${GC_ENGINES:-3}" --unfrozen ${GC_ARGS:-} --json "$OUT/gc.json" \
        > "$OUT/gc.log" 2>&1
    tr '\r' '\n' < "$OUT/gc.log" | grep '^{' | tail -12
fi
if has serve; then  # issue 15: offline, then the server per engine kind (SERVE_ENGINES)
    timeout "${SERVE_TIMEOUT:-570}" python3 -m benchmarks.serve gpu --model "$MODEL" \
        --engines "${SERVE_ENGINES:-process,thread}" --client-workers "${CLIENT_WORKERS:-8}" \
        --set calibration_repeats=0 --json "$OUT/serve.json" > "$OUT/serve.log" 2>&1
    grep -v fix_mistral_regex "$OUT/serve.log" | tail -90
fi
[ -d /tmp/traces ] && tar czf "$OUT/traces.tgz" -C /tmp traces
ls -la "$OUT"

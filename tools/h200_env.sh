# Sourced by the device scripts (tools/h200_session.sh, tools/h200_matrix.sh): the carried
# wheels (.whl) installed beside the device's packages, the repository on PYTHONPATH, and the
# qwen3-0.6b preset made once per machine (a warm machine keeps it) at $MODEL.
export PYTHONUNBUFFERED=1 REPLAYLLM_CACHE=/tmp/replayllm-cache
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
export MODEL=$REPLAYLLM_CACHE/models/qwen3-0.6b
[ -f "$MODEL/config.json" ] || python3 -c "from engine.model.checkpoint import make_model; make_model('qwen3-0.6b', '$MODEL')" || exit 1
# The host's CPU and load: eager steps are launch-bound, so their times follow the host (gpu-notes).
[ -n "${OUT:-}" ] && mkdir -p "$OUT" && { lscpu | grep -E "Model name|^CPU\(s\)"; cat /proc/loadavg; } \
    > "$OUT/host.txt" 2>/dev/null

#!/usr/bin/env bash
# One GPU session's checks, each stage time-boxed, everything written under OUT (default
# benchmarks/results/gpu_session) as it finishes, so a session cut short keeps what it measured:
#   0. the mHC-lite probe (benchmarks/check_mhc_lite_gpu.py);
#   1. the launch sweep (benchmarks/tune_gpu.py), whose best settings the next stages run with
#      (ADDNORM_TRITON_LAUNCH) -- the tests then check the tuned kernels;
#   2. the CUDA tests (the new fused ops, the Add & Norm kernels, the frontier forms, patched HF models);
#   3. bench_gpu.py for every fused op (and LigerMHC / Liger's fused add + RMSNorm where importable),
#      then Add & Norm's own table. Each fused-forms cell compiles the eager math afresh for torch.compile:
#      on an H200 an mHC cell took about a minute of compiling (3 cells in 230 s), the others far less, so
#      FORMS_OPS puts mhc last by default, and first the ops no GPU session has measured yet (the stream
#      read, the two-norm parallel form, DyT, Derf, mhc_pre; the H200's second session reached 11 cells of
#      parallel, norm_add and stream_write in its 200 s).
# TUNE_SWEEPS picks the sweeps (default bwd_tile, the one not yet run on a GPU; fwd,bwd,reduce,bwd_tile: all).
# Stage budgets in seconds: T_TUNE, T_TESTS, T_FORMS, T_ADDNORM; 0 skips a stage. ADDNORM_ARGS narrows
# Add & Norm's grid (bench_gpu.py's --shapes/--dtypes/--kinds/--modes). The defaults (130 + 170 +
# 200 + 0, with the probe's 60) fit one 600 s device command. Each stage's exit status is logged, and the
# script exits 1 if any stage failed or ran out of time. The two benchmark stages journal each finished cell
# in OUT (fused_forms_gpu.partial.jsonl, add_norm_gpu.partial.jsonl): git ignores *.partial.jsonl, so to resume
# on a later device call put them back in OUT and name OUT in the call's carry. Runs from the repository root,
# no install needed beyond a CUDA build of torch with Triton (src/ is put on PYTHONPATH).
set -u
OUT=${OUT:-benchmarks/results/gpu_session}
mkdir -p "$OUT"
rm -f "$OUT"/gpu_tune.json "$OUT"/gpu_tune.md "$OUT"/gpu_tune.partial.jsonl  # never a stale sweep's best
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
log="$OUT/log.txt"
failed=0
exec 3>&1  # the script's own output: stage lines go there and to the log, whatever a stage redirects
stage() { local line="== $(date -u +%H:%M:%S) $*"; echo "$line" >> "$log"; echo "$line" >&3; }
# run BUDGET NAME CMD...: the command under `timeout BUDGET` (skipped at 0), its status logged
run() {
  local budget=$1 name=$2; shift 2
  if [ "$budget" -le 0 ]; then stage "$name: skipped"; return 0; fi
  timeout "$budget" "$@"; local rc=$?
  stage "$name: exit $rc$([ $rc -eq 124 ] && echo ' (out of time)')"
  [ $rc -eq 0 ] || failed=1
}
stage "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import importlib.metadata as m; print('liger', m.version('liger-kernel'))"; } >> "$log" 2>&1
stage "mHC-lite probe"
run 60 "mHC-lite probe" python3 benchmarks/check_mhc_lite_gpu.py >> "$log" 2>&1
stage "launch sweep"
run "${T_TUNE:-130}" "launch sweep" python3 benchmarks/tune_gpu.py --sweeps "${TUNE_SWEEPS:-bwd_tile}" --out "$OUT" \
  > "$OUT/tune.txt" 2>&1
tail -n 40 "$OUT/tune.txt" >> "$log"; rm -f "$OUT/tune.txt"
best=$(python3 - "$OUT/gpu_tune.json" 2>/dev/null <<'PY'
import json, sys
best = json.load(open(sys.argv[1]))["best"]
print(",".join(f"{k}={v}" for k, v in best.items()))
PY
)
if [ -n "$best" ]; then export ADDNORM_TRITON_LAUNCH="$best"; fi
stage "tests (ADDNORM_TRITON_LAUNCH=${ADDNORM_TRITON_LAUNCH:-defaults})"
# one process: on an H200 eight xdist workers spent the stage importing torch and Triton (170 s, nothing
# printed), where one process ran all 256 checks in 130 s
run "${T_TESTS:-170}" "tests" python3 -m pytest -q -p no:cacheprovider -p no:benchmark -rfEs tests/ops/test_fused_cuda.py \
  tests/kernels/test_triton_cuda.py tests/frontier/test_frontier_cuda.py tests/interop/test_patch.py >> "$log" 2>&1
stage "fused forms (ADDNORM_TRITON_LAUNCH=${ADDNORM_TRITON_LAUNCH:-defaults})"
run "${T_FORMS:-200}" "fused forms" python3 benchmarks/bench_gpu.py \
  --ops "${FORMS_OPS:-stream_read,parallel2,dyt,derf,mhc_pre,parallel,norm_add,stream_write,mhc}" --kinds rms \
  --shapes "${FORMS_SHAPES:-16384x4096}" --dtypes bfloat16,float32 --modes fwd,fwdbwd --out "$OUT" > "$OUT/forms.txt" 2>&1
grep -v "━" "$OUT/forms.txt" | tail -n 60 >> "$log"; rm -f "$OUT/forms.txt"
stage "add_norm"
run "${T_ADDNORM:-0}" "add_norm" python3 benchmarks/bench_gpu.py ${ADDNORM_ARGS:-} --out "$OUT" > "$OUT/addnorm.txt" 2>&1
grep -v "━" "$OUT/addnorm.txt" 2>/dev/null | tail -n 50 >> "$log"; rm -f "$OUT/addnorm.txt"
stage "done (failed=$failed)"
exit $failed

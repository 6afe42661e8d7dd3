#!/usr/bin/env bash
# One GPU session's checks, each stage time-boxed, everything written under OUT (default
# benchmarks/results/gpu_session) as it finishes, so a session cut short keeps what it measured:
#   1. the launch sweep (benchmarks/tune_gpu.py), whose best settings the next stages run with
#      (ADDNORM_TRITON_LAUNCH) -- the tests then check the tuned kernels;
#   2. the CUDA tests (the new fused ops, the Add & Norm kernels, the frontier forms, patched HF models);
#   3. bench_gpu.py for every fused op (and LigerMHC / Liger's fused add + RMSNorm where importable),
#      then Add & Norm's own table. Each fused-forms cell compiles the eager math afresh for torch.compile:
#      on an H200 an mHC cell took about a minute of compiling (3 cells in 230 s), the others far less, so
#      FORMS_OPS puts mhc last by default.
# Stage budgets in seconds: T_TUNE, T_TESTS, T_FORMS, T_ADDNORM (0 skips that stage). Runs from the repository root, no install
# needed beyond a CUDA build of torch with Triton (src/ is put on PYTHONPATH).
set -u
OUT=${OUT:-benchmarks/results/gpu_session}
mkdir -p "$OUT"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
log="$OUT/log.txt"
stage() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$log"; }
stage "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import liger_kernel, importlib.metadata as m; print('liger', m.version('liger-kernel'))"; } >> "$log" 2>&1
stage "mHC-lite probe"
timeout 60 python3 benchmarks/check_mhc_lite_gpu.py >> "$log" 2>&1
stage "launch sweep"
timeout "${T_TUNE:-130}" python3 benchmarks/tune_gpu.py --out "$OUT" > "$OUT/tune.txt" 2>&1
tail -n 40 "$OUT/tune.txt" >> "$log"; rm -f "$OUT/tune.txt"
best=$(python3 -c "import json,sys; b=json.load(open('$OUT/gpu_tune.json'))['best']; print(','.join(f'{k}={v}' for k,v in b.items()))" 2>/dev/null)
if [ -n "$best" ]; then export ADDNORM_TRITON_LAUNCH="$best"; fi
stage "tests (ADDNORM_TRITON_LAUNCH=${ADDNORM_TRITON_LAUNCH:-defaults})"
timeout "${T_TESTS:-240}" python3 -m pytest -q -p no:cacheprovider $(python3 -c "import xdist" 2>/dev/null && printf -- '-n 8') -rfEs tests/ops/test_fused_cuda.py \
  tests/kernels/test_triton_cuda.py tests/frontier/test_frontier_cuda.py tests/interop/test_patch.py >> "$log" 2>&1
stage "fused forms (ADDNORM_TRITON_LAUNCH=${ADDNORM_TRITON_LAUNCH:-defaults})"
timeout "${T_FORMS:-240}" python3 benchmarks/bench_gpu.py \
  --ops "${FORMS_OPS:-parallel,norm_add,stream_write,stream_read,parallel2,dyt,derf,mhc_pre,mhc}" --kinds rms \
  --shapes "${FORMS_SHAPES:-16384x4096}" --dtypes bfloat16,float32 --modes fwd,fwdbwd --out "$OUT" > "$OUT/forms.txt" 2>&1
grep -v "━" "$OUT/forms.txt" | tail -n 60 >> "$log"; rm -f "$OUT/forms.txt"
if [ "${T_ADDNORM:-600}" -gt 0 ]; then
  stage "add_norm"
  timeout "${T_ADDNORM:-600}" python3 benchmarks/bench_gpu.py --out "$OUT" > "$OUT/addnorm.txt" 2>&1
  grep -v "━" "$OUT/addnorm.txt" | tail -n 50 >> "$log"; rm -f "$OUT/addnorm.txt"
fi
stage "done"

#!/usr/bin/env bash
# One GPU session's checks, each stage time-boxed, everything written under OUT (default
# benchmarks/results/gpu_session) as it finishes, so a session cut short keeps what it measured:
#   0. the mHC-lite probe (benchmarks/check_mhc_lite_gpu.py; T_PROBE, default 0: the CUDA tests cover it since
#      the fix it found was verified);
#   1. torch.compile warmed in parallel (T_WARM): the benchmarks' grid run by WARM_JOBS processes at once, each a
#      slice of it, their timings thrown away. torch.compile's compiled code lands in the inductor and Triton
#      caches on disk, so the timed stages below compile from the cache. On an H200, compiling each cell's eager
#      math was most of the timed stages' time (an mHC cell about a minute; 11 of 32 cells in 180 s), one cell
#      after another on one core of 16. It runs alone: beside the tests (the third session) it starved them;
#   2. the launch sweep (benchmarks/tune_gpu.py, T_TUNE, default 0; TUNE_SWEEPS picks the sweeps, default bwd_tile,
#      the one not yet run on a GPU) -- its best settings, if run, are what the next stages run with
#      (ADDNORM_TRITON_LAUNCH);
#   3. the CUDA tests (the fused ops, the Add & Norm kernels, huge rows, the frontier forms, a patched HF model;
#      tests/interop/test_patch.py runs on CPU tensors, so the CPU suite holds it);
#   4. bench_gpu.py for the fused ops (and LigerMHC / Liger's fused add + RMSNorm where importable), the cells no GPU
#      session has measured first (FORMS_OPS; after the third session: mhc_pre, stream_write, mhc), for T_FORMS
#      seconds;
#   5. Add & Norm's own table (bench_gpu.py, ADDNORM_ARGS narrows its grid), T_ADDNORM seconds;
#   6. the fused forms again, resuming from stage 4's journal, in the time left before TOTAL seconds.
# Stage budgets in seconds: T_PROBE, T_WARM, T_TUNE, T_TESTS, T_FORMS, T_ADDNORM; 0 skips a stage (and stage 6
# with stage 4); TOTAL (default 570) bounds the whole, so that one 600 s device command holds it: each stage gets
# its budget or what is left, less what the stages after it keep back (the warm-up keeps T_TESTS, the forms
# T_ADDNORM). Each stage's exit status is logged, and the script exits 1 if any stage failed, ran out of time, or
# found no time left to start. The two benchmark stages journal each finished cell in OUT
# (fused_forms_gpu.partial.jsonl, add_norm_gpu.partial.jsonl): git ignores *.partial.jsonl, so to resume on a
# later device call put them back in OUT and name OUT in the call's carry. Runs from the repository root, no
# install needed beyond a CUDA build of torch with Triton (src/ is put on PYTHONPATH).
set -u
OUT=${OUT:-benchmarks/results/gpu_session}
mkdir -p "$OUT"
rm -f "$OUT"/gpu_tune.json "$OUT"/gpu_tune.md "$OUT"/gpu_tune.partial.jsonl  # never a stale sweep's best
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
log="$OUT/log.txt"
failed=0
deadline=$(( $(date +%s) + ${TOTAL:-570} ))
left() { echo $(( deadline - $(date +%s) )); }
cap() { local a=$1 b; b=$(left); b=$(( b - ${2:-0} )); [ "$b" -lt "$a" ] && a=$b; [ "$a" -lt 0 ] && a=0; echo "$a"; }
exec 3>&1  # the script's own output: stage lines go there and to the log, whatever a stage redirects
stage() { local line="== $(date -u +%H:%M:%S) $*"; echo "$line" >> "$log"; echo "$line" >&3; }
# budget BUDGET [RESERVE]: the seconds a stage may take (0: skipped on purpose), or -1 where it asked for time and
# none is left before the deadline once RESERVE is kept back -- which fails the run, as running out of time does
budget() { local b; [ "$1" -le 0 ] && { echo 0; return; }; b=$(cap "$1" "${2:-0}"); [ "$b" -le 0 ] && b=-1; echo "$b"; }
# run BUDGET NAME CMD...: the command under `timeout BUDGET` (killed 10 s after, if it ignores the signal), its
# status logged
run() {
  local budget=$1 name=$2; shift 2
  if [ "$budget" -eq 0 ]; then stage "$name: skipped"; return 0; fi
  if [ "$budget" -lt 0 ]; then stage "$name: no time left"; failed=1; return 0; fi
  timeout -k 10 "$budget" "$@"; local rc=$?
  stage "$name: exit $rc$([ $rc -eq 124 ] && echo ' (out of time)')"
  [ $rc -eq 0 ] || failed=1
}
FORMS_OPS=${FORMS_OPS:-mhc_pre,stream_write,mhc,stream_read,parallel2,dyt,derf,parallel,norm_add}
FORMS_SHAPES=${FORMS_SHAPES:-16384x4096}
ADDNORM_ARGS=${ADDNORM_ARGS:---shapes 16384x8192,32768x2048}
forms_args=(--kinds rms --shapes "$FORMS_SHAPES" --dtypes bfloat16,float32 --modes fwd,fwdbwd)

stage "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  python3 -c "import importlib.metadata as m; print('liger', m.version('liger-kernel'))"; } >> "$log" 2>&1
stage "mHC-lite probe"
run "$(budget "${T_PROBE:-0}")" "mHC-lite probe" python3 benchmarks/check_mhc_lite_gpu.py >> "$log" 2>&1

# the warm-up's slices: each fused op by dtype (mhc_pre and mhc, the slow compiles, by mode too), Add & Norm by
# norm and dtype; its own results go to a scratch folder and are never read
warm_dir=$(mktemp -d)
slices=()
for op in ${FORMS_OPS//,/ }; do
  for dt in bfloat16 float32; do
    if [ "$op" = mhc ] || [ "$op" = mhc_pre ]; then
      for mode in fwd fwdbwd; do slices+=("--ops $op --kinds rms --shapes $FORMS_SHAPES --dtypes $dt --modes $mode"); done
    else
      slices+=("--ops $op --kinds rms --shapes $FORMS_SHAPES --dtypes $dt --modes fwd,fwdbwd")
    fi
  done
done
for kind in layer rms; do
  # the slice's norm and dtype first: where ADDNORM_ARGS names its own, they are what the timed stage runs
  for dt in float32 bfloat16; do slices+=("--ops add_norm --kinds $kind --dtypes $dt $ADDNORM_ARGS"); done
done
warm=$(budget "${T_WARM:-150}" "${T_TESTS:-200}")
if [ "$warm" -lt 0 ]; then stage "torch.compile warm-up: no time left"; failed=1; fi
if [ "$warm" -gt 0 ]; then
  stage "torch.compile warm-up: ${#slices[@]} slices, ${WARM_JOBS:-8} at a time"
  # two compile workers each (inductor leaves compile_threads out of its cache key): 16 cores, not 16 a process
  printf '%s\n' "${slices[@]}" | awk -v d="$warm_dir" '{print $0 " --out " d "/" NR-1}' \
    | TORCHINDUCTOR_COMPILE_THREADS=2 timeout -k 10 "$warm" xargs -P "${WARM_JOBS:-8}" -I{} \
      sh -c 'python3 benchmarks/bench_gpu.py {} > /dev/null 2>&1 || echo "warm slice failed: {}"' >> "$log" 2>&1
  rc=$?
  stage "torch.compile warm-up: exit $rc$([ $rc -eq 124 ] && echo ' (out of time: the rest compile in the timed stages)')"
fi
rm -rf "$warm_dir"

stage "launch sweep"
run "$(budget "${T_TUNE:-0}")" "launch sweep" python3 benchmarks/tune_gpu.py --sweeps "${TUNE_SWEEPS:-bwd_tile}" --out "$OUT" \
  > "$OUT/tune.txt" 2>&1
tail -n 40 "$OUT/tune.txt" >> "$log" 2>/dev/null; rm -f "$OUT/tune.txt"
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
run "$(budget "${T_TESTS:-200}")" "tests" python3 -m pytest -q -p no:cacheprovider -p no:benchmark -rfEs tests/ops/test_fused_cuda.py \
  tests/kernels/test_triton_cuda.py tests/kernels/test_huge_rows.py::test_triton_on_a_gpu_gives_the_float64_answer_for_huge_rows \
  tests/frontier/test_frontier_cuda.py \
  >> "$log" 2>&1
stage "fused forms (ADDNORM_TRITON_LAUNCH=${ADDNORM_TRITON_LAUNCH:-defaults})"
forms() {  # forms BUDGET NAME: the fused-forms table, resuming from its journal
  run "$1" "$2" python3 benchmarks/bench_gpu.py --ops "$FORMS_OPS" "${forms_args[@]}" --out "$OUT" > "$OUT/forms.txt" 2>&1
  grep -v "━" "$OUT/forms.txt" | tail -n 60 >> "$log"; rm -f "$OUT/forms.txt"
}
forms "$(budget "${T_FORMS:-200}" "${T_ADDNORM:-110}")" "fused forms"
stage "add_norm"
# shellcheck disable=SC2086  (ADDNORM_ARGS is a list of options)
run "$(budget "${T_ADDNORM:-110}")" "add_norm" python3 benchmarks/bench_gpu.py $ADDNORM_ARGS --out "$OUT" > "$OUT/addnorm.txt" 2>&1
grep -v "━" "$OUT/addnorm.txt" 2>/dev/null | tail -n 50 >> "$log"; rm -f "$OUT/addnorm.txt"
if [ "${T_FORMS:-200}" -gt 0 ] && [ -f "$OUT/fused_forms_gpu.partial.jsonl" ] && [ "$(left)" -gt 15 ]; then
  stage "fused forms, resumed in the time left"
  forms "$(budget 100000 5)" "fused forms (resumed)"
fi
stage "done (failed=$failed)"
exit $failed

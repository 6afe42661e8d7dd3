"""The Triton kernels, without a GPU: in Triton's interpreter on CPU tensors (``backend="triton"``), and
compiled for NVIDIA GPUs (sm_80, sm_90) with no device present. The shared tables (test_parity,
test_edge_cases, test_properties, test_hf_conventions, test_mixed_precision, the kernels' low-precision
and buffer tests) run on this backend too; here is what is particular to it. GPU runs: test_triton_cuda."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

import addnorm
from addnorm.kernels.triton import norm as T
from backends import HAVE_TRITON, NO_TRITON, TRITON

pytestmark = pytest.mark.skipif(not TRITON, reason=NO_TRITON if not HAVE_TRITON else
                                "a GPU is present: the kernels are compiled, not interpreted (test_triton_cuda)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _fn(kind):
    return addnorm.add_layer_norm if kind == "layer" else addnorm.add_rms_norm


def _call(kind, backend, x, r, w, b, **kw):
    if kind == "layer":
        return addnorm.add_layer_norm(x, r, x.shape[-1], w, b, backend=backend, **kw)
    return addnorm.add_rms_norm(x, r, x.shape[-1], w, backend=backend, **kw)


def _inputs(rows, D, dtype, kind, seed=0, grad=True):
    g = torch.Generator().manual_seed(seed)
    x, r = ((torch.randn(rows, D, generator=g) * 2 + 0.5).to(dtype) for _ in range(2))
    w = (1 + 0.3 * torch.randn(D, generator=g)).to(dtype)
    b = (0.3 * torch.randn(D, generator=g)).to(dtype) if kind == "layer" else None
    ts = [t for t in (x, r, w, b) if t is not None]
    if grad:
        for t in ts:
            t.requires_grad_()
    return x, r, w, b, ts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("D", [65, 200, 1000])
@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_rows_longer_than_one_block_match_the_torch_backend(kind, D, dtype, monkeypatch):
    """MAX_BLOCK = 64: every row is walked in chunks (the looped kernels), the last one partial."""
    monkeypatch.setattr(T, "MAX_BLOCK", 64)
    x, r, w, b, ts = _inputs(9, D, dtype, kind)
    dy, ds = torch.randn(9, D).to(dtype), torch.randn(9, D).to(dtype)
    res = {}
    for backend in ("triton", "torch"):
        y, s = _call(kind, backend, x, r, w, b)
        res[backend] = (y, s, *torch.autograd.grad([y, s], ts, [dy, ds]))
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for ours, ref in zip(res["triton"], res["torch"]):
        torch.testing.assert_close(ours.float(), ref.float(), atol=tol * max(1, ref.abs().max().item()), rtol=tol)
    assert torch.equal(res["triton"][1], res["torch"][1])  # the stream: one rounding, as eager


@pytest.mark.parametrize("kind", ["layer", "rms"])
def test_looped_rows_update_the_stream_in_place(kind, monkeypatch):
    """residual_out=residual with chunked rows: later passes must read the stream, not x + (overwritten) r."""
    monkeypatch.setattr(T, "MAX_BLOCK", 32)
    x, r, w, b, _ = _inputs(6, 150, torch.float32, kind, grad=False)
    want_y, want_s = _call(kind, "torch", x, r, w, b)
    out = torch.empty_like(x)
    y, s = _call(kind, "triton", x, r, w, b, out=out, residual_out=r)
    assert y is out and s is r
    torch.testing.assert_close(s, want_s, atol=0, rtol=0)
    torch.testing.assert_close(y, want_y, atol=1e-5, rtol=1e-5)
    x2 = x.clone()
    y2 = addnorm.layer_norm(x2, 150, w, b, out=x2, backend="triton")  # out=x: each chunk read before written
    assert y2 is x2
    torch.testing.assert_close(x2, F.layer_norm(x, (150,), w, b), atol=1e-5, rtol=1e-5)


def test_bfloat16_stores_round_to_nearest_even():
    """The interpreter truncates float32 -> bfloat16; the kernels round as the GPU does, so outputs are the
    correctly rounded float32 results (equal to the torch backend's up to its own float32 rounding)."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 256, generator=g).to(torch.bfloat16)
    r32 = torch.randn(64, 256, generator=g)  # a float32 stream: y is the only rounding to bfloat16
    y, _ = addnorm.add_rms_norm(x, r32, 256, backend="triton")
    y_ref, _ = addnorm.add_rms_norm(x, r32, 256, backend="torch")
    differ = (y != y_ref).float().mean().item()
    assert differ < 0.01, f"{differ:.1%} of bfloat16 outputs differ (truncation differs in about half)"
    ulp = torch.finfo(torch.bfloat16).eps * y_ref.float().abs()
    assert ((y.float() - y_ref.float()).abs() <= ulp).all()


def test_weight_gradient_is_deterministic_and_close_under_another_row_split(monkeypatch):
    x, r, w, b, ts = _inputs(300, 48, torch.float32, "layer")
    dy = torch.randn(300, 48)
    runs = []
    for programs in (4, 4, 7):
        monkeypatch.setattr(T, "_INTERPRETER_PROGRAMS", programs)
        y, _ = _call("layer", "triton", x, r, w, b)
        runs.append(torch.autograd.grad(y, (w, b), dy))
    assert all(torch.equal(a, c) for a, c in zip(runs[0], runs[1]))  # same split: bit for bit
    for a, c in zip(runs[0], runs[2]):  # another split: a different order of float32 sums, still the answer
        torch.testing.assert_close(a, c, atol=1e-5, rtol=1e-6)


def test_operators_have_their_cuda_implementation_registered():
    for op in ("addnorm::add_norm", "addnorm::add_norm_backward"):
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "CUDA"), op


def test_compiled_fullgraph_keeps_the_operator_opaque():
    seen = []

    def backend(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    w = torch.randn(32)

    def f(x, r):
        with addnorm.use_backend("triton"):
            y, s = addnorm.add_rms_norm(x, r, 32, w)
        return y.sum() + s.sum()

    x, r = torch.randn(4, 32), torch.randn(4, 32)
    out = torch.compile(f, backend=backend, fullgraph=True)(x, r)
    assert any("addnorm.add_norm" in t for t in seen[0]), seen
    torch.testing.assert_close(out, f(x, r))


def test_auto_keeps_the_cpu_kernels_on_cpu_tensors():
    addnorm.layer_norm(torch.randn(2, 8), 8)
    assert addnorm.last_backend() == ("cpu" if addnorm.cpu_kernel_availability().available else "torch")
    addnorm.layer_norm(torch.randn(2, 8), 8, backend="triton")
    assert addnorm.last_backend() == "triton"


def test_what_triton_cannot_run_is_refused_by_name():
    with pytest.raises(RuntimeError, match="backend='triton' cannot run this call: x has dtype torch.float64"):
        addnorm.layer_norm(torch.randn(2, 3, dtype=torch.float64), 3, backend="triton")
    with pytest.raises(RuntimeError, match="out_dtype is torch.float64"):
        addnorm.layer_norm(torch.randn(2, 3), 3, out_dtype=torch.float64, backend="triton")
    with pytest.raises(RuntimeError, match="normalized_shape has no elements"):
        addnorm.layer_norm(torch.randn(2, 0), 0, backend="triton")
    with pytest.raises(RuntimeError, match="torch.func transform"):
        torch.func.vmap(lambda a: addnorm.layer_norm(a, 4, backend="triton"))(torch.randn(3, 2, 4))


def _python(code, env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)


def test_without_the_interpreter_cpu_tensors_are_refused_with_the_way_out():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = _python("""
        import torch, addnorm
        try:
            addnorm.layer_norm(torch.randn(2, 4), 4, backend="triton")
        except RuntimeError as e:
            print(e)
        print(addnorm.last_backend(), addnorm.layer_norm(torch.randn(2, 4), 4).shape)
    """, env)
    assert p.returncode == 0, p.stderr
    assert "x is on cpu" in p.stdout and "TRITON_INTERPRET=1" in p.stdout


def test_addnorm_works_without_triton_installed():
    p = _python("""
        import sys
        sys.modules["triton"] = None  # as if not installed
        import torch, addnorm
        y = addnorm.layer_norm(torch.randn(2, 4), 4)
        print(addnorm.last_backend())
        try:
            addnorm.layer_norm(torch.randn(2, 4), 4, backend="triton")
        except RuntimeError as e:
            print(e)
    """, dict(os.environ))
    assert p.returncode == 0, p.stderr
    assert "Triton cannot be imported" in p.stdout and "addnorm[gpu]" in p.stdout


COMPILE = """
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from addnorm.kernels.triton.jit import norm as K

def compile(fn, sig, const, cc):
    sig = dict(sig, **{k: "constexpr" for k in const})
    return triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": 4})

FWD = dict(X="*bf16", R="*fp32", W="*fp32", B="*fp32", Y="*bf16", S="*fp32", MEAN="*fp32", RSTD="*fp32",
           stride_x="i64", stride_r="i64", stride_y="i64", stride_s="i64", N="i32", D="i32", eps="fp32",
           weight_offset="fp32")
BWD = dict(DY="*bf16", DRES="*fp32", S="*fp32", MEAN="*fp32", RSTD="*fp32", W="*fp32", DS="*fp32", DX="*bf16",
           DWP="*fp32", DBP="*fp32", stride_dy="i64", stride_dres="i64", stride_s="i64", stride_ds="i64",
           stride_dx="i64", N="i64", D="i32", rows_per_program="i64", weight_offset="fp32")
for cc in (80, 90):
    for layer, rows, chunks in ((True, 1, 1), (False, 4, 1), (True, 1, 3), (False, 2, 2)):
        compile(K.add_norm_fwd, FWD, dict(IS_LAYER=layer, HAS_R=True, HAS_W=True, HAS_B=layer, STORE_S=True,
                STORE_STATS=True, CAST_BEFORE_W=not layer, SDT=tl.float32, ROWS=rows, BLOCK=1024, CHUNKS=chunks,
                RNE=False), cc)
        compile(K.add_norm_bwd, BWD, dict(IS_LAYER=layer, HAS_DRES=True, HAS_W=True, WANT_DW=True, WANT_DB=layer,
                STORE_DX=True, ROWS=rows, BLOCK=1024, CHUNKS=chunks, RNE=False), cc)
    for block, rows in ((256, 1), (64, 8), (64, 32)):
        compile(K.reduce_partials, dict(P="*fp32", OUT="*fp64", P_ROWS="i32", D="i32"), dict(BLOCK=block, ROWS=rows),
                cc)
print("compiled")
"""


def test_kernels_compile_for_nvidia_gpus_without_one():
    """The interpreter accepts code the compiler rejects; Triton compiles for a GPU target with no device
    (ptxas ships with it): the forward, backward and reduction, row-held and looped, for sm_80 and sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    p = _python(COMPILE, env)
    assert p.returncode == 0 and "compiled" in p.stdout, p.stderr[-3000:]



COMPILE_FUSED = """
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from addnorm.kernels.triton.jit import fused as F, pointwise as P, stream as S

def compile(fn, sig, const, cc):
    sig = dict(sig, **{k: "constexpr" for k in const})
    return triton.compile(ASTSource(fn, sig, const), target=GPUTarget("cuda", cc, 32),
                          options={"num_warps": 4})

def fused_fwd(dt, res, cc, **flags):
    sig = dict(X=f"*{dt}", A=f"*{dt}", M=f"*{dt}", P=f"*{res}", W1="*fp32", B1="*fp32", W2="*fp32", B2="*fp32",
               Y=f"*{dt}", Y2=f"*{dt}", S=f"*{res}", MEAN="*fp32", RSTD="*fp32", sx="i64", sa="i64", sm="i64",
               sp="i64", sy="i64", sy2="i64", ss="i64", N="i32", D="i32", eps="fp32", weight_offset="fp32")
    tdt = dict(bf16=tl.bfloat16, fp16=tl.float16, fp32=tl.float32)[dt]
    const = dict(AMDT=tdt, NDT=tdt, IS_LAYER=True, HAS_A=False, HAS_M=False, HAS_P=False, HAS_W1=True,
                 HAS_B1=False, HAS_W2=False, HAS_B2=False, STORE_Y=True, STORE_Y2=False, STORE_S=False,
                 STORE_STATS=True, CAST_BEFORE_W=False, ROWS=1, BLOCK=1024, RNE=False)
    compile(F.fused_fwd, sig, dict(const, **flags), cc)

def fused_bwd(dt, res, cc, **flags):
    sig = dict(DY=f"*{dt}", DY2=f"*{dt}", DRES=f"*{res}", S=f"*{res}", MEAN="*fp32", RSTD="*fp32", W1="*fp32",
               W2="*fp32", DS=f"*{res}", DWP="*fp32", sdy="i64", sdy2="i64", sdres="i64", s_s="i64", sds="i64",
               N="i32", D="i32", rows_per_program="i32", weight_offset="fp32")
    const = dict(IS_LAYER=True, HAS_DY=True, HAS_DY2=False, HAS_DRES=True, HAS_W1=True, HAS_W2=False,
                 WANT_DW1=True, WANT_DB1=True, WANT_DW2=False, WANT_DB2=False, ROWS=16, BLOCK=1024, RNE=False)
    compile(F.fused_bwd, sig, dict(const, **flags), cc)

for cc in (80, 90):
    # norm-then-add: residual (P) added after the norm; LayerNorm and RMSNorm, a float32 residual beside bf16
    fused_fwd("bf16", "fp32", cc, HAS_P=True, HAS_B1=True, ROWS=4)
    fused_fwd("fp16", "fp16", cc, IS_LAYER=False, HAS_P=True, CAST_BEFORE_W=True, BLOCK=4096)
    # the parallel residual: two branches and two norms (GPT-NeoX); one branch, one norm, a long row
    fused_fwd("bf16", "fp32", cc, HAS_A=True, HAS_M=True, HAS_B1=True, HAS_W2=True, HAS_B2=True, STORE_Y2=True,
              STORE_S=True)
    fused_fwd("fp32", "fp32", cc, IS_LAYER=False, HAS_A=True, STORE_S=True, ROWS=1, BLOCK=16384)
    fused_bwd("bf16", "fp32", cc, HAS_DY2=True, HAS_W2=True, WANT_DW2=True, WANT_DB2=True)
    fused_bwd("fp32", "fp32", cc, IS_LAYER=False, HAS_DRES=False, WANT_DB1=False, ROWS=1, BLOCK=16384)
    for dyt in (True, False):  # DyT and Derf fused with the add
        compile(P.pointwise_fwd, dict(X="*bf16", R="*bf16", ALPHA="*fp32", SHIFT="*fp32", W="*bf16", B="*bf16",
                                      Y="*bf16", S="*bf16", sx="i64", sr="i64", N="i32", D="i32"),
                dict(IS_DYT=dyt, HAS_R=True, HAS_SHIFT=not dyt, HAS_W=True, HAS_B=True, STORE_S=True, ROWS=2,
                     BLOCK=1024, RNE=False), cc)
        compile(P.pointwise_bwd, dict(DY="*bf16", DRES="*bf16", S="*bf16", ALPHA="*fp32", SHIFT="*fp32",
                                      W="*bf16", DS="*bf16", PART="*fp32", sdy="i64", sdres="i64", N="i32",
                                      D="i32", rows_per_program="i32"),
                dict(IS_DYT=dyt, HAS_DRES=dyt, HAS_SHIFT=not dyt, HAS_W=True, ROWS=2, BLOCK=1024, RNE=False), cc)
    for ns in (4, 8):  # the widened stream's read and write, n = 4 and the largest n the kernels take
        compile(S.stream_read, dict(X="*bf16", HP="*fp32", H="*bf16", C="i32"), dict(NS=ns, BLOCK=1024, RNE=False),
                cc)
        compile(S.stream_read_bwd, dict(DH="*bf16", X="*bf16", HP="*fp32", DX="*bf16", DPRE="*fp32", C="i32"),
                dict(NS=ns, BLOCK=1024, RNE=False), cc)
        compile(S.stream_write, dict(X="*bf16", Y="*bf16", HPOST="*fp32", HRES="*fp32", X2="*bf16", Q="*fp32",
                                     C="i32"), dict(NS=ns, BLOCK=1024, STORE_Q=True, RNE=False), cc)
        compile(S.stream_write_bwd, dict(DX2="*bf16", DQ="*fp32", X="*bf16", Y="*bf16", X2="*bf16", HPOST="*fp32",
                                         HRES="*fp32", DX="*bf16", DY="*bf16", DPOST="*fp32", DRES="*fp32",
                                         C="i32"), dict(NS=ns, BLOCK=1024, HAS_DQ=ns == 4, RNE=False), cc)
print("compiled")
"""


def test_fused_pointwise_and_stream_kernels_compile_for_nvidia_gpus_without_one():
    """As above, for issue 22's kernels (the interpreter accepts code a GPU compiler rejects): norm-then-add
    and the parallel residual forward and backward (one and two norms, 16- and 32-bit, a row held whole at the
    largest block), DyT/Derf-add both ways, and the widened stream's read and write both ways at n = 4 and 8,
    for sm_80 and sm_90."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_DEFAULT_FP_FUSION"] = "1"
    p = _python(COMPILE_FUSED, env)
    assert p.returncode == 0 and "compiled" in p.stdout, p.stderr[-3000:]

def test_gpt_trains_the_same_on_the_triton_kernels():
    """addnorm's GPT with backend='triton' (what auto picks on CUDA): the same loss and gradients."""
    from addnorm.model import GPT, GPTConfig

    losses, grads = {}, {}
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    for backend in ("triton", "torch"):
        torch.manual_seed(0)
        m = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=2, n_head=2, n_embd=32, backend=backend))
        _, loss = m(idx, idx)
        losses[backend] = loss
        grads[backend] = torch.autograd.grad(loss, list(m.parameters()))
    assert addnorm.last_backend() == "torch"
    torch.testing.assert_close(losses["triton"], losses["torch"], atol=1e-5, rtol=1e-5)
    for a, b in zip(grads["triton"], grads["torch"]):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_patched_hf_model_runs_on_the_triton_kernels():
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")
    import copy

    from addnorm.interop import patch_hf_model

    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=16, bos_token_id=0, eos_token_id=0, pad_token_id=0)).eval()
    patched = patch_hf_model(copy.deepcopy(ref))
    idx = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    with addnorm.use_backend("triton"):
        out = patched(idx, labels=idx)
        assert addnorm.last_backend() == "triton"
    out_ref = ref(idx, labels=idx)
    torch.testing.assert_close(out.logits, out_ref.logits, atol=1e-5, rtol=1e-5)
    for a, b in zip(torch.autograd.grad(out.loss, list(patched.parameters())),
                    torch.autograd.grad(out_ref.loss, list(ref.parameters()))):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_gpu_benchmark_script_runs_and_refuses_to_guess_without_a_gpu(tmp_path):
    bench = os.path.join(ROOT, "benchmarks", "bench_gpu.py")
    p = subprocess.run([sys.executable, bench], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "not measured" in p.stderr
    p = subprocess.run([sys.executable, bench, "--device", "cpu", "--shapes", "8x64", "--dtypes", "float32",
                        "--kinds", "rms", "--modes", "fwd,fwdbwd", "--methods", "addnorm,eager", "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import csv

    rows = list(csv.DictReader((tmp_path / "add_norm_gpu_cpu.csv").open()))
    assert {(r["mode"], r["method"]) for r in rows} == {(m, k) for m in ("fwd", "fwdbwd") for k in ("addnorm", "eager")}
    assert all(float(r["median_ms"]) > 0 and float(r["frac_of_floor"]) > 0 for r in rows)

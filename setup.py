"""Build the CPU kernel library: plain C, no torch headers, compiled once at install time."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "addnorm.kernels.cpu._addnorm_cpu",
            sources=["src/addnorm/kernels/cpu/addnorm_cpu.c"],
            depends=["src/addnorm/kernels/cpu/norm_rows.h", "src/addnorm/kernels/cpu/fused_rows.h",
                     "src/addnorm/kernels/cpu/stream_rows.h", "src/addnorm/kernels/cpu/mhc_rows.h",
                     "src/addnorm/kernels/cpu/pointwise_rows.h", "src/addnorm/kernels/cpu/attn_res_rows.h",
                     "src/addnorm/kernels/cpu/hyper_rows.h"],
            # associative math lets gcc vectorize the row reductions; no -ffinite-math-only,
            # so NaN and Inf keep their IEEE meaning; no fused multiply-add contraction, so that
            # g = dy*w rounds the same way wherever it is computed (LayerNorm's dx is exactly 0 at D = 1);
            # the polynomials of DyT's tanh and Derf's erf and the other products and sums of their bfloat16
            # loops (pointwise_rows.h), and mHC's projection, ask for fused multiply-adds by name (AN_MAD)
            # where the instruction set has them. The instruction-set variants agree to an ulp
            # or two, not to the bit: associative math lets gcc vectorize each variant's reductions its own
            # way (LayerNorm float32 outputs differ by up to 4.8e-7 between the baseline and AVX-512 builds)
            extra_compile_args=["-O3", "-std=gnu11", "-fno-math-errno", "-fassociative-math",
                                "-fno-signed-zeros", "-fno-trapping-math", "-ffp-contract=off", "-pthread", "-fopenmp"],
            # links libgomp.so.1 by soname: with torch imported first, that is torch's own OpenMP
            # runtime, so both share one thread pool
            extra_link_args=["-pthread", "-fopenmp"],
            # a machine without a C compiler still installs addnorm: the exact pure-torch backend runs
            # instead, and addnorm.cpu_kernel_availability() says why
            optional=True,
        )
    ]
)

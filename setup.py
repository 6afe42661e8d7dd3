"""Build the CPU kernel library: plain C, no torch headers, compiled once at install time."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "addnorm.kernels.cpu._addnorm_cpu",
            sources=["src/addnorm/kernels/cpu/addnorm_cpu.c"],
            depends=["src/addnorm/kernels/cpu/norm_rows.h"],
            # associative math lets gcc vectorize the row reductions; no -ffinite-math-only,
            # so NaN and Inf keep their IEEE meaning
            extra_compile_args=["-O3", "-std=gnu11", "-fno-math-errno", "-fassociative-math",
                                "-fno-signed-zeros", "-fno-trapping-math", "-pthread", "-fopenmp"],
            # links libgomp.so.1 by soname: with torch imported first, that is torch's own OpenMP
            # runtime, so both share one thread pool
            extra_link_args=["-pthread", "-fopenmp"],
        )
    ]
)

"""The @triton.jit kernels, one module per family (``norm``, ``fused``, ``pointwise``, ``stream``, ``mhc``) over
the helpers they share (``common``). Each family's host code (``kernels/triton/<family>.py``) imports its module
here the first time it launches: Triton stays an optional import, and ``TRITON_INTERPRET=1`` set before that
first launch still makes the kernels run in Triton's interpreter."""

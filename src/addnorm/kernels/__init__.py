"""Fast paths behind addnorm.functional: ``cpu`` (the C kernel library), ``triton`` (GPU kernels, the optional
extra ``addnorm[gpu]``; on CPU under Triton's interpreter) and ``torch_ref`` (exact fallback)."""

"""Benchmarks (not tests): the Add & Norm benchmark behind `addnorm bench`, the fused forms on CPU and GPU, the
launch sweep, the model step and the fine-tune; the scripts in the repository's benchmarks/ folder run them."""

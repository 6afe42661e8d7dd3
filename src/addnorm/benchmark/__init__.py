"""Benchmarks (not tests): timing helpers and the Add & Norm benchmark behind `addnorm bench`."""

"""What runs share, below every layer that makes them: result files that survive interruption (store), timing
that can be trusted on a noisy machine (timing), and text to train and measure on (corpus). Imports nothing of
addnorm, so the benchmarks, the experiments, the report and the CLI can all stand on it."""

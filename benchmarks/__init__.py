"""Side-by-side benchmarks of `attn` against the libraries people would pick instead (run `python -m benchmarks.run`).

Never part of the test suite: nothing here is asserted in CI.
"""

"""The benchmarks (make bench, make bench-triggerer, ...), run from the checkout; each prints its numbers."""

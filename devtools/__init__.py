"""Tools only the benchmarks, the load test and the tests use: never installed, never in the image."""

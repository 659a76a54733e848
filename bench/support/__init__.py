"""What the benchmarks share: measurement helpers and helper processes (not benchmarks themselves)."""

"""Benchmarks: measured on this machine, printed as tables, optionally saved as JSON."""

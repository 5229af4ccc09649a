"""Benchmarks: `python -m bench.report` prints the issue tables; speed, sessions and
decode_custom_ops measure one thing each. Shared helpers are in bench/common.py."""

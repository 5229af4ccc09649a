"""Benchmarks: `python -m bench.report` (make bench) prints every ratio from one run.

By concern: models.py (which builds), prompts.py, servers.py (server processes: etserve, the
peer llama-server), client.py (HTTP measurements), workers.py + runtimes.py + decoding.py (one
model in one runtime in its own process), machine.py, table.py (rows and the markdown table),
peer.py (building llama.cpp once, outside the repo); the sections own.py and versus.py, with
fim.py and perplexity.py; sessions.py, speed.py and decode_custom_ops.py also run alone."""

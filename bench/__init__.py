"""Benchmarks that hold context-proxy to the targets of DESIGN.md ("Targets").

`python -m bench.run` (or `make bench`) runs everything; `python -m bench.run --smoke` is the tiny
version `tests/bench/test_smoke.py` runs. Modules:

- workload.py       the deterministic agent transcript and the growing full-history client's bodies
- mock_upstream.py  the fast OpenAI-compatible upstream every target forwards to
- forwarder.py      a bare aiohttp forwarder with no logic, and (--store) the floor: the same plus
                    a minimal durable append of each turn's bytes in raw SQLite
- loadgen.py        the load generator (its own process, driven over stdin/stdout)
- procs.py          starting, pinning, measuring (/proc) and stopping the processes
- litellm_target.py LiteLLM's proxy in its own venv, in front of the same mock
- profiling.py      py-spy flame data -> the proxy's hot spots
- report.py         the table, the verdicts against the targets, JSON + markdown
- run.py            the orchestration
- memprobe.py       context-proxy under tracemalloc (only with --profile)

context.py (what the pipeline does to the prompt) and soak.py (replicas on Redis) are separate
tools; soak.py reuses procs.py, stats.py and mock_upstream.py, so keep their interfaces.
"""

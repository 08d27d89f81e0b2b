"""Trace-driven simulation of placement policies, in the wheel so users can replay their own traces.

- ``trace``       Mooncake-format request traces.
- ``simulator``   replays requests through the real ``TieredStore`` over ``size_tier``'s zero-byte
                  tiers, which keep only page sizes (no bytes moved).
- ``reference``   reference policies for the simulator only: ARC, LIRS, LFU-DA and Belady.
- ``synth``       a second synthetic workload with a different reuse pattern, and chat sessions.
- ``gen_agent``, ``gen_rag``, ``gen_mixed``, ``gen_suite``  seeded generated workloads (agent loops,
                  RAG, chat; one-off documents among conversations, several tenants) by name:
                  ``python -m mooncake_sgl.sim.gen_suite chat|agent|rag|scan|mix|tenants OUT.jsonl``.
"""

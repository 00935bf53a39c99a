"""The online wiring check's engine side (the statistics are :mod:`vllm_eagle3.wiring_check`).

- ``plan.py``: what the check scores in one engine (the candidate wirings, their extra taps), or why it is off;
- ``runners.py``: where the check attaches in each vLLM model runner, and how a step becomes rows;
- ``traces.py``: which requests are followed and what is recorded of them (confirmed tokens, taps);
- ``scorer.py``: the draft's first step on every candidate wiring over a recorded request;
- ``engine_hook.py``: the hook in vLLM's worker, the verdict's log line and report file.
"""

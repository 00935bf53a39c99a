"""A folder ``vllm-eagle3 emulate v2`` puts first on ``PYTHONPATH``: its ``sitecustomize`` runs at the start of every
Python process of the command (API server, engine core, workers), before vLLM imports Triton."""

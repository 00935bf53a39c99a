"""A folder ``vllm-eagle3 emulate avx2`` puts first on ``PYTHONPATH``: its ``sitecustomize`` runs at the start of
every Python process of the emulated command (API server, engine core, workers), before vLLM reads the host."""

"""vllm-eagle3: EAGLE-3 speculative decoding for Kimi K2.5 on vLLM, with an explicit aux-capture spec.

Data flow: target forward -> taps (``spec.py``; engine ids via ``conventions.py``) -> concat in spec order ->
draft ``fc`` -> vLLM's EAGLE-3 proposer. ``resolve.py`` validates target + draft + spec from files;
``plugin.py`` is the vLLM entry point; ``capture.py`` makes vLLM's DeepSeek/Kimi target capture the taps.
Nothing heavy is imported here: vLLM loads this package in every process.
"""

__version__ = "0.1.0"

LOGGER = "vllm.vllm_eagle3"
"""The project's logger name, under vLLM's: vLLM configures a handler only for the ``vllm`` tree
(``DEFAULT_LOGGING_CONFIG`` in ``vllm/logger.py``), so only a line logged there appears in the server's log. Parts
add a suffix (``.watch``, ``.check``, ``.live_k``)."""

"""vllm-eagle3: EAGLE-3 speculative decoding for Kimi K2.5 on vLLM, with an explicit aux-capture spec.

Data flow: target forward -> taps (``spec.py``; engine ids via ``conventions.py``) -> concat in spec order ->
draft ``fc`` -> vLLM's EAGLE-3 proposer. ``resolve.py`` validates target + draft + spec from files;
``plugin.py`` is the vLLM entry point; ``capture.py`` makes vLLM's DeepSeek/Kimi target capture the taps.
Nothing heavy is imported here: vLLM loads this package in every process.
"""

__version__ = "0.1.0"

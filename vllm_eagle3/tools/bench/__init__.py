"""``vllm-eagle3 bench`` (what ``make bench`` runs): with vs without EAGLE-3 on the real vLLM server, with speed
claims that carry their 95 % intervals, the draft/verify split, the embed-tap vs native-capture A/B and advice.

Data flow, one module each: ``plan`` (variants and cells) -> ``run`` (servers, alone or side by side in turns;
``client`` sends the requests, ``timers`` is the worker extension that times the target forward and the draft) ->
the results file -> ``analysis`` (paired intervals from ``stats``, the advice, ``advise``'s k per batch size) ->
``report`` / ``report_adaptive`` (``BENCHMARKS.md`` from ``template.md``, the plot). ``cli`` is the command line.
``heldout`` builds the prompts no shipped model trained on.
Importing the package imports none of them.
"""


def main(argv: list[str] | None = None) -> int:
    """``vllm-eagle3 bench`` (the dispatcher in ``vllm_eagle3.tools.cli`` calls the package's ``main``)."""
    from vllm_eagle3.tools.bench.cli import main as cli_main

    return cli_main(argv)

"""``min_p`` and ``logit_bias`` under speculation on Model Runner V2's own step loop: served, and exact.

Guards issue 47 item 1 on V2. vLLM 0.32 refuses both under speculation (``SamplingParams._validate_spec_decode``);
vllm_eagle3/model_patches/vllm_cpu_spec_min_p_logit_bias.py lifts the refusal on V2 too, where V2's rejection sampler
runs ``Sampler.apply_sampling_params`` on draft and bonus rows alike. If V2 stopped processing the draft rows (or the
patch lifted the refusal where they are not processed), greedy with a bias would differ from no speculation, a +100
bias would let unbiased drafts through, and min-p / banned tokens would leak into sampled output.

One process under ``vllm-eagle3 emulate v2`` (``v2_environ``; this pytest process is untouched) runs this file's
``main``: the shipped pair (float32, eager, EAGLE-3 k = 3, configs/kimi_k25_eagle3.yaml) on V2, then the target alone
on V2 (two engine starts, ~2-4 min on a loaded 2-core box). It writes what each returned as JSON; the tests read it.

The distribution check: ``DIST_SAMPLES`` = 400 seeded requests (seeds 0..399) of 3 tokens each at T = 1.0,
min_p = 0.1, two tokens banned (bias -100). Tokens 2 and 3 come out of speculative verification (token 1 out of the
prefill step). Reference: the exact processed distribution of each context, computed from the raw top-100 logprobs the
engine WITHOUT speculation returns (``exact_dist``; the top 20 must reach below the min-p threshold, asserted).
Checks: every sampled token inside its context's support (a draft row without min-p or the ban lets such tokens
through at once), and Pearson chi-square of the joint (token 1, token 2) and of token 3's marginal against the exact
probabilities, each at alpha 1e-3 (family-wise 2e-3; a shift of effect size w = 0.3 is detected with probability
> 0.8 at n = 400). Seeds are fixed: a given build passes or fails reproducibly.

Structured output on V2 (issue 47 item 3), in the same two engines: tests/e2e/test_structured_output_spec.py's
completions cases of its first prompt (json_schema, regex, choice; greedy, one batch): the speculative engine's tokens
equal the target alone's, each finished by "stop" and valid, with drafts verified and accepted meanwhile.

Batches: on the speculative engine the greedy-with-bias requests and the structured ones each run in a batch of their
own (the drafts and acceptances counted around them are theirs), the +100-bias and min-p requests share one; the target
alone serves its greedy-with-bias and structured requests in one batch (one set of decode steps instead of two; its
batches differ from the speculative engine's either way, whose verify steps carry k + 1 rows a request; seeds are per
request). The process's ``[v2 sampling]`` lines give the seconds
since it started: the 400 seeded requests take about half of it (V2's rejection sampler in Triton's interpreter, and
the target's 400 prefills: MLA on vLLM-CPU has no prefix caching).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from vllm_eagle3.testing.stats import chi_square

from test_structured_output_spec import MAX_TOKENS as STRUCTURED_MAX_TOKENS, offline_cases  # tests/e2e, on sys.path

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / "models" / "kimi-k25-mini"
DRAFT = REPO / "models" / "kimi-k25-mini-eagle3"
SPEC = REPO / "configs" / "kimi_k25_eagle3.yaml"
RUN_TIMEOUT_S = 1500
K = 3
GREEDY_TOKENS = 48
GREEDY_PROMPTS = 4  # the first eval prompts
FORCED = 30  # token id the +100 bias forces
DIST_T, DIST_MIN_P, DIST_TOKENS, DIST_SAMPLES, TOP = 1.0, 0.1, 3, 400, 100
DIST_ALPHA = 1e-3
STRUCTURED = offline_cases(0)  # name -> (prompt, StructuredOutputsParams keywords, validity check)

pytestmark = [pytest.mark.e2e]
if not (TARGET / "config.json").is_file() or not (DRAFT / "eval_prompts.json").is_file():
    pytestmark.append(pytest.mark.skip(reason=f"the trained miniature is not built yet ({TARGET}, {DRAFT})"))


def eval_items() -> list[dict]:
    return json.loads((DRAFT / "eval_prompts.json").read_text())["items"]


def greedy_bias(want: list[int]) -> dict[int, float]:
    """Two of the float32 greedy continuation's tokens banned, one token favoured: the output must change."""
    return {want[3]: -100.0, want[10]: -100.0, 20: 3.0}


def banned(want: list[int]) -> dict[int, float]:
    """The distribution check's ban: the reference prompt's two first greedy tokens."""
    return {want[0]: -100.0, want[1]: -100.0}


def exact_dist(top: dict[int, float], ban: set[int]) -> tuple[dict[int, float], bool]:
    """The next-token distribution V2's sampler draws from at (T, min_p) with ``ban`` at -100, from a context's raw
    top-``TOP`` logprobs: banned tokens out, logits / T, tokens below min_p x the top probability out, renormalised.
    Also whether ``top`` reached below the min-p threshold (else an unseen token could be in the support)."""
    z = {t: lp / DIST_T for t, lp in top.items() if t not in ban}
    cut = max(z.values()) + math.log(DIST_MIN_P)
    keep = {t: math.exp(v - cut) for t, v in z.items() if v >= cut}
    total = sum(keep.values())
    return {t: w / total for t, w in keep.items()}, min(top.values()) / DIST_T < cut


# ------------------------------------------------------------------------------------------------- the V2 process


def _runner_class(worker) -> dict:
    """``collective_rpc`` target: the runner vLLM built, and whether it is Model Runner V2's."""
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2

    cls = type(worker.model_runner)
    return {"class": f"{cls.__module__}.{cls.__name__}", "v2": isinstance(worker.model_runner, V2)}


def _spec_counts(llm) -> dict[str, float]:
    from vllm_eagle3.tools.engine import counter_totals

    t = counter_totals(llm)
    return {
        "drafts": t.get("vllm:spec_decode_num_drafts", 0),
        "accepted": t.get("vllm:spec_decode_num_accepted_tokens", 0),
    }


def _structured_requests() -> tuple[list[str], list]:
    """STRUCTURED's requests, greedy: their prompts and sampling parameters."""
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    params = [
        SamplingParams(
            max_tokens=STRUCTURED_MAX_TOKENS, temperature=0.0, structured_outputs=StructuredOutputsParams(**keywords)
        )
        for _, keywords, _ in STRUCTURED.values()
    ]
    return [prompt for prompt, _, _ in STRUCTURED.values()], params


def _structured_results(outs) -> dict[str, dict]:
    """Each structured request's token ids, text and finish reason, by name (``outs`` in STRUCTURED's order)."""
    return {
        name: {"ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text, "finish": o.outputs[0].finish_reason}
        for name, o in zip(STRUCTURED, outs)
    }


def _structured(llm) -> dict[str, dict]:
    """STRUCTURED's requests, greedy, in one batch of their own."""
    prompts, params = _structured_requests()
    return _structured_results(llm.generate(prompts, params, use_tqdm=False))


def _speculative(out: dict, say) -> None:
    from vllm import SamplingParams

    from vllm_eagle3.tools.engine import start_engine, stop_engine

    items = eval_items()
    prompts = [{"prompt_token_ids": list(map(int, it["prompt_token_ids"]))} for it in items[:GREEDY_PROMPTS]]
    want = [list(map(int, it["continuation_token_ids"])) for it in items[:GREEDY_PROMPTS]]
    engine = start_engine(
        TARGET, DRAFT, env={"EAGLE3_SPEC": str(SPEC)}, num_speculative_tokens=K, disable_log_stats=False
    )
    say(f"speculative engine ready in {engine.startup_s:.0f} s")
    try:
        llm = engine.llm
        out["runner"] = llm.collective_rpc(_runner_class)[0]
        c0 = _spec_counts(llm)
        greedy = [
            SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True, logit_bias=greedy_bias(w))
            for w in want
        ]
        out["greedy_bias"] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, greedy, use_tqdm=False)]
        out["greedy_counts"] = {k: v - c0[k] for k, v in _spec_counts(llm).items()}
        say(f"greedy with a bias: {GREEDY_PROMPTS} requests; speculation {out['greedy_counts']}")
        # The +100 bias requests and the min-p ones in one batch (rows of both kinds side by side in V2's sampler)
        forced = [
            SamplingParams(max_tokens=16, temperature=t, seed=s, ignore_eos=True, logit_bias={FORCED: 100.0})
            for t, s in ((0.0, 0), (1.0, 1), (1.0, 2), (0.7, 3))
        ]
        accepted = [
            SamplingParams(max_tokens=16, temperature=0.8, min_p=0.1, seed=1),
            SamplingParams(
                max_tokens=16,
                temperature=0.8,
                min_p=0.2,
                top_k=20,
                top_p=0.9,
                seed=2,
                logit_bias={FORCED: 2.0},
                presence_penalty=0.5,
            ),
            SamplingParams(max_tokens=16, temperature=0.0, min_p=0.3),
            SamplingParams(max_tokens=16, temperature=1.0, min_p=0.05, logit_bias={FORCED: -5.0}, seed=3),
        ]
        outs = llm.generate(prompts + prompts, forced + accepted, use_tqdm=False)
        out["forced"] = [list(o.outputs[0].token_ids) for o in outs[: len(forced)]]
        out["min_p_lengths"] = [len(o.outputs[0].token_ids) for o in outs[len(forced) :]]
        say(f"+100 bias and min-p: {len(forced) + len(accepted)} requests")
        c0 = _spec_counts(llm)
        out["structured"] = _structured(llm)
        out["structured_counts"] = {k: v - c0[k] for k, v in _spec_counts(llm).items()}
        say(f"structured output: {len(STRUCTURED)} requests; speculation {out['structured_counts']}")
        ban = banned(want[0])
        c0 = _spec_counts(llm)
        dist = [
            SamplingParams(
                max_tokens=DIST_TOKENS, temperature=DIST_T, min_p=DIST_MIN_P, logit_bias=ban, seed=s, ignore_eos=True
            )
            for s in range(DIST_SAMPLES)
        ]
        outs = llm.generate([prompts[0]] * DIST_SAMPLES, dist, use_tqdm=False)
        out["samples"] = [list(o.outputs[0].token_ids) for o in outs]
        out["dist_counts"] = {k: v - c0[k] for k, v in _spec_counts(llm).items()}
        say(f"sampled {DIST_SAMPLES}; speculation {out['dist_counts']}")
    finally:
        stop_engine(engine)


def _plain(out: dict, say) -> None:
    """Without speculation: greedy with the bias, and the raw top-TOP logprobs of every context the check needs."""
    from vllm import SamplingParams

    from vllm_eagle3.tools.engine import start_engine, stop_engine

    items = eval_items()
    prompts = [list(map(int, it["prompt_token_ids"])) for it in items[:GREEDY_PROMPTS]]
    want = [list(map(int, it["continuation_token_ids"])) for it in items[:GREEDY_PROMPTS]]
    engine = start_engine(TARGET, None, env={"EAGLE3_SPEC": str(SPEC)}, max_logprobs=TOP)
    say(f"engine without speculation ready in {engine.startup_s:.0f} s")
    try:
        llm = engine.llm
        out["plain_runner"] = llm.collective_rpc(_runner_class)[0]
        greedy = [
            SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0, ignore_eos=True, logit_bias=greedy_bias(w))
            for w in want
        ]
        texts, structured = _structured_requests()  # with the greedy requests: one batch, the same outputs
        outs = llm.generate([{"prompt_token_ids": p} for p in prompts] + texts, greedy + structured, use_tqdm=False)
        out["plain_greedy_bias"] = [list(o.outputs[0].token_ids) for o in outs[: len(greedy)]]
        out["plain_structured"] = _structured_results(outs[len(greedy) :])
        say(f"greedy with a bias and structured output: {len(outs)} requests")
        ban = set(banned(want[0]))
        top_params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=TOP)

        def tops(prefixes: list[list[int]]) -> list[dict[int, float]]:
            outs = llm.generate([{"prompt_token_ids": prompts[0] + p} for p in prefixes], top_params, use_tqdm=False)
            return [{int(t): lp.logprob for t, lp in o.outputs[0].logprobs[0].items()} for o in outs]

        refs: dict[str, dict[int, float]] = {}
        level = [[]]
        for _ in range(DIST_TOKENS):
            got = tops(level)
            refs.update({",".join(map(str, p)): top for p, top in zip(level, got)})
            level = [p + [t] for p, top in zip(level, got) for t in exact_dist(top, ban)[0]]
            level = level if len(refs) + len(level) <= 400 else []
            if not level:
                break
        out["refs"] = refs
        say(f"{len(refs)} reference contexts")
    finally:
        stop_engine(engine)


def main(path: str) -> int:
    out: dict = {}
    t0 = time.monotonic()

    def say(line: str) -> None:
        print(f"[v2 sampling] {time.monotonic() - t0:5.0f} s: {line}", file=sys.stderr, flush=True)

    try:
        _speculative(out, say)
        _plain(out, say)
    finally:
        Path(path).write_text(json.dumps(out))
    return 0


# ------------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    from vllm_eagle3.tools.emulate import v2_environ

    out = tmp_path_factory.mktemp("spec_sampling_v2")
    log = out / "run.log"
    with log.open("w") as f:
        proc = subprocess.run(
            [sys.executable, __file__, str(out / "run.json")],
            env=v2_environ(),
            cwd=REPO,
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=RUN_TIMEOUT_S,
        )
    text = log.read_text(errors="replace")
    print("\n".join(x for x in text.splitlines() if x.startswith("[v2 sampling]")), flush=True)
    assert proc.returncode == 0, f"the V2 process exited {proc.returncode}; log {log}:\n{text[-4000:]}"
    return json.loads((out / "run.json").read_text())


def test_both_engines_ran_model_runner_v2(run):
    """The process really built V2 (vllm/v1/worker/gpu/), with and without speculation."""
    assert run["runner"]["v2"] and run["plain_runner"]["v2"], (run["runner"], run["plain_runner"])


def test_greedy_logit_bias_identical_to_no_speculation(run):
    """Greedy with logit_bias under speculation returns exactly the tokens of V2 without speculation, the bias did
    change the output (vs the float32 greedy continuation), and drafts were verified and accepted."""
    want = [list(map(int, it["continuation_token_ids"]))[:GREEDY_TOKENS] for it in eval_items()[:GREEDY_PROMPTS]]
    assert run["greedy_bias"] == run["plain_greedy_bias"]
    assert all(a != w for a, w in zip(run["greedy_bias"], want)), "the bias did not change the greedy output"
    c = run["greedy_counts"]
    assert c["drafts"] > 0 and c["accepted"] > 0, c


def test_plus_100_bias_forces_every_token(run):
    """A +100 bias, greedy and sampled: every token is the biased one (bias on the bonus row only would let unbiased
    drafts through)."""
    assert run["forced"] == [[FORCED] * 16] * GREEDY_PROMPTS, run["forced"]


def test_min_p_requests_accepted(run):
    """min_p alone and with top-k / top-p / bias / penalties, sampled and greedy: accepted under speculation (stock
    vLLM raises "not yet supported with speculative decoding") and served to full length."""
    assert run["min_p_lengths"] == [16] * GREEDY_PROMPTS, run["min_p_lengths"]


def test_sampled_distribution_matches_no_speculation(run):
    """Tokens 1-3 of DIST_SAMPLES seeded requests (min_p, ban, T) under speculation against the exact distribution
    without speculation: every token in its context's support; chi-square of (token 1, token 2) and of token 3, each
    p > DIST_ALPHA (the module docstring gives the sample size and the bound)."""
    want = list(map(int, eval_items()[0]["continuation_token_ids"]))
    ban = set(banned(want))
    dist = {}
    for key, top in run["refs"].items():
        dist[key], complete = exact_dist({int(t): lp for t, lp in top.items()}, ban)
        assert complete, f"the top {TOP} logprobs of context {key!r} do not reach below the min-p threshold"
    samples = [tuple(s) for s in run["samples"]]
    assert len(samples) == DIST_SAMPLES and all(len(s) == DIST_TOKENS for s in samples)

    def ctx(s: tuple, i: int) -> str:
        return ",".join(map(str, s[:i]))

    outside = [s for s in samples if any(ctx(s, i) not in dist or s[i] not in dist[ctx(s, i)] for i in range(3))]
    assert not outside, f"{len(outside)} samples hold a banned or below-min-p token, e.g. {outside[:5]}"
    p1 = dist[""]
    joint = {(a, b): p1[a] * q for a in p1 for b, q in dist[str(a)].items()}
    marg3: dict[int, float] = {}
    for (a, b), q in joint.items():
        for c, r in dist[f"{a},{b}"].items():
            marg3[c] = marg3.get(c, 0.0) + q * r
    for what, observed, expected in (
        ("(token 1, token 2)", Counter(s[:2] for s in samples), joint),
        ("token 3", Counter(s[2] for s in samples), marg3),
    ):
        stat, df, p = chi_square(observed, expected, DIST_SAMPLES)
        print(f"[v2 sampling] {what}: {len(expected)} outcomes, chi2 {stat:.1f}, df {df}, p {p:.3g}", flush=True)
        assert p > DIST_ALPHA, f"{what} under speculation differs from no speculation: chi2 {stat:.1f}, df {df}, p {p}"
    c = run["dist_counts"]
    assert c["drafts"] > 0 and c["accepted"] > 0, f"speculation did not run while sampling: {c}"


@pytest.mark.parametrize("name", list(STRUCTURED))
def test_structured_output_greedy_identical_and_valid(run, name):
    """Structured output on V2 under speculation: the tokens equal V2's without speculation (a grammar advanced by a
    rejected draft, or a draft row left unmasked, would differ), finished by "stop" and valid for the schema / regex /
    choice."""
    got, want = run["structured"][name], run["plain_structured"][name]
    print(f"[v2 sampling] structured {name}: {got['text']!r}", flush=True)
    assert got["ids"] == want["ids"], f"speculative {got} != non-speculative {want}"
    assert got["finish"] == "stop", f"grammar not completed in {STRUCTURED_MAX_TOKENS} tokens: {got['text']!r}"
    STRUCTURED[name][2](got["text"])


def test_structured_output_speculated(run):
    """The structured requests ran under speculation: drafts verified and accepted while they were served."""
    c = run["structured_counts"]
    assert c["drafts"] > 0 and c["accepted"] > 0, c


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

"""Output-length rankers on held-out prompts (issue 14 item 4; StreamRL §5.2, Table 4: 87% recall).

    .venv/bin/python benchmarks/rankers.py [--seeds 0 1 2] [--steps 40] [--sample-sigma 0.35] [--jobs 3]
        [--only lm ...] [--lm FIELD=VALUE ...]

Workload ("codemath"): reasoning-style prompts in text, generated here. Seven task families, each
with two or three phrasings (so the task word is not always first); the expected output length is
a function of what the text says: operand digit counts (add: the longer operand; multiply: the
product of the two), list size (sort: n log n), a bound (primes below N: N / ln N), a requested
word count (summarise), none (prove, a long family without numbers), times a style clause at the
end ("answer only." x0.3 ... "explain every step in detail." x3). Half of the prompts start with
an item number ("q17: ", "problem 412. ") that changes nothing. Each sample's length is
lognormal around its prompt's expected length (sigma --sample-sigma, default 0.35), clipped to
[1, 16384] tokens; G=8 samples per prompt, 64 prompts per step.

Protocol: every ranker sees the same training stream (--steps steps; prompts never repeat) and
learns online from each step's finished samples (observe), then ranks HELD-OUT prompts (a pool of
512 never in the stream) 64 at a time, as the dispatcher ranks one step. Recall@20% (poise's
`recall_at`) per 64 prompts, averaged: against the prompt group's observed mean length
(primary: what a dispatched group costs), against the expected length (no noise), and against
one sample per prompt (StreamRL's ground truth was one response per prompt). Also: recall on
SEEN prompts (512 from the stream, fresh samples), what recurring prompts in later epochs get.
The oracle knows each prompt's expected length: the ceiling the per-sample noise leaves.
Time: ms per scores() call (the LM trains inside it: bounded by its max_updates). For the lm
ranker also the log-length RMSE of its held-out predictions per task family; `--lm` sets its
LMRankerConfig fields (the ablations in BENCHMARKS.md), `--only` runs a subset of the rankers.

Writes bench-results/rankers-<timestamp>.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Sequence

from results import write_results  # benchmarks/results.py
from poise.model.length_ranker import LMRanker, LMRankerConfig
from poise.policy.rankers import Finished, Prompt, make_ranker, recall_at
from poise.policy.seeds import stable_seed

PER_STEP, GROUP, HELD_OUT, MAX_LEN = 64, 8, 512, 16384
RANKERS = ("oracle", "random", "history", "learned", "lm")
STYLES = (("", 1.0), (" answer only.", 0.3), (" show your work.", 1.8), (" explain every step in detail.", 3.0))


def _num(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10 ** digits - 1)


def make_prompt(rng: random.Random, uid: str) -> tuple[Prompt, float, str]:
    """One codemath prompt, its expected output length in tokens and its task family."""
    family = rng.choices(["add", "mul", "sort", "primes", "summarise", "prove", "arith"],
                         [0.2, 0.15, 0.15, 0.1, 0.15, 0.05, 0.2])[0]
    if family == "add":
        da, db = rng.randint(1, 12), rng.randint(1, 12)
        a, b = _num(rng, da), _num(rng, db)
        body = rng.choice([f"add {a} and {b}.", f"what is {a} + {b}?", f"compute the sum of {a} and {b}."])
        mean = 60 + 25 * max(da, db)
    elif family == "mul":
        da, db = rng.randint(1, 7), rng.randint(1, 7)
        a, b = _num(rng, da), _num(rng, db)
        body = rng.choice([f"multiply {a} by {b}.", f"what is {a} * {b}?", f"compute the product of {a} and {b}."])
        mean = 80 + 30 * da * db
    elif family == "sort":
        n = min(40, int(2 * (1 - rng.random()) ** (-1 / 1.2)))
        items = " ".join(str(rng.randint(0, 99)) for _ in range(n))
        body = rng.choice([f"sort: {items}", f"put these in ascending order: {items}"])
        mean = 40 + 12 * n * math.log2(n + 1)
    elif family == "primes":
        bound = int(math.exp(rng.uniform(math.log(10), math.log(5000))))
        body = rng.choice([f"list the primes below {bound}.", f"which numbers under {bound} are prime?"])
        mean = 40 + 6 * bound / math.log(bound)
    elif family == "summarise":
        words = rng.choice([20, 50, 100, 200, 400])
        topic = rng.choice(["the water cycle", "a binary search", "the french revolution", "photosynthesis",
                            "how a compiler works", "the rules of chess"])
        body = rng.choice([f"summarise {topic} in {words} words.", f"write {words} words about {topic}."])
        mean = 30 + 1.4 * words
    elif family == "prove":
        claim = rng.choice(["there are infinitely many primes", "sqrt 2 is irrational",
                            "the sum of two even numbers is even", "every tree with n nodes has n-1 edges"])
        body = rng.choice([f"prove that {claim}.", f"show that {claim}."])
        mean = 900.0
    else:  # arith: one-step arithmetic, short whatever the numbers
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        body = rng.choice([f"{a} - {b} = ?", f"what is {a} minus {b}?"])
        mean = 25.0
    style, factor = rng.choice(STYLES)
    prefix = rng.choice(["", "", f"q{rng.randint(1, 999)}: ", f"problem {rng.randint(1, 999)}. "])
    text = prefix + body + style
    return Prompt(uid, text, tokens=len(text)), min(MAX_LEN, mean * factor), family


def sample_lengths(rng: random.Random, mean: float, sigma: float, n: int) -> list[int]:
    return [min(MAX_LEN, max(1, round(mean * rng.lognormvariate(0.0, sigma)))) for _ in range(n)]


def run_seed(seed: int, steps: int, sigma: float, lm: dict, rankers: Sequence[str] = RANKERS) -> dict:
    rng = random.Random(stable_seed("codemath", seed))
    train = [make_prompt(rng, f"t{i:06d}") for i in range(steps * PER_STEP)]
    held = [make_prompt(rng, f"h{i:06d}") for i in range(HELD_OUT)]
    family = {p.prompt_id: f for p, _, f in train + held}
    train, held = [(p, m) for p, m, _ in train], [(p, m) for p, m, _ in held]
    seen = train[:HELD_OUT]
    expected = {p.prompt_id: m for p, m in train + held}
    noise = random.Random(stable_seed("codemath-samples", seed))
    stream = [[Finished(p, n) for p, m in train[s * PER_STEP:(s + 1) * PER_STEP]
               for n in sample_lengths(noise, m, sigma, GROUP)] for s in range(steps)]
    eval_noise = random.Random(stable_seed("codemath-eval", seed))
    truth = {}
    for name, prompts in (("held", held), ("seen", seen)):
        groups = [sample_lengths(eval_noise, m, sigma, GROUP) for _, m in prompts]
        truth[name] = {"observed": [sum(g) / len(g) for g in groups], "expected": [m for _, m in prompts],
                       "one_sample": [g[0] for g in groups]}
    rows = {}
    for name in rankers:
        ranker = (LMRanker(stable_seed("ranker", seed), LMRankerConfig(**lm)) if name == "lm" else
                  make_ranker(name, random.Random(stable_seed("ranker", seed)), lambda p: expected[p.prompt_id]))
        score_ms: list[float] = []
        t0 = time.perf_counter()
        for batch in stream:
            t = time.perf_counter()
            ranker.scores([f.prompt for f in batch[::GROUP]])  # the dispatch of this step (trains the LM)
            score_ms.append(1e3 * (time.perf_counter() - t))
            ranker.observe(batch)
        row = {"train_s": time.perf_counter() - t0, "score_ms_mean": statistics.mean(score_ms),
               "score_ms_max": max(score_ms), "updates": getattr(ranker, "updates", 0)}
        for split, prompts in (("held", held), ("seen", seen)):
            scores = []
            for i in range(0, len(prompts), PER_STEP):  # one step's dispatch at a time
                scores += ranker.scores([p for p, _ in prompts[i:i + PER_STEP]])
            for kind, lengths in truth[split].items():
                row[f"{split}_{kind}"] = statistics.mean(
                    recall_at(scores[i:i + PER_STEP], lengths[i:i + PER_STEP], 0.2)
                    for i in range(0, len(prompts), PER_STEP))
            if split == "held":  # how far off each family's predictions are: log-length RMSE vs expected
                errors: dict[str, list[float]] = {}
                for (p, m), score in zip(prompts, scores):
                    errors.setdefault(family[p.prompt_id], []).append(math.log1p(max(score, 0.0)) - math.log1p(m))
                row["held_rmse_by_family"] = {f: math.sqrt(statistics.mean(e * e for e in errs))
                                              for f, errs in sorted(errors.items())}
        rows[name] = row
    return rows


def parse_lm(pairs: Sequence[str]) -> dict:
    """--lm FIELD=VALUE ... -> LMRankerConfig keyword arguments, each cast to its field's type."""
    types = {f.name: f.type for f in dataclasses.fields(LMRankerConfig)}
    out = {}
    for pair in pairs:
        name, _, value = pair.partition("=")
        if name not in types or not value:
            raise SystemExit(f"rankers.py: --lm {pair!r}: give FIELD=VALUE with FIELD one of {', '.join(types)}")
        out[name] = float(value) if types[name] in (float, "float") else int(value)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--steps", type=int, default=40, help="training steps of 64 prompts x 8 samples")
    ap.add_argument("--sample-sigma", type=float, default=0.35, help="lognormal sigma of a sample around its prompt")
    ap.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes (each pins 1 torch thread)")
    ap.add_argument("--lm", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="LMRankerConfig fields for the lm ranker, e.g. digit_places=0 updates_per_prompt=1")
    ap.add_argument("--only", nargs="*", default=list(RANKERS), choices=RANKERS, help="rankers to run")
    args = ap.parse_args()
    lm = parse_lm(args.lm)
    rankers = [n for n in RANKERS if n in args.only]
    t0 = time.perf_counter()
    per_seed = {}
    with ProcessPoolExecutor(args.jobs) as pool:
        futures = {seed: pool.submit(run_seed, seed, args.steps, args.sample_sigma, lm, rankers) for seed in args.seeds}
        for seed, fut in futures.items():
            per_seed[seed] = fut.result()
            print(f"seed {seed}: " + "  ".join(f"{n} {r['held_observed']:.3f}" for n, r in per_seed[seed].items()),
                  flush=True)
    keys = ("held_observed", "held_expected", "held_one_sample", "seen_observed", "score_ms_mean", "score_ms_max")
    summary = {}
    for name in rankers:
        summary[name] = {}
        for k in keys:
            vals = [per_seed[s][name][k] for s in args.seeds]
            summary[name][k] = {"mean": statistics.mean(vals), "min": min(vals), "max": max(vals),
                                "stdev": statistics.stdev(vals) if len(vals) > 1 else 0.0}
    print(f"\ncodemath, {args.steps} training steps x {PER_STEP} prompts x {GROUP} samples, sample sigma "
          f"{args.sample_sigma}, seeds {args.seeds}; recall@20% mean [min, max]")
    print(f"{'ranker':<8} {'held-out (group mean)':>22} {'held-out (expected)':>20} {'held-out (1 sample)':>20} "
          f"{'seen (group mean)':>20} {'ms/scores()':>12}")
    for name in rankers:
        s = summary[name]
        cell = lambda k: f"{s[k]['mean']:.3f} [{s[k]['min']:.2f},{s[k]['max']:.2f}]"  # noqa: E731
        print(f"{name:<8} {cell('held_observed'):>22} {cell('held_expected'):>20} {cell('held_one_sample'):>20} "
              f"{cell('seen_observed'):>20} {s['score_ms_mean']['mean']:>12.1f}")
    if "lm" in rankers:
        families = list(per_seed[args.seeds[0]]["lm"]["held_rmse_by_family"])
        print(f"\nlm ranker ({lm or 'defaults'}): held-out log-length RMSE vs expected, by family, mean over seeds")
        print("  ".join(f"{f} {statistics.mean(per_seed[s]['lm']['held_rmse_by_family'][f] for s in args.seeds):.3f}"
                        for f in families))
    wall = time.perf_counter() - t0
    print(f"\n({wall:.1f} s wall)")
    write_results("rankers", {"workload": "codemath", "steps": args.steps, "prompts_per_step": PER_STEP,
                              "group_size": GROUP, "held_out": HELD_OUT, "sample_sigma": args.sample_sigma,
                              "seeds": args.seeds, "lm_config": lm, "summary": summary, "per_seed": per_seed, "wall_s": wall})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

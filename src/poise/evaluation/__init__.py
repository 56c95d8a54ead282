"""Held-out evaluation: greedy and sampled responses to problems training never draws.

`heldout` (torch-free) holds the problems, the requests and the metrics; `engine` generates them on a
model with engines of their own. The colocated loop evaluates in process; the Ray driver fans the
requests out to its rollout devices (runtime/evaluation.py); `poise eval` evaluates a checkpoint.

What keeps training's bits: eval samples have ids of their own, `(-1 - version, prompt, j)` (training's
steps are >= 0), so their sampling randomness is a stream of its own (docs/design.md invariant 2); they run
on engines of their own over the same modules (the training engine's slots, queue and weights version
are not touched); nothing is trained on them, and their metrics go under `eval/`.
"""

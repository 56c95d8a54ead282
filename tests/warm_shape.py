"""The session's SFT warm start (tests/conftest.py `warm_start`): its overrides, shared with the
vLLM tests' variant (tests/vllm_backend/conftest.py)."""

# The warm start: ~8 s of CPU at one thread. After it, 3 or 4 of the 4 groups of each RL step 0-2
# have unequal partial rewards (seeds 0-2 measured). Sort-only prompts: `span` and `arith` stay
# at reward 0 after so short an SFT, and a narrower model earns fewer partial rewards.
WARM_START_DATA = "[{mix: {sort: 1.0}}]"
WARM_START = [
    "model.tiny.hidden_size=64",
    "model.tiny.intermediate_size=128",
    "model.tiny.max_positions=96",
    "model.sft.steps=100",
    "model.sft.batch_size=16",
    "model.sft.lr=1e-2",
    f"data.phases={WARM_START_DATA}",
]

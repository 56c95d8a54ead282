"""Qwen3 and Mistral in the rollout engine: HF equivalence in every engine mode, the sliding window,
and the one-line refusal of a model type the engine cannot run."""

from __future__ import annotations

import pytest
import torch

from poise.config import ModelConfig
from poise.errors import ConfigError, PoiseError
from poise.model.loading import TinyModelConfig, build_tiny, load_model, save_model
from poise.rollout.engine import Engine, EngineConfig
from poise.rollout.kv_cache import KVCache
from poise.rollout.runner import DecoderRunner, StepInputs, plan_decode_groups
from poise.rollout.sampling import SamplingConfig
from poise.schema import build
from poise.types import Request

VOCAB = 60
WINDOW = 8  # Mistral's sliding window: shorter than the prompts + responses below, so it bites
GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=24)
STOCHASTIC = SamplingConfig(temperature=1.0, top_p=0.9, top_k=20, max_new_tokens=24)
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=128, max_position_embeddings=96, tie_word_embeddings=True, eos_token_id=2,
              pad_token_id=0, bos_token_id=1)
SUPPORTED_LINE = "supports model types llama, qwen2, qwen3, mistral"


def hf_config(family: str):
    from transformers import MistralConfig, Qwen3Config

    if family == "qwen3":  # head_dim 32 != hidden / heads = 16: the q/k/v widths differ from hidden
        return Qwen3Config(head_dim=32, **COMMON)
    return MistralConfig(sliding_window=WINDOW, **COMMON)


def random_model(config, seed: int) -> torch.nn.Module:
    """std 0.2 weights (HF's 0.02 leaves attention nearly uniform) and norms away from 1, so that
    RoPE, the window and Qwen3's q/k norms (each with its own weights) all change the tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.3 * noise if "norm" in name else 0.2 * noise)
    return model


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    dirs = {}
    for family in ("qwen3", "mistral"):
        dirs[family] = tmp_path_factory.mktemp(f"tiny-{family}")
        save_model(random_model(hf_config(family), seed=5), dirs[family])
    return dirs


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Lengths 2..19: some prompts fit the window, some overflow it already in prefill."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (int(torch.randint(2, 20, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def hf_greedy(model, ps: list[list[int]]) -> list[tuple[list[int], torch.Tensor]]:
    """HF `generate`'s greedy tokens and, from one HF forward over prompt + response, their logprobs."""
    out = []
    with torch.inference_mode():
        for p in ps:
            ids = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 do_sample=False, max_new_tokens=GREEDY.max_new_tokens, eos_token_id=2,
                                 pad_token_id=0)[0, len(p):].tolist()
            logits = model(torch.tensor([p + ids])).logits[0, len(p) - 1:-1].float()
            out.append((ids, torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]))
    return out


PROMPTS = prompts(7, seed=3)


@pytest.fixture(scope="module")
def hf_reference(family_dirs):
    return {family: hf_greedy(load_model(path), PROMPTS) for family, path in family_dirs.items()}


MODES = {
    # 3 slots for 7 prompts: slots are reused, prefills ride along decode steps, decode is ragged
    "fast, 3 slots": dict(num_slots=3),
    # all 7 prompts admitted at once: padded into one prefill batch
    "fast, 8 slots": dict(num_slots=8),
    # batch-invariant rows (row quantum, key buckets) and fixed-shape tiles (CUDA's fallback)
    "batch_invariant": dict(num_slots=3, batch_invariant=True, invariant_tile=4),
    "batch_invariant tiles": dict(num_slots=3, batch_invariant=True, invariant_tile=4),
}


def force_tiles(monkeypatch) -> None:
    """A runner that finds no row quantum: batch_invariant falls back to fixed-shape tiles."""
    monkeypatch.setattr(DecoderRunner, "row_quantum", lambda self: 0)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_greedy_tokens_and_logprobs_equal_hf(family, mode, family_dirs, hf_reference, monkeypatch):
    if mode.endswith("tiles"):
        force_tiles(monkeypatch)
    model = load_model(family_dirs[family])
    assert model.config.model_type == family
    eng = Engine(model, EngineConfig(**MODES[mode]), GREEDY, seed=7, eos_id=2)
    samples = eng.generate([Request((0, i, 0), p) for i, p in enumerate(PROMPTS)])
    for sample, p, (tokens, logprobs) in zip(samples, PROMPTS, hf_reference[family]):
        assert list(sample.token_ids) == tokens, f"prompt {p}"
        assert torch.allclose(torch.tensor(sample.logprobs), logprobs, atol=1e-4), f"prompt {p}"
    assert len({tuple(t) for t, _ in hf_reference[family]}) > 1  # not a degenerate comparison
    assert max(len(p) + len(t) for p, (t, _) in zip(PROMPTS, hf_reference[family])) > 3 * WINDOW


def test_the_sliding_window_changes_mistral_tokens(family_dirs, hf_reference):
    """Without the window the engine would disagree with HF: the equality above tests the window."""
    model = load_model(family_dirs["mistral"])
    model.config.sliding_window = None
    samples = Engine(model, EngineConfig(num_slots=3), GREEDY, seed=7, eos_id=2).generate(
        [Request((0, i, 0), p) for i, p in enumerate(PROMPTS)])
    assert any(list(s.token_ids) != t for s, (t, _) in zip(samples, hf_reference["mistral"]))


@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_every_ragged_decode_group_layout_equals_hf(family, family_dirs):
    """Views with idle slots, gathers and one-row groups, each attending beyond the window."""
    model = load_model(family_dirs[family])
    runner = DecoderRunner(model)
    runner.group_overhead = 0  # cut wherever it saves anything
    cache = KVCache(runner.cache_shape(8, 64), runner.dtype, runner.device)
    g = torch.Generator().manual_seed(0)
    lengths = [28, 39, 45, 36, 41, 34, 14, 23]
    ps = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in lengths]
    runner.forward(StepInputs(prefills=list(enumerate(ps))), cache)
    live = [0, 1, 2, 4, 5, 6, 7]  # slot 3 idles
    step = StepInputs(decode_slots=live, decode_tokens=[20 + s for s in live],
                      decode_positions=[lengths[s] for s in live])
    plans = plan_decode_groups(live, step.decode_positions, 0, runner.max_decode_groups)
    assert {p.gather for p in plans} == {True, False}
    assert any(len(p.rows) == 1 and p.length > WINDOW for p in plans)  # lockstep, yet windowed
    logits = runner.forward(step, cache)
    with torch.inference_mode():
        for row, slot in enumerate(live):
            expected = model(torch.tensor([ps[slot] + [20 + slot]])).logits[0, -1].float()
            assert torch.allclose(logits[row], expected, atol=1e-4), slot


@pytest.mark.parametrize("mechanism", ["rows", "tiles"])
@pytest.mark.parametrize("family", ["qwen3", "mistral"])
def test_batch_invariant_bitwise_under_slots_and_company(family, mechanism, family_dirs, monkeypatch):
    if mechanism == "tiles":
        force_tiles(monkeypatch)
    model = load_model(family_dirs[family])
    reqs = [Request((0, i, i % 2), p, 4 + 3 * i) for i, p in enumerate(prompts(6, seed=8))]
    others = [Request((1, i, 0), p, 12) for i, p in enumerate(prompts(5, seed=9))]

    def run(slots: int, batch: list[Request]) -> dict:
        eng = Engine(model, EngineConfig(num_slots=slots, batch_invariant=True, invariant_tile=4), STOCHASTIC,
                     seed=7, eos_id=None)
        assert (eng.row_quantum > 0) == (mechanism == "rows")
        return {s.sample_id: (s.token_ids, s.logprobs) for s in eng.generate(batch)}

    alone = run(1, reqs)
    crowded = run(7, others + reqs[::-1])
    assert {sid: crowded[sid] for sid in alone} == alone


@pytest.mark.parametrize("arch", ["qwen3", "mistral"])
def test_builtin_tiny_model_of_the_new_families(arch):
    tiny = TinyModelConfig(arch=arch, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64,
                           max_positions=32)
    model = build_tiny(tiny, VOCAB, seed=1)
    assert model.config.model_type == arch and model.model.layers[0].self_attn.head_dim == 8
    assert build(ModelConfig, {"tiny": {"arch": arch}}).tiny.arch == arch
    p = [5, 6, 7, 8]
    sample = Engine(model, EngineConfig(num_slots=2), GREEDY, seed=0, eos_id=None).generate(
        [Request((0, 0, 0), p, 4)])[0]
    with torch.inference_mode():
        expected = model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=4, pad_token_id=0)[0, 4:]
    assert list(sample.token_ids) == expected.tolist()


def test_unsupported_model_types_are_refused_in_one_line(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel, PhiConfig, PhiForCausalLM

    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=32))
    save_model(gpt2, tmp_path / "gpt2")
    with pytest.raises(PoiseError, match=SUPPORTED_LINE + r"; got 'gpt2'") as err:
        load_model(tmp_path / "gpt2")  # refused from config.json, before the weights load
    assert "\n" not in str(err.value)

    phi = PhiForCausalLM(PhiConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                   intermediate_size=64, max_position_embeddings=32))
    with pytest.raises(PoiseError, match=SUPPORTED_LINE + r"; got 'phi'") as err:
        Engine(phi, EngineConfig(num_slots=2), GREEDY, seed=0, eos_id=None)
    assert "\n" not in str(err.value)

    with pytest.raises(ConfigError, match="arch.*'phi'.*one of 'qwen2', 'llama', 'qwen3', 'mistral'"):
        build(ModelConfig, {"tiny": {"arch": "phi"}})


def test_qwen3_sliding_window_on_every_layer_equals_hf_and_a_mix_is_refused():
    from transformers import Qwen3Config

    sliding = random_model(Qwen3Config(head_dim=16, use_sliding_window=True, sliding_window=WINDOW,
                                       max_window_layers=0, **COMMON), seed=6)
    assert set(sliding.config.layer_types) == {"sliding_attention"}
    ps = PROMPTS[:3]
    samples = Engine(sliding, EngineConfig(num_slots=2), GREEDY, seed=0, eos_id=2).generate(
        [Request((0, i, 0), p) for i, p in enumerate(ps)])
    reference = hf_greedy(sliding, ps)
    assert [list(s.token_ids) for s in samples] == [t for t, _ in reference]
    sliding.config.layer_types = ["full_attention"] * 2  # the same weights without the window disagree
    unwindowed = Engine(sliding, EngineConfig(num_slots=2), GREEDY, seed=0, eos_id=2).generate(
        [Request((0, i, 0), p) for i, p in enumerate(ps)])
    assert [list(s.token_ids) for s in unwindowed] != [t for t, _ in reference]

    sliding.config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(PoiseError, match=r"mixes attention layer types .* use_sliding_window: false") as err:
        Engine(sliding, EngineConfig(num_slots=2), GREEDY, seed=0, eos_id=None)
    assert "\n" not in str(err.value)

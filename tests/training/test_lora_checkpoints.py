"""LoRA in the colocated loop: a resumed run continues byte for byte, and `poise export` writes the
merged weights that transformers loads with the trainer's merged model's logits.

From the session's SFT warm start, so the adapter moves every step. The merge is checked against
peft's own (each LoRA layer's `merge()`), bit for bit in float32, and the exported model's logits against
the unmerged adapter's (equal up to float rounding: merging reassociates the sum).
"""

import hashlib

import pytest
import torch

from poise.cli import main
from poise.config import load_train_config
from poise.training.colocated import train_colocated

STEPS = 3
RUN = [
    "pipeline.mode=colocated",
    "run.progress=false",
    "run.log_tokens=true",
    "run.checkpoint_every=1",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.micro_batch_size=3",
    "algorithm.sampling.max_new_tokens=12",
    "rollout.num_slots=8",
    "model.lora.r=4",
    "model.lora.alpha=8",
    "model.lora.target_modules=[q_proj,v_proj,up_proj,down_proj]",
    "algorithm.lr=3e-3",
]


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def straight(tmp_path_factory, warm_start, read_run):
    path = tmp_path_factory.mktemp("lora") / "straight"
    train_colocated(load_train_config(None, [*RUN, *warm_start.overrides, f"run.dir={path}", f"run.steps={STEPS}",
                                             f"eval.every={STEPS}", "eval.problems=4", "eval.k=2"]))
    return read_run(path)


def test_poise_eval_of_a_lora_run_gives_its_rows_numbers(straight, tmp_path):
    """`poise eval RUN_DIR` builds the run's base, attaches its adapter and loads the checkpoint's."""
    import json

    out = tmp_path / "eval.json"
    assert main(["eval", str(straight.run_dir), "--out", str(out)]) == 0
    got, row = json.loads(out.read_text())["eval"], straight.rows[-1]["eval"]
    got.pop("seconds"), row.pop("seconds")
    assert got == row and got["version"] == STEPS


def test_lora_resume_continues_byte_identical(straight, tmp_path, warm_start, read_run):
    path = tmp_path / "resumed"
    train_colocated(load_train_config(None, [*RUN, *warm_start.overrides, f"run.dir={path}", "run.steps=1"]))
    train_colocated(load_train_config(path / "config.yaml", [f"run.steps={STEPS}"]), resume=True)
    resumed = read_run(path)
    assert [r["step"] for r in resumed.rows] == list(range(STEPS))
    assert all(r["grad_norm"] > 0 for r in straight.rows)
    resumed.assert_bitwise_equal(straight, "LoRA: resumed after step 0 vs straight")
    # the adapter moved at every step after the resume: the comparison could fail
    digests = [_digest(straight.checkpoint(k) / "model.safetensors") for k in range(1, STEPS + 1)]
    assert len(set(digests)) == STEPS


def _models(run_dir, step):
    """The trainer's model at checkpoint `step` (base + adapter, restored as --resume does) and
    the same with peft's merge applied (its LoRA layers then add nothing:
    merged layers skip the adapter)."""
    from poise.data.tokenizer import load_tokenizer
    from poise.training.checkpoint import checkpoint_dir, load_weights
    from poise.training.setup import make_policy

    cfg = load_train_config(run_dir / "config.yaml")
    tokenizer = load_tokenizer(cfg.data.tokenizer, cfg.model.path)
    model = make_policy(cfg, tokenizer, progress=False)
    load_weights(checkpoint_dir(run_dir, step), model)
    merged = make_policy(cfg, tokenizer, progress=False)
    load_weights(checkpoint_dir(run_dir, step), merged)
    for module in merged.modules():  # peft's merge, in place: each base weight += its adapter's delta
        if hasattr(module, "lora_A"):
            module.merge()
    return model.eval(), merged.eval()


def test_lora_export_writes_merged_weights(straight, tmp_path, warm_start):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert main(["export", str(straight.run_dir), "--out", str(out)]) == 0
    exported = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    trained, peft_merged = _models(straight.run_dir, STEPS)
    # the merge is peft's own, bit for bit (float32)
    weights = load_file(str(out / "model.safetensors"))
    reference = {n.replace(".base_layer.", "."): p for n, p in peft_merged.named_parameters() if ".lora_" not in n}
    assert weights.keys() == reference.keys()
    assert all(torch.equal(weights[n], reference[n]) for n in weights)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 22, 4]])
    with torch.no_grad():
        got, merged, unmerged = exported(ids).logits, peft_merged(ids).logits, trained(ids).logits
    assert torch.equal(got, merged)
    assert torch.allclose(got, unmerged, atol=1e-5, rtol=0), float((got - unmerged).abs().max())
    # the adapter's weights, not the base's: the export could be of the wrong thing
    start = AutoModelForCausalLM.from_pretrained(str(warm_start.path), local_files_only=True).eval()
    with torch.no_grad():
        assert (start(ids).logits - got).abs().max() > 1e-4


def test_a_lora_checkpoint_is_not_taken_for_a_model(straight):
    """A checkpoint's model.safetensors holds the adapter alone: loading it as a model says so."""
    from poise.errors import PoiseError
    from poise.model.loading import load_model

    with pytest.raises(PoiseError, match="holds a LoRA adapter .* `poise export"):
        load_model(straight.checkpoint(STEPS))

"""`poise export`: a run's checkpoint as an HF model directory that transformers loads with the
trainer's logits, and that `poise train` takes as model.path."""

import json

import pytest
import torch

from poise.cli import main
from poise.config import load_train_config
from poise.training.colocated import train_colocated

RUN = [
    "pipeline.mode=colocated",
    "run.progress=false",
    "run.steps=2",
    "run.checkpoint_every=1",
    "algorithm.prompts_per_step=4",
    "algorithm.group_size=4",
    "algorithm.sampling.max_new_tokens=12",
    "rollout.num_slots=8",
]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, warm_start):
    path = tmp_path_factory.mktemp("export") / "run"
    train_colocated(load_train_config(None, [*RUN, *warm_start.overrides, f"run.dir={path}"]))
    return path


def _trained_model(run_dir, step):
    """The trainer's model at checkpoint `step`, restored the way --resume restores it."""
    from poise.data.tokenizer import load_tokenizer
    from poise.training.checkpoint import checkpoint_dir, load_checkpoint
    from poise.training.setup import make_model
    from poise.training.trainer import PolicyTrainer

    cfg = load_train_config(run_dir / "config.yaml")
    model = make_model(cfg, load_tokenizer(cfg.data.tokenizer, cfg.model.path), progress=False)
    load_checkpoint(checkpoint_dir(run_dir, step), model, PolicyTrainer(model, cfg.algorithm, 0).optimizer)
    return model.eval()


def test_export_loads_in_transformers_with_the_trainers_logits(run_dir, tmp_path, warm_start, capsys):
    from transformers import AutoModelForCausalLM

    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    assert {"config.json", "model.safetensors", "poise_tokenizer.json"} <= {p.name for p in out.iterdir()}
    exported = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True).eval()
    trained = _trained_model(run_dir, 2)
    ids = torch.tensor([[1, 5, 9, 14, 3, 7, 22, 4]])
    with torch.no_grad():
        got, want = exported(ids).logits, trained(ids).logits
    assert torch.equal(got, want)
    # the trained weights, not the warm start's: the export could be of the wrong thing
    start = AutoModelForCausalLM.from_pretrained(str(warm_start.path), local_files_only=True).eval()
    with torch.no_grad():
        assert not torch.equal(start(ids).logits, got)
    # an earlier step, by --step
    assert main(["export", str(run_dir), "--step", "1", "--out", str(tmp_path / "hf1")]) == 0
    step1 = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf1"), local_files_only=True).eval()
    with torch.no_grad():
        assert torch.equal(step1(ids).logits, _trained_model(run_dir, 1)(ids).logits)
        assert not torch.equal(step1(ids).logits, got)


def test_poise_train_takes_the_export_as_model_path(run_dir, tmp_path, warm_start):
    out = tmp_path / "hf"
    assert main(["export", str(run_dir), "--out", str(out)]) == 0
    again = tmp_path / "again"
    rc = main(["train", *RUN, "run.steps=1", f"model.path={out}", "data.tokenizer=model", f"run.dir={again}",
               *warm_start.overrides[1:]])
    assert rc == 0
    rows = [json.loads(line) for line in (again / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0]


@pytest.mark.parametrize("case", ["not-empty", "no-step", "no-run"])
def test_bad_export_input_is_one_line_and_exit_2(run_dir, tmp_path, capsys, case):
    out = tmp_path / "hf"
    args = ["export", str(run_dir), "--out", str(out)]
    if case == "not-empty":
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    elif case == "no-step":
        args += ["--step", "7"]
    else:
        args[1] = str(tmp_path)
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("poise: error:") and "\n" not in err, err
    if case == "not-empty":
        assert (out / "keep.txt").read_text() == "mine"  # nothing lost
    else:
        assert not out.exists()

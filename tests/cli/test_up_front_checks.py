"""Input that only the model, the tokenizer or the machine can reveal is refused before Ray starts:
one line, exit 2, and no run directory (it is made before Ray starts, so its absence proves the
check came first; no wall-clock bound, which a loaded machine would break: the late failures these
replace took 26-150 s)."""

import pytest
import torch

from cli_checks import assert_one_line_error, poise  # tests/cli_checks.py
from poise.config import ClusterConfig
from poise.errors import PoiseError


def _word_tokenizer(directory, words: int) -> None:
    """An HF tokenizer of `words` + 2 tokens, larger than the char tokenizer's 58."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<pad>": 1, **{f"w{i}": i + 2 for i in range(words)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>").save_pretrained(directory)


def _char_model(directory) -> None:
    """A real tiny checkpoint whose embedding has the char tokenizer's 58 rows."""
    from poise.config import TinyModelConfig
    from poise.data.tokenizer import CharTokenizer
    from poise.model.loading import build_tiny, save_model

    tok = CharTokenizer()
    save_model(build_tiny(TinyModelConfig(), tok.vocab_size, 0, tok.eos_id, tok.pad_id, tok.bos_id), directory, tok)


@pytest.mark.parametrize("mode", ["sync", "colocated"])
def test_tokenizer_larger_than_the_model_fails_up_front(tmp_path, mode):
    _word_tokenizer(tmp_path / "tok", 200)
    _char_model(tmp_path / "model")
    result = poise("train", f"model.path={tmp_path / 'model'}", f"data.tokenizer={tmp_path / 'tok'}",
                   f"pipeline.mode={mode}", f"run.dir={tmp_path / 'run'}", "run.progress=false")
    assert_one_line_error(result, "data.tokenizer", "model.path", "202 tokens", "embeds 58")
    assert not (tmp_path / "run").exists()  # before the run directory, so before Ray


def test_tokenizer_that_fits_the_model_passes(tmp_path):
    """The check compares sizes, not names: a tokenizer no larger than the embedding passes."""
    from poise.config import DataConfig, ModelConfig
    from poise.data.prompts import check_vocab
    from poise.data.tokenizer import load_tokenizer

    _word_tokenizer(tmp_path / "tok", 50)  # 52 <= 58
    _char_model(tmp_path / "model")
    data, model = DataConfig(tokenizer=str(tmp_path / "tok")), ModelConfig(path=str(tmp_path / "model"))
    check_vocab(data, model, load_tokenizer(data.tokenizer))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a usable GPU")
@pytest.mark.parametrize("mode", ["sync", "colocated"])
def test_cuda_device_without_a_gpu_fails_up_front(tmp_path, mode):
    result = poise("train", "cluster.device=cuda", f"pipeline.mode={mode}", f"run.dir={tmp_path / 'run'}",
                   "run.progress=false")
    assert_one_line_error(result, "cluster.device=cuda", "cluster.device=cpu")
    assert not (tmp_path / "run").exists()


def test_cuda_device_without_nccl_is_refused(monkeypatch):
    """The second half of the device check, on a torch that sees GPUs but lacks NCCL: needed
    between devices that hold whole GPUs, not by devices sharing one (gloo) or by one process."""
    import torch.distributed as dist

    from poise.training.setup import check_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: False)
    with pytest.raises(PoiseError, match="no NCCL built in"):
        check_device(ClusterConfig(device="cuda"), colocated=False)
    check_device(ClusterConfig(device="cuda", gpus_per_device=0.5), colocated=False)  # gloo between them
    check_device(ClusterConfig(device="cuda"), colocated=True)  # one process: no collectives
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    check_device(ClusterConfig(device="cuda"), colocated=False)  # with NCCL the same machine passes

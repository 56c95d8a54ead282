import pytest

from poise.data.tokenizer import CharTokenizer, load_tokenizer
from poise.errors import PoiseError


def test_char_tokenizer_round_trip_and_fixed_ids():
    tok = CharTokenizer()
    text = "sort 5 2 9 1\n"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert tok.decode([tok.bos_id, *ids, tok.eos_id, tok.pad_id]) == text  # specials are dropped
    # the vocabulary is fixed: changing these ids would break every saved checkpoint
    assert tok.encode("0a ") == [3, 13, 52] and tok.vocab_size == 58


def test_hf_tokenizer_from_a_local_directory(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<eos>": 0, "<pad>": 1, "sort": 2, "1": 3, "2": 4}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<pad>").save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert tok.encode("sort 2 1") == [2, 4, 3]
    assert tok.eos_id == 0 and tok.pad_id == 1


def test_missing_tokenizer_directory(tmp_path):
    with pytest.raises(PoiseError, match="does not exist"):
        load_tokenizer(str(tmp_path / "nope"))


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "mistral"])
def test_the_char_tokenizer_saves_as_one_autotokenizer_loads_beside_each_model_family(tmp_path, arch):
    """Beside a model's config.json (transformers 5 picks a qwen2 model's tokenizer class by its type):
    Poise's ids for 100 built-in prompts, and the text back."""
    import random

    from transformers import AutoTokenizer

    from poise.config import TinyModelConfig
    from poise.data.tasks import FAMILIES, make_problem
    from poise.model.loading import tiny_hf_config

    tok = CharTokenizer()
    tiny_hf_config(TinyModelConfig(arch=arch), tok.vocab_size, tok.eos_id, tok.pad_id,
                   tok.bos_id).to_json_file(str(tmp_path / "config.json"))
    tok.save(tmp_path)
    hf = AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    rng = random.Random(3)
    texts = [make_problem(rng.choice(FAMILIES), rng, "t").prompt + "\n" for _ in range(100)]
    assert [hf(t).input_ids for t in texts] == [[tok.bos_id, *tok.encode(t)] for t in texts]
    assert [hf.decode(hf(t).input_ids, skip_special_tokens=True) for t in texts] == texts
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id)


def test_the_saved_char_tokenizer_marks_what_it_cannot_spell_as_poise_does(tmp_path):
    """Uppercase is lowercased and a character outside the vocabulary is one '?', as `encode` does (a
    qwen2 model's directory under AutoTokenizer of transformers 5 is the exception: PreTrainedTokenizerFast
    loads the exact tokenizer there too, as docs/export.md says)."""
    from transformers import PreTrainedTokenizerFast

    from poise.config import TinyModelConfig
    from poise.model.loading import tiny_hf_config

    tok = CharTokenizer()
    tiny_hf_config(TinyModelConfig(arch="qwen2"), tok.vocab_size, tok.eos_id, tok.pad_id,
                   tok.bos_id).to_json_file(str(tmp_path / "config.json"))
    tok.save(tmp_path)
    hf = PreTrainedTokenizerFast.from_pretrained(str(tmp_path), local_files_only=True)
    for text in ("Sort 5 2 9 1\n", "what é <x> ?\n", "  two  spaces\n\n", "\"q\" 'x' [1] (2) ;:!/*-="):
        assert hf(text).input_ids == [tok.bos_id, *tok.encode(text)], text
        assert hf.decode(hf(text).input_ids, skip_special_tokens=True) == tok.decode(tok.encode(text))

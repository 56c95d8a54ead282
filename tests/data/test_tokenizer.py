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

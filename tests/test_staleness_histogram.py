"""partial/staleness_<lag>: tokens of a step by how many updates older than the trained weights
the weights that sampled them were (poise.metrics.staleness_histogram)."""

import pytest

from poise.metrics import staleness_histogram, token_versions
from poise.types import Sample


def _sample(n: int, weights_version: int, versions: tuple[int, ...] | None = None) -> Sample:
    return Sample((3, 0, n), (1, 2), tuple(range(n)), (0.0,) * n, "eos", weights_version, 0.0, 1.0, 8,
                  token_versions=versions)


def test_tokens_count_by_lag():
    # step trains weights 5: one on-policy sample of 3 tokens (version 5), one of 2 from version 4
    # (token_versions None), one partial rollout resumed twice: 2 tokens of 2, 1 of 3, 3 of 5
    samples = [_sample(3, 5), _sample(2, 4), _sample(6, 5, (2, 2, 3, 5, 5, 5))]
    got = staleness_histogram([token_versions(s) for s in samples], trained_version=5)
    assert got == {"partial/staleness_0": 6.0, "partial/staleness_1": 2.0, "partial/staleness_2": 1.0,
                   "partial/staleness_3": 2.0}
    assert list(got) == sorted(got, key=lambda k: int(k.rsplit("_", 1)[1]))  # in lag order
    assert sum(got.values()) == sum(len(s.token_ids) for s in samples)


def test_none_means_every_token_has_the_samples_version():
    assert token_versions(_sample(4, 7)) == (7, 7, 7, 7)
    assert token_versions(_sample(2, 7, (6, 7))) == (6, 7)
    assert staleness_histogram([], 3) == {}


def test_a_token_newer_than_the_trained_weights_is_refused():
    with pytest.raises(ValueError, match="weights version 6 is newer than the trained version 5"):
        staleness_histogram([(5, 6)], trained_version=5)


def test_token_versions_survive_an_async_checkpoints_sample_file(tmp_path):
    from poise.training.checkpoint import decode_samples, encode_samples

    samples = [_sample(3, 5), _sample(2, 5, (4, 5))]
    path = tmp_path / "samples.jsonl"
    path.write_bytes(encode_samples(samples, {}))
    assert [s for s, _ in decode_samples(path)] == samples

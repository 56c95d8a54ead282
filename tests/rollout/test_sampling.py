import torch

from poise.rollout.sampling import (NoiseTable, SamplingConfig, filtered_logprobs, gumbel_offsets, key_prefix,
                                    position_keys, sample_keys, sample_next)


def _ids(rows):
    return torch.tensor(rows, dtype=torch.long)


def test_keys_depend_on_every_part_of_the_sample_id_and_position():
    base = sample_keys(7, _ids([[1, 2, 3]]), torch.tensor([4]))
    for ids, pos, seed in [([[0, 2, 3]], 4, 7), ([[1, 0, 3]], 4, 7), ([[1, 2, 0]], 4, 7), ([[1, 2, 3]], 5, 7),
                           ([[1, 2, 3]], 4, 8)]:
        assert not torch.equal(sample_keys(seed, _ids(ids), torch.tensor([pos])), base)


def test_an_engines_per_sequence_key_prefix_gives_the_same_keys():
    """The engine hashes each sample id once in Python (`key_prefix`) and only the position per
    step; the keys must be those of the all-torch `sample_keys`, bit for bit."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 2**31, (64, 3), generator=gen)
    ids[:4] = torch.tensor([[0, 0, 0], [2**62, 1, 2], [7, 2**63 - 1, 0], [1, 2, 3]])
    pos = torch.randint(0, 4096, (64,), generator=gen)
    for seed in (0, 1, 12345, -1, 2**63 - 1, -(2**63)):
        prefixes = torch.tensor([key_prefix(seed, tuple(row)) for row in ids.tolist()], dtype=torch.int64)
        assert torch.equal(position_keys(prefixes, pos), sample_keys(seed, ids, pos)), seed


def test_a_rows_token_does_not_depend_on_its_batch():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(32, 50, generator=gen)
    ids = _ids([[0, i, i % 3] for i in range(32)])
    pos = torch.arange(32) % 5
    cfg = SamplingConfig(temperature=0.9, top_p=0.9, top_k=20)
    full, full_lp = sample_next(logits, 1, ids, pos, cfg)
    perm = torch.randperm(32, generator=gen)
    shuffled, shuffled_lp = sample_next(logits[perm], 1, ids[perm], pos[perm], cfg)
    assert torch.equal(shuffled, full[perm]) and torch.equal(shuffled_lp, full_lp[perm])
    for i in (0, 13, 31):
        one, one_lp = sample_next(logits[i:i + 1], 1, ids[i:i + 1], pos[i:i + 1], cfg)
        assert one.item() == full[i].item() and one_lp.item() == full_lp[i].item()


def test_sampling_follows_the_distribution():
    n = 40000
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(n, 1)
    ids = torch.stack([torch.zeros(n, dtype=torch.long), torch.arange(n), torch.zeros(n, dtype=torch.long)], 1)
    tokens, _ = sample_next(logits, 3, ids, torch.zeros(n, dtype=torch.long), SamplingConfig())
    freq = torch.bincount(tokens, minlength=4).float() / n
    assert torch.allclose(freq, probs, atol=0.01)


def test_top_p_and_top_k_filter_by_hand():
    logits = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    kept_p = torch.isfinite(filtered_logprobs(logits, SamplingConfig(top_p=0.7)))
    assert kept_p.tolist() == [[True, True, False, False]]  # 0.5 < 0.7, 0.5 + 0.3 reaches it
    kept_k = torch.isfinite(filtered_logprobs(logits, SamplingConfig(top_k=3)))
    assert kept_k.tolist() == [[True, True, True, False]]


def test_greedy_and_logprobs_are_of_the_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0]])
    tok, lp = sample_next(logits, 0, _ids([[0, 0, 0]]), torch.tensor([0]), SamplingConfig(temperature=0))
    assert tok.item() == 0
    assert lp.item() == torch.log_softmax(logits, -1)[0, 0].item()
    tok2, lp2 = sample_next(logits, 0, _ids([[0, 0, 0]]), torch.tensor([0]), SamplingConfig(temperature=2.0))
    assert lp2.item() == torch.log_softmax(logits / 2.0, -1)[0, tok2.item()].item()


def test_the_noise_table_gives_every_row_its_per_step_noise_across_refills_and_slot_reuse():
    """The engine's NoiseTable makes each slot's noise `span` positions ahead; every row it hands
    out must be, bit for bit, what the per-step path makes from (key prefix, position)."""
    vocab, span = 50, 4
    table = NoiseTable(rows=5, span=span, vocab_size=vocab, device=torch.device("cpu"))
    gen = torch.Generator().manual_seed(3)
    owners = {r: int(torch.randint(-2**62, 2**62, (1,), generator=gen)) for r in range(4)}
    positions = {r: r for r in range(4)}  # rows at different points of their spans
    for step in range(23):
        if step == 9:  # slot 2 gets a new sequence, which starts at position 0 again
            owners[2], positions[2] = owners[2] ^ 12345, 0
        if step == 14:  # slot 1 gets another sample's resumed partial, at the very same position
            owners[1] ^= 67890
        live = [r for r in range(4) if (step + r) % 5]  # rows come and go from the batch
        picks = [(r, owners[r], positions[r]) for r in live] + [(4, 0, 0)] * 3  # padding rows share row 4
        noise = table.rows(picks)
        keys = position_keys(torch.tensor([o for _, o, _ in picks]), torch.tensor([at for _, _, at in picks]))
        assert torch.equal(noise, gumbel_offsets(keys, vocab)), step
        for r in live:
            positions[r] += 1
    # a refill per row when it starts and per `span` positions it moves, one per new owner, one for
    # the padding row: not one per row and step (which would be 23 x 4 and more)
    assert table.refilled <= 4 * (1 + 23 // span + 1) + 2 + 1


def test_the_noise_table_shrinks_its_span_for_large_vocabularies():
    assert NoiseTable.span_for(33, 60) == NoiseTable.SPAN
    assert 0 < NoiseTable.span_for(33, 16_000) < NoiseTable.SPAN
    assert NoiseTable.span_for(33, 152_064) == 0  # Qwen's vocabulary: per-step noise

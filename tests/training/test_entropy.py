"""The secret generator state: at least 128 bits of OS entropy behind every noise stream."""

from __future__ import annotations

import numpy as np
import torch

from dpfair.training.entropy import MT_WORDS, mt_state_words, reseed_secretly


def test_a_seed_carries_only_32_bits_on_the_cpu():
    """Why a seed is not enough: torch's CPU generator expands 32 bits of it."""
    a, b = torch.Generator(), torch.Generator()
    a.manual_seed(12345)
    b.manual_seed(12345 + 2**32)
    assert torch.equal(torch.randn(8, generator=a), torch.randn(8, generator=b))


def test_the_whole_cpu_state_comes_from_os_entropy():
    g = torch.Generator()
    reseed_secretly(g)
    words = mt_state_words(g.get_state())
    assert words.shape == (MT_WORDS,) and words.max() < 2**32
    # 624 words of 32 bits, and no two reseeds share a word pattern
    h = torch.Generator()
    reseed_secretly(h)
    assert not np.array_equal(words, mt_state_words(h.get_state()))
    assert len(set(words.tolist())) > MT_WORDS - 5  # not a seed's expansion of few bits
    assert int.from_bytes(g.get_state().numpy()[:8].tobytes(), "little") == 0  # no seed kept


def test_every_state_bit_reaches_the_draws():
    """Two states that differ in one bit of word 300 draw different noise: the state words,
    not a seed, are what the generator runs on (>= 128 secret bits)."""
    g = torch.Generator()
    reseed_secretly(g)
    state = g.get_state().clone()
    flipped = state.clone()
    flipped[24 + 8 * 300] ^= 1
    a, b = torch.Generator(), torch.Generator()
    a.set_state(state)
    b.set_state(flipped)
    assert not torch.equal(torch.randn(2000, generator=a), torch.randn(2000, generator=b))


def test_secret_draws_are_standard_normal():
    g = torch.Generator()
    reseed_secretly(g)
    x = torch.randn(200_000, generator=g, dtype=torch.float64)
    assert abs(float(x.mean())) < 0.01 and abs(float(x.std()) - 1.0) < 0.01

"""A generator whose whole state comes from OS entropy: the secret randomness of every run.

``torch.Generator.manual_seed`` keeps at most 64 bits of a seed, and torch's CPU generator
(MT19937) expands only 32 of them: ``manual_seed(s)`` and ``manual_seed(s + 2**32)`` draw the
same numbers. Noise seeded that way has 32 bits of secret entropy, few enough to search. So
:func:`reseed_secretly` writes the generator's whole state instead:

* CPU (MT19937): the 624 32-bit state words, 19,968 bits from :func:`os.urandom`;
* CUDA (Philox 4x32-10): the 64-bit key and the 64-bit counter offset (a multiple of 4, as
  torch requires): 126 bits from :func:`os.urandom`, the most the generator holds.

Nothing keeps the state: after the run no one, the process included, can replay the draws.
"""

from __future__ import annotations

import os

import numpy as np
import torch

__all__ = ["MT_WORDS", "mt_state_words", "reseed_secretly"]

#: Layout of torch's CPU generator state (``CPUGeneratorImplState``, legacy pod first): the
#: initial seed (uint64), ``left`` and ``seeded`` (int32), ``next`` (uint64), then the state.
_MT_OFFSET = 24
MT_WORDS = 624


def mt_state_words(state: torch.Tensor) -> np.ndarray:
    """The 624 MT19937 state words of a CPU generator's ``get_state()``."""
    raw = state.numpy()[_MT_OFFSET:_MT_OFFSET + 8 * MT_WORDS]
    return np.frombuffer(raw.tobytes(), dtype=np.uint64).copy()


def _cpu_state(template: torch.Tensor) -> torch.Tensor:
    state = template.clone().numpy()
    words = np.frombuffer(os.urandom(4 * MT_WORDS), dtype=np.uint32).astype(np.uint64)
    state[:8] = 0  # the initial seed is not a secret's summary: leave nothing there
    state[_MT_OFFSET:_MT_OFFSET + 8 * MT_WORDS] = np.frombuffer(words.tobytes(), np.uint8)
    return torch.from_numpy(state)


def reseed_secretly(generator: torch.Generator) -> None:
    """Set ``generator``'s whole state from OS entropy (module docstring)."""
    if generator.device.type == "cpu":
        fresh = torch.Generator()
        fresh.manual_seed(0)  # a valid layout: left = 1, next = 0, no cached normal
        generator.set_state(_cpu_state(fresh.get_state()))
        return
    key = int.from_bytes(os.urandom(8), "little")
    offset = int.from_bytes(os.urandom(8), "little") & ~3 & (2**64 - 1)
    generator.set_state(torch.tensor(
        np.frombuffer(key.to_bytes(8, "little") + offset.to_bytes(8, "little"), np.uint8)
        .copy()))

"""How the processes of one private step combine their parts of the batch (one process: the
identity; several: :class:`dpfair.training.distributed.ProcessGroup`, an all-reduce)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a method's configuration loads this module without torch
    from torch import Tensor


class Collective:
    """How the processes of one step combine what each forms over its part of the batch.

    One process (this class): the identity. Several (``dpfair.training.distributed``): every
    ``sum_`` is an all-reduce, and only the process with ``draws_noise`` adds noise to its part
    before it, so each noisy release carries the noise once, drawn by one process.
    """

    #: Whether this process draws the noise of each release (exactly one process does).
    draws_noise: bool = True
    #: Whether there is more than one process.
    several: bool = False

    def sum_(self, tensors: list[Tensor]) -> None:
        """Replace every tensor, in place, by its sum over the processes."""


#: The collective of a step in one process.
ALONE = Collective()

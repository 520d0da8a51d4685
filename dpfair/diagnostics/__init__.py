"""Gradient-misalignment diagnostics: opt-in and non-private.

Everything here reads un-noised training statistics, so every result carries
``"privacy": "non-private"``; runs that turn diagnostics on are tagged
``dpfair.diagnostics=non-private``.

* :mod:`.misalignment` -- R_a^mag, R_a^dir, R_a^clip, R_a^noise, Prop. 3 and Tran-style bounds
  (Esipova et al. 2023) with exact group gradients and Hessian-vector products (:mod:`.hvp`).
* :mod:`.bias` -- BAM's clipping-bias vector and cos(ḡ_B, g_B) (Knolle et al. 2023).
* :mod:`.toys` -- Zhao et al.'s bimodal mean toy and Esipova et al.'s Table 1 runs.
"""

from dpfair.diagnostics.bias import batch_gradients, bias_report, per_sample_gradients
from dpfair.diagnostics.misalignment import misalignment_report
from dpfair.diagnostics.toys import bimodal_mean_toy, train_direction_vs_magnitude

__all__ = [
    "batch_gradients",
    "bias_report",
    "bimodal_mean_toy",
    "misalignment_report",
    "per_sample_gradients",
    "train_direction_vs_magnitude",
]

"""The private engine: per-sample gradients and the private step.

:mod:`~dpfair.engine.step` is one step (norms -> a method's rule -> the weighted sum -> noise);
:mod:`~dpfair.engine.gradients` computes per-sample norms and the reweighted sum from the
factors of :mod:`~dpfair.engine.layer_grads` (and :mod:`~dpfair.engine.conv_factors`,
:mod:`~dpfair.engine.layer_fallback` for layers with no rule, :mod:`~dpfair.engine.low_memory`
where the factors would not fit); :mod:`~dpfair.engine.ascent` and
:mod:`~dpfair.engine.regularised` give BAM's, DP-SAT's and FairLens's per-sample gradients;
:mod:`~dpfair.engine.model_check` says before training which layers the engine can train.
"""

#: a method's released state (clip bounds, noisy statistics), as the step reports it
State = dict[str, float | list[float]]

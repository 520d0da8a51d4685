"""A pipeline run and the standalone commands (adapter layer): the steps of ``dpfair run``
(:mod:`dpfair.pipeline.method_steps`), its data step, checks, resume, summary, DVC outputs,
figures, and ``dpfair train`` / ``tune`` / ``audit`` in runs of their own."""

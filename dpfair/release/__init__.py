"""What a run releases (:mod:`dpfair.release.plan`: every search and seed, its ε against
``budget``) and the noise calibrated to meet the budget (:mod:`dpfair.release.budget`)."""

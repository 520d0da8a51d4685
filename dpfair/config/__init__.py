"""params.yaml as one validated ``Params`` (:mod:`dpfair.config.params`) and its sections
(:mod:`dpfair.config.sections`); pure: no tracking, no data loaded."""

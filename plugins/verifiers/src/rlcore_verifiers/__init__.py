"""verifiers environments for rlcore: a data source, a reward and an agent loop."""

"""Test and benchmark support code (test models, synthetic checkpoints, the prepare benchmark); not shipped."""

"""Equivalence (GP8xx): the gradient of two setups that should be the same, measured to be the same.

Each comparison is a module exposing `run(loaded, options) -> dict` with the keys `applies`, `why_not`, `findings`,
`verified`, `not_run` and `facts`.
"""

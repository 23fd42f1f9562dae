"""Equivalence (GP8xx): gradients that should be the same, measured to be the same (two setups, same weights, same data)."""

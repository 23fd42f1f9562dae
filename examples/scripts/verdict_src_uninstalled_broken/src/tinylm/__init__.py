"""A package in a src/ layout, imported by scripts/run.py as the project means it (sys.path from __file__)."""

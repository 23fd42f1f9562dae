"""Several models trained by one script or returned by one build_model(): checked as one model (modelset.py)."""

from gradprobe.modelset import ModelSet

__all__ = ["ModelSet"]

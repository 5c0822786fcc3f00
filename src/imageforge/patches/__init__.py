"""Patches: anchored text patches, the check of a changed ``.py``, `patch-from`, `check-patches`."""

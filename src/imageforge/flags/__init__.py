"""Serving flags: the model, learnt from the target's vLLM, checked against the manifest; from an image."""

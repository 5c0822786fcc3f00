"""imageforge: one YAML manifest -> a patched, layered, smoke-tested vLLM serving image."""

__version__ = "0.1.0"

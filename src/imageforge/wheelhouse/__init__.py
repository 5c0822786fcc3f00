"""The offline wheelhouse for a machine without PyPI, and its standard-library joiner."""

"""Script steps: running them (``run``: a host script or folder in a container or as a local process) and which
``.py`` files of a script's folder its command runs or imports (``deadfiles``: the dead-file rule)."""

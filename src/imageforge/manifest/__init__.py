"""The manifest: build.yaml read (YAML with positions, its schemas and problem words), checked and loaded
into the frozen model; the one precedence chain that resolves a target."""

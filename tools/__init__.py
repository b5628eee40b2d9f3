"""Developer tooling of the repository (not shipped in the weightcheck wheel)."""

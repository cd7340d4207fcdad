"""The lowest layer: readable units, safe file writes and vectorized array helpers, shared by
every other package.

Nothing here imports another vramscope package (the import-linter contract in
pyproject.toml says so), so the parsers and the classifiers can use it.
"""

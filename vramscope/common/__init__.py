"""The lowest layer: readable units and safe file writes, shared by every other package.

Nothing here imports another vramscope package (the import-linter contract in
pyproject.toml says so), so the parsers and the classifiers can use it.
"""

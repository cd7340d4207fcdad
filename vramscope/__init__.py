"""vramscope: PyTorch CUDA memory snapshots, opened safely and fast."""
__version__ = "0.1.0"

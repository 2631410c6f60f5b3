"""The PyTorch executor: runs a plan on torch.distributed and measures it (docs/DESIGN.md)."""

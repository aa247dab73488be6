"""Thin PyTorch runtime that replays hydraplan plans under torchrun."""

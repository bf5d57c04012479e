"""PyTorch side of attnserve: architectures, datasets and training CLIs (imports torch)."""

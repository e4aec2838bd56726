"""Show, Attend and Tell image captioning with visual attention in modern PyTorch."""

__version__ = "0.1.0"

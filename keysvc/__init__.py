"""keysvc: a self-hosted API key management service."""

__version__ = "0.1.0"

"""keysvc: a self-hosted API key management service.

``__version__`` is keysvc's version, written here alone: the build reads it
(pyproject.toml's dynamic version), and so do ``keysvc --version``, the OpenAPI
document and the webhooks' User-Agent. A version per round of issues; what each
holds is in CHANGELOG.md, whose Unreleased section is this ``.dev0``'s.
"""

__version__ = "0.4.0.dev0"

"""What the secret-scanning tests share: a P-256 key pair of the test's own written as
GitHub publishes its keys, and reports signed with it as GitHub signs them."""

import base64
import json
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from keysvc.scanning import IDENTIFIER_HEADER, SIGNATURE_HEADER

SCANNING = "/v1/secret-scanning/github"


class GitHubSigner:
    """A secret-scanning key pair under ``identifier``; ``write`` puts its public half
    in a keys file of GitHub's format, ``headers`` signs a body with its private half."""

    def __init__(
        self, identifier: str = "90a421169f0a406205f1563a953312f0be898d3c7b6c06b681aa86a874555f4a"
    ):
        self.identifier = identifier
        self.private = ec.generate_private_key(ec.SECP256R1())

    def pem(self) -> str:
        return (
            self.private.public_key()
            .public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
            .decode()
        )

    def write(self, path: Path, *others: "GitHubSigner") -> Path:
        entries = [
            {"key_identifier": signer.identifier, "key": signer.pem(), "is_current": index == 0}
            for index, signer in enumerate((self, *others))
        ]
        path.write_text(json.dumps({"public_keys": entries}))
        return path

    def headers(self, body: bytes) -> dict[str, str]:
        signature = self.private.sign(body, ec.ECDSA(hashes.SHA256()))
        return {
            IDENTIFIER_HEADER: self.identifier,
            SIGNATURE_HEADER: base64.b64encode(signature).decode(),
            "Content-Type": "application/json",
        }


def report(*tokens: str, url: str = "https://github.com/o/r/blob/abc/config.py") -> bytes:
    """GitHub's report body of ``tokens``."""
    found: list[dict[str, Any]] = [
        {"token": token, "type": "keysvc_secret", "url": url, "source": "content"}
        for token in tokens
    ]
    return json.dumps(found).encode()

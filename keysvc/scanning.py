"""GitHub secret scanning's public keys, and the check of a report's signature.

GitHub signs each report it POSTs to a partner with ECDSA P-256 over SHA-256: the
signature, base64 of its DER form, in ``Github-Public-Key-Signature``, over the raw
body as sent, made with the key that ``Github-Public-Key-Identifier`` names. GitHub
sends its reports uncompressed; one with a Content-Encoding is refused (415) before
the check, since aiohttp would decode it first and the check would then be over bytes
that were not sent. The operator gives
the keys as a file, the JSON GitHub publishes for partners
(``{"public_keys": [{"key_identifier", "key" (PEM), "is_current"}]}``), read once at
start (``KEYSVC_GITHUB_SCANNING_KEYS``); keysvc fetches nothing at run time. Every key
listed verifies, current or not: GitHub may still sign with the one it is moving away
from. The check is ``cryptography``'s.
"""

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import load_pem_public_key

# The headers GitHub signs a report with.
IDENTIFIER_HEADER = "Github-Public-Key-Identifier"
SIGNATURE_HEADER = "Github-Public-Key-Signature"
# A file of GitHub's keys is a few KiB; anything far larger is not one.
MAX_KEYS_FILE = 1024 * 1024
# The longest identifier and signature header read: GitHub's are 64 hex characters
# and about 96 base64 characters.
MAX_IDENTIFIER = 256
MAX_SIGNATURE = 512
_ECDSA_SHA256 = ec.ECDSA(hashes.SHA256())


@dataclass(frozen=True)
class ScanningKeys:
    """GitHub's secret-scanning public keys by identifier, as read from ``path``."""

    path: Path
    keys: Mapping[str, ec.EllipticCurvePublicKey] = field(repr=False, compare=False)

    def verify(self, identifier: str | None, signature: str | None, body: bytes) -> str | None:
        """Why the report ``body`` is not GitHub's, or None when the key ``identifier``
        names signed it (``signature``: base64 of the DER form). Never says more than
        which header failed."""
        if not identifier:
            return "Github-Public-Key-Identifier is missing"
        key = self.keys.get(identifier) if len(identifier) <= MAX_IDENTIFIER else None
        if key is None:
            return "Github-Public-Key-Identifier names no key of KEYSVC_GITHUB_SCANNING_KEYS"
        if not signature:
            return "Github-Public-Key-Signature is missing"
        try:
            if len(signature) > MAX_SIGNATURE:
                raise ValueError
            der = base64.b64decode(signature.strip(), validate=True)
            key.verify(der, body, _ECDSA_SHA256)
        except (binascii.Error, ValueError, InvalidSignature):
            return "Github-Public-Key-Signature does not verify"
        return None


def load_keys(path: Path) -> ScanningKeys:
    """The keys of the file at ``path``; ValueError, in one line, for anything that is
    not GitHub's format with at least one P-256 public key in PEM."""
    try:
        if path.stat().st_size > MAX_KEYS_FILE:
            raise ValueError(f"{path} is over {MAX_KEYS_FILE} bytes: not GitHub's public keys")
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ValueError(f"{path} is not JSON") from None
    entries = document.get("public_keys") if isinstance(document, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f'{path}: needs {{"public_keys": [...]}} with at least one key')
    keys: dict[str, ec.EllipticCurvePublicKey] = {}
    for index, entry in enumerate(entries):
        where = f"{path}: public_keys[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not an object")
        identifier, pem = entry.get("key_identifier"), entry.get("key")
        if not isinstance(identifier, str) or not 0 < len(identifier) <= MAX_IDENTIFIER:
            raise ValueError(f"{where}.key_identifier must be a string of 1 to {MAX_IDENTIFIER}")
        if not isinstance(pem, str):
            raise ValueError(f"{where}.key must be a PEM public key")
        if not isinstance(entry.get("is_current", False), bool):
            raise ValueError(f"{where}.is_current must be true or false")
        try:
            key = load_pem_public_key(pem.encode())
        except (ValueError, TypeError):
            raise ValueError(f"{where}.key is not a PEM public key") from None
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
            raise ValueError(f"{where}.key is not an ECDSA P-256 public key")
        if identifier in keys:
            raise ValueError(f"{where}.key_identifier is listed twice")
        keys[identifier] = key
    return ScanningKeys(path, keys)

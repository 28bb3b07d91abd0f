"""Key IDs, secrets, and the keyed hashes that are stored in their place.

A generated key ID is 20 random base62 characters. A generated secret is
``keysvc_`` + 36 random base62 characters (214 bits) + a 6-character base62
CRC32 of the random part, so a scanner can find a leaked secret with
``keysvc_[0-9A-Za-z]{42}`` and check it offline, and a mistyped secret is
refused before any database lookup.

Neither value is stored. Both become ``HMAC-SHA256(pepper, base64(SHA-256(v)))``:
a client that sends ``hashData`` gives us ``base64(SHA-256(v))`` itself, so both
kinds of key verify the same way, and without the pepper a stolen database
cannot confirm a guess.

A bearer token (a key imported from its SHA-256, ``Authorization: Bearer <token>``) is
one value, with no key ID to look it up by: its row is found by
``HMAC-SHA256(pepper, "bearer" NUL base64(SHA-256(token)))`` (``Hasher.token_lookup``),
which no key ID's keyed hash can equal (base64 has no NUL), and its secret hash is the
token's keyed hash as a secret's would be, so a leaked token is found as a leaked
secret is (``keysvc.db.keys.BY_SECRET``).
"""

import base64
import binascii
import hashlib
import hmac
import json
import os
import re
import secrets
import string
import zlib
from pathlib import Path
from typing import Any

from keysvc.config import ConfigError

BASE62 = string.digits + string.ascii_uppercase + string.ascii_lowercase
KEY_ID_LENGTH = 20
SECRET_PREFIX = "keysvc_"  # noqa: S105 - a public marker for scanners, not a secret
SECRET_RANDOM_LENGTH = 36
CHECKSUM_LENGTH = 6
SECRET_PATTERN = rf"{SECRET_PREFIX}[0-9A-Za-z]{{{SECRET_RANDOM_LENGTH + CHECKSUM_LENGTH}}}"


def secret_pattern(prefix: str) -> str:
    """The regex of the secrets a deployment issues with ``prefix`` (KEYSVC_SECRET_PREFIX):
    ``SECRET_PATTERN`` for the default one."""
    return rf"{re.escape(prefix)}[0-9A-Za-z]{{{SECRET_RANDOM_LENGTH + CHECKSUM_LENGTH}}}"


SUFFIX_LENGTH = 4
PEPPER_BYTES = 32
# What the activity log's chain key is derived for (``Hasher.derive``).
ACTIVITY_CHAIN = "activity chain"
# What the instances sharing a PostgreSQL database sign their acknowledgements with
# (``keysvc.db.postgres.peers``), so that a session without the pepper cannot forge one.
PEER_ACKNOWLEDGEMENTS = "peer acknowledgements"


def _random_base62(length: int) -> str:
    """Uniform base62 from the OS's CSPRNG: bytes below 248 (4 x 62) map evenly
    onto the 62 characters, and the rest are drawn again. About ten times
    quicker than ``secrets.choice`` per character (5 against 54 µs for a key ID
    and a secret, measured with timeit)."""
    chars: list[str] = []
    while len(chars) < length:
        chars += [BASE62[byte % 62] for byte in secrets.token_bytes(length + 8) if byte < 248]
    return "".join(chars[:length])


def _base62(number: int, width: int) -> str:
    digits = []
    while number:
        number, rest = divmod(number, 62)
        digits.append(BASE62[rest])
    return "".join(reversed(digits)).rjust(width, BASE62[0])


def checksum(body: str) -> str:
    """The 6-character base62 CRC32 that ends a generated secret."""
    return _base62(zlib.crc32(body.encode()), CHECKSUM_LENGTH)


def new_key_id() -> str:
    return _random_base62(KEY_ID_LENGTH)


def new_secret(prefix: str = SECRET_PREFIX) -> str:
    body = _random_base62(SECRET_RANDOM_LENGTH)
    return prefix + body + checksum(body)


def checksum_fails(secret: str, prefix: str = SECRET_PREFIX) -> bool:
    """True for a secret that claims our format (``prefix``, the deployment's) but cannot
    be one of ours.

    Secrets without the prefix are not judged: those chosen by ``hashData`` clients, and
    those issued under a prefix the deployment used before (they still verify by hash).
    """
    if not secret.startswith(prefix):
        return False
    rest = secret[len(prefix) :]
    if len(rest) != SECRET_RANDOM_LENGTH + CHECKSUM_LENGTH:
        return True
    body, check = rest[:SECRET_RANDOM_LENGTH], rest[SECRET_RANDOM_LENGTH:]
    return not hmac.compare_digest(checksum(body), check)


def sha256_b64(value: str) -> str:
    """base64(SHA-256(value)): the form ``hashData`` carries (44 characters)."""
    return base64.b64encode(hashlib.sha256(value.encode()).digest()).decode()


def is_sha256_b64(value: str) -> bool:
    if len(value) != 44:
        return False
    try:
        return len(base64.b64decode(value, validate=True)) == 32
    except (binascii.Error, ValueError):
        return False


# The purpose the webhook signing key is derived from the pepper for, and what a
# webhook secret starts with (so that one found in a log or a paste is recognised).
WEBHOOK_SIGNING = b"keysvc webhook signing key"
WEBHOOK_SECRET_PREFIX = "whsec_"  # noqa: S105 - a prefix, not a secret
# How a webhook's secret is derived (its row's secret_version): 1 from the nonce alone,
# as webhooks made before 2 have it; 2 bound to the webhook's ID, organization and URL.
NONCE_ONLY_SECRET = 1
BOUND_SECRET = 2
# What the outbox rows' MAC key is derived for (``Hasher.derive``).
OUTBOX_SEAL = "webhook outbox"


class Hasher:
    """Keyed hashing with the pepper; the only holder of the pepper at run time."""

    def __init__(self, pepper: bytes, secret_prefix: str = SECRET_PREFIX):
        self._pepper = pepper
        # What the secrets this deployment issues start with (KEYSVC_SECRET_PREFIX): not
        # hashed with them, but kept here, beside the hashing of every secret issued.
        self.secret_prefix = secret_prefix
        # Keyed once: each hash copies it (the pepper's padding is not hashed again).
        self._keyed = hmac.new(pepper, digestmod=hashlib.sha256)
        # The C object hmac.HMAC wraps (OpenSSL's), when it has one: copied directly, a
        # hash skips the wrapper's Python methods (3,500 of its 19,000 instructions).
        self._keyed_c: Any = getattr(self._keyed, "_hmac", None) or self._keyed

    def _mac(self, data: bytes) -> bytes:
        mac = self._keyed_c.copy()
        mac.update(data)
        digest: bytes = mac.digest()
        return digest

    def keyed(self, sha256_b64_value: str) -> bytes:
        """HMAC-SHA256(pepper, base64(SHA-256(v))), given base64(SHA-256(v))."""
        return self._mac(sha256_b64_value.encode())

    def of_plain(self, value: str) -> bytes:
        return self.keyed(sha256_b64(value))

    def token_lookup(self, sha256_b64_value: str) -> bytes:
        """The key-ID hash a bearer token's key is stored and found under, given
        base64(SHA-256(token)): HMAC-SHA256(pepper, "bearer" NUL that)."""
        return self._mac(b"bearer\0" + sha256_b64_value.encode())

    def of_header(self, header: str) -> bytes:
        """HMAC-SHA256(pepper, "Authorization" NUL header): a whole header's proof
        (``CredentialCache.proven``). The NUL keeps it apart from ``keyed``'s inputs."""
        return self._mac(b"Authorization\0" + header.encode("utf-8", "surrogatepass"))

    def sign(self, purpose: str, text: str) -> str:
        """A short MAC of ``text`` for ``purpose``, so clients cannot forge it."""
        mac = hmac.new(self._pepper, f"{purpose}\0{text}".encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()[:16]).decode().rstrip("=")

    def derive(self, purpose: str) -> bytes:
        """A key of its own for ``purpose``, derived from the pepper."""
        return hmac.new(self._pepper, f"keysvc key\0{purpose}".encode(), hashlib.sha256).digest()

    def webhook_secret(
        self, nonce: bytes, version: int, webhook_id: str, organization_id: str, url: str
    ) -> str:
        """A webhook's signing secret: HMAC-SHA256(K, m), K = HMAC-SHA256(pepper,
        purpose). Version 2's m binds the webhook: a JSON array of its ID, organization,
        URL and hex nonce, so a row that copies the nonce, or a URL changed by hand,
        derives another secret. Version 1's m is the nonce alone (webhooks made before
        version 2 keep it until they are made again). Only the nonce is stored, so the
        database without the pepper cannot sign; the secret is remade for each delivery
        and shown once, at create."""
        derived = hmac.new(self._pepper, WEBHOOK_SIGNING, hashlib.sha256).digest()
        message = nonce
        if version != NONCE_ONLY_SECRET:
            bound = [BOUND_SECRET, webhook_id, organization_id, url, nonce.hex()]
            message = json.dumps(bound, separators=(",", ":")).encode()
        secret = hmac.new(derived, message, hashlib.sha256).digest()
        return WEBHOOK_SECRET_PREFIX + base64.urlsafe_b64encode(secret).decode().rstrip("=")

    def fingerprint(self) -> str:
        """A value stored in the database to catch a start with the wrong pepper."""
        return hmac.new(self._pepper, b"keysvc pepper check", hashlib.sha256).hexdigest()


def load_pepper(configured: bytes | None, path: Path, *, create: bool = True) -> bytes:
    """The configured pepper, else the file at ``path``, created 0600 on first use.

    ``create=False`` (the database already records a pepper) never writes one: a
    new pepper could not verify a single stored key, and left beside a restored
    database it would hide that the right one is missing.
    """
    if configured is not None:
        return configured
    if not create and not path.exists():
        raise ConfigError(
            f"pepper file {path} is missing, and no key in the database verifies without it:"
            " restore it from the backup beside the database, or set KEYSVC_PEPPER"
        )
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raw = path.read_bytes().strip()
        if len(raw) < PEPPER_BYTES:
            raise ConfigError(f"pepper file {path} is damaged; restore it from backup") from None
        return raw
    value = secrets.token_hex(PEPPER_BYTES).encode()
    with os.fdopen(fd, "wb") as handle:
        handle.write(value + b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    return value

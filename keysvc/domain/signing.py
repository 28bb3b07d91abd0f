"""How a webhook delivery is signed: the secret a webhook's receiver holds, derived
(never stored) from its row's nonce with a key from the pepper (``Hasher.webhook_secret``),
and the signatures each attempt carries.

Every attempt carries two schemes, over one timestamp:

- Standard Webhooks (standardwebhooks.com): ``webhook-id`` (the event's ID, the same on
  every attempt of it), ``webhook-timestamp`` (unix seconds of the attempt) and
  ``webhook-signature: v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>``. The key
  is the secret's bytes: what follows ``whsec_``, base64-decoded, as the spec reads it.
- ``Keysvc-Signature: t=<timestamp>,v1=<hex>,v2=<hex>``, keysvc's own (Stripe's scheme),
  HMAC-SHA256 keyed with the secret's text, ``whsec_`` included: kept for the receivers
  written before.

A secret's form depends on its row's ``secret_version``: webhooks made (or rotated)
since Standard Webhooks (``STANDARD_SECRET``) show ``whsec_`` and standard padded base64,
which any Standard Webhooks library reads as it is; older ones (versions 1 and 2) show
the same 32 bytes in unpadded URL-safe base64, which such a library reads only once
turned into standard base64 (or after a rotation). During a secret's rotation overlap
both the new and the previous secret sign: both signatures are sent, the new first.
"""

import base64
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass

from keysvc.credentials import BOUND_SECRET, NONCE_ONLY_SECRET, WEBHOOK_SECRET_PREFIX, Hasher
from keysvc.db.webhooks import STANDARD_SECRET


@dataclass(frozen=True)
class SigningSecret:
    """A webhook's secret as its receiver holds it (``shown``), and the bytes the
    Standard Webhooks signature is keyed with (``key``)."""

    shown: str
    key: bytes


def signing_secret(
    hasher: Hasher, nonce: bytes, version: int, webhook_id: str, organization_id: str, url: str
) -> SigningSecret:
    """The secret of a webhook whose row holds ``nonce`` and ``version``."""
    derivation = NONCE_ONLY_SECRET if version == NONCE_ONLY_SECRET else BOUND_SECRET
    derived = hasher.webhook_secret(nonce, derivation, webhook_id, organization_id, url)
    encoded = derived.removeprefix(WEBHOOK_SECRET_PREFIX)
    key = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))
    if version == STANDARD_SECRET:
        return SigningSecret(WEBHOOK_SECRET_PREFIX + base64.b64encode(key).decode(), key)
    return SigningSecret(derived, key)


def keysvc_signature(
    secrets: Sequence[SigningSecret], timestamp: int, event_id: str, event_type: str, body: str
) -> str:
    """The Keysvc-Signature header: ``t=<unix seconds>,v1=<hex>,v2=<hex>`` per secret.
    v2 is HMAC-SHA256(secret, "<t>.<event ID>.<event type>.<body>"), the Keysvc-Event-Id
    and Keysvc-Event-Type headers signed too; the ID is a UUID, the type one of the
    event types and the body a JSON object, so no field can run into the next. v1, over
    "<t>.<body>" alone, is sent as well for receivers not yet moved to v2: it leaves the
    event headers unsigned. During a rotation's overlap a second v1 and v2 follow, the
    previous secret's."""
    parts = [f"t={timestamp}"]
    for secret in secrets:
        key = secret.shown.encode()
        v1 = hmac.new(key, f"{timestamp}.{body}".encode(), hashlib.sha256).hexdigest()
        signed = f"{timestamp}.{event_id}.{event_type}.{body}".encode()
        v2 = hmac.new(key, signed, hashlib.sha256).hexdigest()
        parts += [f"v1={v1}", f"v2={v2}"]
    return ",".join(parts)


def standard_signature(
    secrets: Sequence[SigningSecret], message_id: str, timestamp: int, body: str
) -> str:
    """The webhook-signature header: ``v1,<base64>`` per secret, space-separated."""
    signed = f"{message_id}.{timestamp}.{body}".encode()
    return " ".join(
        "v1," + base64.b64encode(hmac.new(s.key, signed, hashlib.sha256).digest()).decode()
        for s in secrets
    )


def signed_headers(
    secrets: Sequence[SigningSecret], timestamp: int, event_id: str, event_type: str, body: str
) -> dict[str, str]:
    """Both schemes' headers for one attempt, signed with ``secrets`` (the current
    secret first)."""
    return {
        "webhook-id": event_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": standard_signature(secrets, event_id, timestamp, body),
        "Keysvc-Event-Id": event_id,
        "Keysvc-Event-Type": event_type,
        "Keysvc-Signature": keysvc_signature(secrets, timestamp, event_id, event_type, body),
    }

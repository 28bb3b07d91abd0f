"""The client's own credentials as the Authorization header keysvc reads."""

import base64


def basic_authorization(
    key_id: str | None, key_secret: str | None, authorization: str | None
) -> str | None:
    """``Basic base64(keyId:keySecret)``, or ``authorization`` as given, or None."""
    if key_id is not None and key_secret is not None:
        token = base64.b64encode(f"{key_id}:{key_secret}".encode()).decode()
        return f"Basic {token}"
    return authorization

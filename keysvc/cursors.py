"""Signed list cursors that carry a place in one organization's sequence (its keys'
``org_seq``, its activities' place in their chain): the number, then a MAC of it
for that organization and that list, so a cursor is valid only where it was given."""

import hmac

from keysvc.credentials import Hasher
from keysvc.errors import BadRequest

BAD_CURSOR = "cursor: not a cursor from this list; start again without it"


def encode(hasher: Hasher, purpose: str, organization_id: str, seq: int) -> str:
    return f"{seq}.{hasher.sign(purpose, f'{organization_id}:{seq}')}"


def decode(hasher: Hasher, purpose: str, organization_id: str, cursor: str | None) -> int:
    """The place a cursor stands for; 0 for none. A forged or foreign cursor is a 400."""
    if cursor is None:
        return 0
    seq, _, mac = cursor.partition(".")
    if not (seq.isascii() and seq.isdigit()) or len(seq) > 18:
        raise BadRequest(BAD_CURSOR)
    expected = hasher.sign(purpose, f"{organization_id}:{int(seq)}")
    if not hmac.compare_digest(expected.encode(), mac.encode()):
        raise BadRequest(BAD_CURSOR)
    return int(seq)

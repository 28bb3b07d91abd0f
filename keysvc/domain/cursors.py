"""Signed list cursors that carry a number: a place in a list (a key's ``org_seq``, an
activity's place in its chain, a delivery's sequence), with a MAC made for one
purpose and one scope (an organization, a webhook), so that a client can neither
forge a cursor nor carry one to another list."""

import hmac

from keysvc.credentials import Hasher
from keysvc.errors import BadRequest

BAD_CURSOR = "cursor: not a cursor from this list; start again without it"


def encode(hasher: Hasher, purpose: str, scope: str, place: int) -> str:
    return f"{place}.{hasher.sign(purpose, f'{scope}:{place}')}"


def decode(hasher: Hasher, purpose: str, scope: str, cursor: str | None) -> int:
    """The place a cursor stands for; 0 for none. A forged or foreign cursor is a 400."""
    if cursor is None:
        return 0
    seq, _, mac = cursor.partition(".")
    if not (seq.isascii() and seq.isdigit()) or len(seq) > 18:
        raise BadRequest(BAD_CURSOR)
    expected = hasher.sign(purpose, f"{scope}:{int(seq)}")
    if not hmac.compare_digest(expected.encode(), mac.encode()):
        raise BadRequest(BAD_CURSOR)
    return int(seq)

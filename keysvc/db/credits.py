"""All SQL about credits on keys (issue 29), and the spend the store runs
(``Store.spend_credits``): a key's credits read and written in one write
transaction, the write a compare-and-set on what was read.

A spend is exact because it runs in a write transaction, which both backends
serialize (SQLite: ``begin immediate`` on the file, across processes; PostgreSQL: the
advisory write lock, across instances); the update names the remaining it read as
well, so that a write that were ever let in between would make it fail, not add up.
The rule (what a spend leaves, the events it sends) is the domain's, given as a
function of the credits read (``keysvc.domain.credits.spent``).
"""

from keysvc.db.contract import Connection
from keysvc.db.keys import credits_params
from keysvc.db.rows import credits_from_row
from keysvc.db.statements import fetch_one
from keysvc.models import Credits

CREDITS_OF = """
    select credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags
    from key_details where key_id = ?
"""
# The compare-and-set: only over the remaining and the refill moment that were read.
WRITE_SPENT = """
    update key_details set credits_remaining = ?, credits_refill_interval = ?,
                           credits_refill_amount = ?, credits_refill_day = ?,
                           credits_next_refill = ?, credits_base = ?, credits_flags = ?
    where key_id = ? and credits_remaining = ?
"""


async def credits_of(conn: Connection, key_id: str) -> Credits | None:
    """The key's credits as stored; None when unlimited (or no such key)."""
    row = await fetch_one(conn, CREDITS_OF, (key_id,))
    return None if row is None else credits_from_row(row)


async def write_spent(conn: Connection, key_id: str, read: Credits, after: Credits) -> bool:
    """Write ``after`` over the credits read as ``read``; False if they have moved since."""
    params = (*credits_params(after), after.flags, key_id, read.remaining)
    cursor = await conn.execute(WRITE_SPENT, params)
    return cursor.rowcount == 1

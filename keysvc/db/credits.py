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

import json
from collections.abc import Sequence

from keysvc.db.contract import Connection
from keysvc.db.dialect import with_json_list
from keysvc.db.keys import credits_params
from keysvc.db.rows import credits_flags, credits_from_row
from keysvc.db.statements import fetch_all
from keysvc.models import Credits

# A batch's keys' credits, in one statement (keysvc.db.spendbatch).
CREDITS_OF_MANY = with_json_list("""
    select key_id, credits_remaining, credits_refill_interval, credits_refill_amount,
           credits_refill_day, credits_next_refill, credits_base, credits_flags
    from key_details where key_id in {json_list} and credits_remaining is not null
""")
# The compare-and-set: only over the remaining that was read.
WRITE_SPENT = """
    update key_details set credits_remaining = ?, credits_refill_interval = ?,
                           credits_refill_amount = ?, credits_refill_day = ?,
                           credits_next_refill = ?, credits_base = ?, credits_flags = ?
    where key_id = ? and credits_remaining = ?
"""


async def credits_of_many(conn: Connection, key_ids: Sequence[str]) -> dict[str, Credits]:
    """The credits of each of these keys that has credits, as stored."""
    rows = await fetch_all(conn, CREDITS_OF_MANY, (json.dumps(list(key_ids)),))
    found = {row["key_id"]: credits_from_row(row) for row in rows}
    return {key_id: credits for key_id, credits in found.items() if credits is not None}


async def write_many(conn: Connection, writes: Sequence[tuple[str, Credits, Credits]]) -> bool:
    """Each (key, credits read, credits after) written over the credits read (the
    compare-and-set), in one call; False if the driver counts fewer rows written than
    asked (SQLite counts; PostgreSQL's executemany does not, and the write lock held is
    the guarantee)."""
    if not writes:
        return True
    rows = [
        (*credits_params(after), credits_flags(after), key_id, read.remaining)
        for key_id, read, after in writes
    ]
    done = await conn.executemany(WRITE_SPENT, rows)
    count = getattr(done, "rowcount", None)
    return not isinstance(count, int) or count < 0 or count == len(rows)

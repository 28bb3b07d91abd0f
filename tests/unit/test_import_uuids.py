"""Imported keys' UUIDs (``keysvc.domain.imports._time_ordered_uuid``): version 7, in
the order they are made, and each with its own random bits, across the refills of the
pool of random bytes they are taken from (issue 37's speed: one CSPRNG call for many
UUIDs, not one each)."""

import uuid

from keysvc.domain import imports

# More UUIDs than one pool holds (8 bytes each), so that a refill falls among them.
MADE = 3 * imports._ENTROPY_BYTES // 8 + 5


def test_imported_key_uuids_are_version_7_ordered_and_distinct() -> None:
    made = [imports._time_ordered_uuid() for _ in range(MADE)]
    parsed = [uuid.UUID(text) for text in made]
    assert all(str(value) == text for value, text in zip(parsed, made, strict=True))
    assert all(value.version == 7 and value.variant == uuid.RFC_4122 for value in parsed)
    assert [value.int for value in parsed] == sorted(value.int for value in parsed)
    assert len(set(made)) == MADE


def test_each_uuid_has_its_own_random_bits_across_pool_refills() -> None:
    randoms = [uuid.UUID(imports._time_ordered_uuid()).int & (2**62 - 1) for _ in range(MADE)]
    assert len(set(randoms)) == MADE
    # The bits spread over the whole range, not a repeated or short pool.
    assert max(randoms) > 2**61 and min(randoms) < 2**61

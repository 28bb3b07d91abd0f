"""bench/auth_timing.py runs against a real server: every probe a 401, each timed."""

from bench import auth_timing


def test_each_kind_of_bad_credentials_is_timed_as_a_401() -> None:
    taken = auth_timing.measure(5)
    assert set(taken) == set(auth_timing.KINDS)
    assert all(len(micros) == 5 and min(micros) > 0 for micros in taken.values())

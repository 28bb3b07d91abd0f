"""keysvc's benchmark: wrk against a bare aiohttp baseline and a real keysvc, alternating,
and hey sending verify to both at one fixed rate.

``python -m bench.run`` (``make bench``) does everything; see docs/PERFORMANCE.md.
``python -m bench.auth_timing`` times failed authentications (docs/SECURITY.md).
"""

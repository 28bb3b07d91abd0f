"""The database layer. It imports neither the domain nor the HTTP layer, and no driver
(aiosqlite, asyncpg, sqlite3) is imported outside it.

- ``contract``: the ``Store`` and ``Connection`` Protocols the layers above are typed
  against, and the ``Records`` they give a store at opening.
- ``backends``: the one place that chooses a backend (``open_store``, audit, backup).
- ``core``: what both stores share, held by each (``StoreCore``); ``front``: its calls,
  forwarded once for both (``CoreFront``).
- ``sqlite/`` and ``postgres/``: the two stores, siblings, each with its connections,
  schema steps, audit snapshot and tools.
- The SQL both run, in SQLite's dialect (PostgreSQL's forms beside it, ``dialect``):
  ``keys``, ``roles``, ``activities`` (and ``replay``), ``outbox``, ``webhooks``,
  ``usage``, ``meta``; ``rows`` to records, ``statements`` helpers; ``batching``,
  ``cache``, ``keystates`` and ``timing`` around them.
"""

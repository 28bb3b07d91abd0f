"""The data layer: SQLite's (and PostgreSQL's) connections and migrations, all SQL,
the write batches, and the caches of committed data. ``keysvc.db.sqlite.store.Store`` is its front.

Its modules import one another one way: ``pgstore`` (the same front on PostgreSQL)
over ``store`` on top; under it ``batching``, ``roles`` and ``meta``; then
``createbatch``, ``keys`` and ``cache``; and at the bottom ``rows``, ``freshness``,
``connections``, ``migrations`` and ``timing``;
``pgschema`` (PostgreSQL's schema and its versions) sits on ``migrations``.

Every statement is written in SQLite's dialect; ``dialect`` holds the PostgreSQL
forms of those that differ beside them, and ``pgconn`` runs the same SQL functions
on a PostgreSQL connection (asyncpg), so that one set of functions serves both.
Nothing here imports the domain (``keysvc.domain.keys``, ``keysvc.domain.roles``), auth or
the handlers.
"""

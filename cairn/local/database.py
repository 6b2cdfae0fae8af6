"""The embedded cluster's database: created here, filled by ``python -m services.migrate``.

Only the supervisor connects as PostgreSQL's superuser, and only to create the database; the
migrations and each service's role come after (:func:`cairn.local.service_credentials.grant_roles`).
"""

from __future__ import annotations

DATABASE = "cairn"


async def ensure_database(admin_url: str) -> None:
    """Creates the ``cairn`` database if missing (``services.migrate`` fills it).

    Args:
        admin_url: the superuser's URL of the server (any database on it).
    """
    import asyncpg

    conn = await asyncpg.connect(admin_url)
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{DATABASE}"')
    finally:
        await conn.close()

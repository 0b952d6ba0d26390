"""The dashboard: ``/dashboard`` pages and their JSON API, served by the gateway.

    routes += dashboard_routes(gateway, config.store.dsn)

Pages are server-rendered shells filled by small vanilla scripts (``static/``) that draw
their charts as inline SVG; every figure comes from an aggregation run in the database.
"""

from prefixgate.web.routes import dashboard_routes

__all__ = ["dashboard_routes"]

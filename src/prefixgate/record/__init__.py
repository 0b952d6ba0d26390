"""The request record: one row per request, flowing from the gateway to the store,
the doctor and the dashboard."""

from prefixgate.record.record import Record, Segment

__all__ = ["Record", "Segment"]

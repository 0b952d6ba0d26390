"""Prompt-prefix transforms that keep upstream prefix caches valid.

Each transform is a small named step scoped by channel kind; the gateway applies them in
the order of :data:`MESSAGES_STEPS` to the Anthropic request before conversion. They never
touch the request as received (the record keeps that); they return a new body.
"""

from prefixgate.hygiene.billing import strip_billing_header

__all__ = ["strip_billing_header"]

"""Simulation helpers: seeded synthetic agent traffic (``agents``) for replaying against the
gateway, and a simulated upstream with a prefix cache."""

"""Channel choice (priority, weight, failover) and replica choice."""

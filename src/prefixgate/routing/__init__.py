"""Channel choice (priority, weight, failover) and replica choice (routing policies,
in-flight accounting, the prefix-cache estimate, passive and active health, optional
shared state in Redis). See docs/routing.md."""

from .channels import ChannelRouter, PromptOf, Target
from .health import HealthChecker, health_url
from .policies import POLICIES, Balance, Replica, imbalanced, rendezvous
from .prefix import BlockLRU, PromptBlocks, prompt_blocks

__all__ = [
    "POLICIES",
    "Balance",
    "BlockLRU",
    "ChannelRouter",
    "HealthChecker",
    "PromptBlocks",
    "PromptOf",
    "Replica",
    "Target",
    "health_url",
    "imbalanced",
    "prompt_blocks",
    "rendezvous",
]

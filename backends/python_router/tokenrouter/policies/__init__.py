"""Routing policies on the request-centric API (route / send / receive)."""

from .base import (PolicyError, RequestView, RoutingPolicy, StepResult, create_policy, register_policy,
                   registered_policies)

__all__ = ["PolicyError", "RequestView", "RoutingPolicy", "StepResult", "create_policy", "register_policy",
           "registered_policies"]

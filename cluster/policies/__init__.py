"""Program-level policy planes (paper 003 §3): PCB, Retention Plane, Dispatch Plane.

    from cluster.policies import RetentionPolicy, protect, RELEASE, EVICT

    class MyRetention(RetentionPolicy):
        def on_turn_complete(self, pcb, now):
            u = self.signals.kv_utilization or 0.0
            return protect(now + 5.0 * (1 - u)) if pcb.context_tokens > 8000 else RELEASE

    SimConfig(..., retention=MyRetention)           # in a notebook
    pdlab simulate --retention my_policies.py:MyRetention --scheduling plas

Policies see only the Program Control Block (`pcb.py`), the time and `self.signals`;
reading anything else raises `PolicyError`. Registries name the shipped policies.
"""

from cluster.policies.dispatch import (
    DISPATCH_POLICIES,
    DispatchPolicy,
    DispatchRouter,
    LeastLoadedDispatch,
    RoundRobinDispatch,
    SessionAffinityDispatch,
)
from cluster.policies.errors import PolicyError
from cluster.policies.loader import HOOKS, LoadedPolicy, load_policy
from cluster.policies.pcb import PCB_FIELDS, SIGNAL_FIELDS, ProgramControlBlock, Signals
from cluster.policies.retention import (
    EVICT,
    RELEASE,
    RETENTION_POLICIES,
    BranchCountRetention,
    EvictAlways,
    FixedTTL,
    LRURetention,
    MinWaste,
    PerToolTTL,
    PressureTTL,
    RetentionDecision,
    RetentionPolicy,
    discard_waste,
    pressure_factor,
    protect,
)
from cluster.policies.scheduling import (
    FCFS,
    PLAS,
    SCHEDULING_POLICIES,
    ProgramFCFS,
    SchedulingPolicy,
)

__all__ = [
    "DISPATCH_POLICIES",
    "EVICT",
    "FCFS",
    "HOOKS",
    "PCB_FIELDS",
    "PLAS",
    "RELEASE",
    "RETENTION_POLICIES",
    "SCHEDULING_POLICIES",
    "SIGNAL_FIELDS",
    "BranchCountRetention",
    "DispatchPolicy",
    "DispatchRouter",
    "EvictAlways",
    "FixedTTL",
    "LRURetention",
    "LeastLoadedDispatch",
    "LoadedPolicy",
    "MinWaste",
    "PerToolTTL",
    "PolicyError",
    "PressureTTL",
    "ProgramControlBlock",
    "ProgramFCFS",
    "RetentionDecision",
    "RetentionPolicy",
    "RoundRobinDispatch",
    "SchedulingPolicy",
    "SessionAffinityDispatch",
    "Signals",
    "discard_waste",
    "load_policy",
    "pressure_factor",
    "protect",
]

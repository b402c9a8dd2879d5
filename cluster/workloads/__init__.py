"""Agent workloads: programs, generators (putnam, cc, osworld, shift) and trace replay."""

from cluster.workloads.program import Program, Segment, SegmentIds, Turn

__all__ = ["Program", "Segment", "SegmentIds", "Turn"]

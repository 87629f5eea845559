"""The planner: pure functions from measured numbers to a ring plan. No I/O, no net, no engine."""

"""A ring member: joining, its stage, serving, heartbeats, measurement, and taking coordination over."""

"""Commands for people: the demo, inspect, certificates, the scheduler's configuration."""

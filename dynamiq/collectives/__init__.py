"""Collective communication: all-reduce schedules, topologies and their execution."""

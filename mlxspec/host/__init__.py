"""Probes of the host machine: CPU, RAM, bandwidth, and the CPU BLAS."""

"""Concepts every part of the engine shares and that depend on nothing else in it: Kafka's Time clock
(time.py), the integer limits and sentinels of the wire format (constants.py), and numba's njit with a
cache wherever the package is installed (jit.py)."""

"""Benchmarks: plan quality against published baselines, and planning time.

Run from the repo root, e.g. `python -m benchmarks.plan_quality`; results go to
benchmarks/results/.
"""

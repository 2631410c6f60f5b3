"""The HTTP service: a FastAPI app around `planner.plan()` (DESIGN.md, "The service")."""

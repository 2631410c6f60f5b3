"""`planner calibrate`: microbenchmarks on this machine, robust fits of the cost model's named
constants, and a hardware profile that `planner plan --hardware` takes."""

"""The planner: per-device memory and step time of 3D layouts, the search over them,
calibration on real runs and scaling projections (docs/planner.md). Importing it never imports
torch; only probing the local machine and running trials do."""
